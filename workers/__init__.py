"""Ray-side layer: the actors (`actors`: rollout workers around an engine, the trainer), the
streaming rollout driver (`stream`), weight sync with its checks (`sync`), each worker's HistoSpec
history for a step (`history_bundles`) and the guard that keeps restarted workers on-policy
(`guard`). No Prefect here: `tasks/` wraps these as flow steps.
Dependencies: tasks -> workers -> rhymerl, storage."""
