"""HistoSpec without an engine:
- `replay`: acceptance on recorded responses, and the suffix-decoding comparison arm (`SuffixArm`).
- `tuning`: named settings and overrides for `rhymerl spec replay`, its rows, prompt recovery.
"""
