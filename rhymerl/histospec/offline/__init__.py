"""HistoSpec without an engine: `replay` (acceptance on recorded responses, the suffix arm) and
`tuning` (settings and overrides for `rhymerl spec replay`, prompt recovery)."""
