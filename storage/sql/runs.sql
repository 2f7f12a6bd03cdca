-- runs: the latest state of each run. Every write_run / finish_run adds one immutable small file
-- holding the whole row; the row with the greatest updated_at wins (on a tie, an ended row wins).
-- The sources placeholder and the typed template work as in rollouts.sql.
CREATE OR REPLACE VIEW runs AS
WITH states AS (
    SELECT * FROM _schema_runs
    {sources}
)
SELECT * FROM states
QUALIFY row_number() OVER (
    PARTITION BY run_id ORDER BY updated_at DESC, ended_at DESC NULLS LAST
) = 1;
