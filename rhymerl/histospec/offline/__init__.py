"""HistoSpec without an engine: `replay` (acceptance on recorded responses, and the `suffix`
comparison arm), `tuning` (named settings, overrides and prompt recovery for `rhymerl spec replay`)."""
