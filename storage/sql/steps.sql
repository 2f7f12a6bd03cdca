-- steps: one row per training step. Each row is its own small file at a key fixed by
-- (run_id, epoch, step) and written only if absent, so a retried step never adds a second row.
-- The sources placeholder and the typed template work as in rollouts.sql.
CREATE OR REPLACE VIEW steps AS
SELECT * FROM _schema_steps
{sources};
