-- evals: one row per held-out evaluation sample. Each evaluation (run, epoch boundary) is one
-- small file written only if absent, so a resumed or retried run never adds a second copy.
-- The sources placeholder and the typed template work as in rollouts.sql.
CREATE OR REPLACE VIEW evals AS
SELECT * FROM _schema_evals
{sources};
