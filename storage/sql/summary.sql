-- lake_summary: one row per run and epoch: committed steps, responses, data files and bytes,
-- from the step manifests (no data file is read). Runs with nothing committed yet show one row
-- with a NULL epoch. `skipped_rows` counts committed rows the views leave out because their
-- file is missing, truncated or quarantined (see `rhymerl lake verify`).
CREATE OR REPLACE VIEW lake_summary AS
WITH files AS (
    SELECT run_id, epoch,
           count(DISTINCT step) AS steps,
           coalesce(sum(rows) FILTER (WHERE state = 'ok'), 0)::BIGINT AS responses,
           count(*) AS files,
           coalesce(sum(bytes) FILTER (WHERE state = 'ok'), 0)::BIGINT AS bytes,
           coalesce(sum(rows) FILTER (WHERE state <> 'ok'), 0)::BIGINT AS skipped_rows
    FROM lake_files
    GROUP BY run_id, epoch
)
SELECT coalesce(f.run_id, r.run_id) AS run_id, r.name, r.status, f.epoch, f.steps, f.responses,
       f.files, f.bytes, f.skipped_rows
FROM files f FULL JOIN runs r ON f.run_id = r.run_id
ORDER BY run_id, epoch NULLS FIRST;
