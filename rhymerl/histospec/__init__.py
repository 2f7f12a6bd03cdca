"""HistoSpec: lossless speculative rollouts drafted from each prompt's own earlier responses.

Modules (no engine imports; settings: `rhymerl.config.spec.SpecConfig`): `bundle` (the history a
worker's drafter reads), `index` and `siblings` / `sibling_table` (a prompt's index), `drafter` (the
reference drafter, tree, budget rules), `stats` (`SpecStats`). Subpackages: `engine` (the batch path
inside vLLM), `offline` (replay, tuning). Nothing is imported here: import the module you need.
"""
