"""HistoSpec without an engine: `replay` (recorded responses, the suffix arm), `tuning` (`rhymerl spec replay`)."""
