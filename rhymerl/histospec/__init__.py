"""HistoSpec: lossless speculative rollouts drafted from each prompt's own earlier responses.

Drafting semantics (this package; no engine imports; its settings, `SpecConfig`, are
`rhymerl.config.spec`):
- `bundle`: the history as flat columns and the `HistoryBundle` a rollout worker's drafter reads.
- `index`: a prompt's index: its history (`FlatIndex`) beside its siblings (`PromptIndex`).
- `siblings`, `sibling_table`: the siblings' growing n-gram index and its compiled storage.
- `drafter`: the reference drafter (`propose(context, budget) -> Draft`), the cross-prompt tree,
  budget rules, and the functions that build them from a `SpecConfig`.
- `stats`: `SpecStats`, the acceptance counters every report reads.
Subpackages: `engine` (the batch path inside vLLM), `offline` (replay, tuning, the suffix arm).
Nothing is imported here: import the module you need.
"""
