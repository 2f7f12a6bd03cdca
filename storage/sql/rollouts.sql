-- rollouts: one row per generated response, from COMMITTED steps only.
-- The sources placeholder below is empty for an empty lake, else one
--     UNION ALL BY NAME SELECT * FROM read_parquet([...], hive_partitioning = true, ...)
-- per group of files the step manifests list with one schema (see Lake._table_reads). The typed
-- template _schema_rollouts comes first so the view always has every column of the current
-- schema, in schema order, and columns an older file lacks read as NULL. Hive partitioning lets
-- DuckDB skip the files of other runs and epochs from their paths alone; the writer guarantees a
-- file's run_id/epoch/step columns equal its path.
CREATE OR REPLACE VIEW rollouts AS
SELECT * FROM _schema_rollouts
{sources};
