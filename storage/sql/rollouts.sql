-- rollouts: one row per generated response, from COMMITTED steps only.
-- The source is read_parquet([...files listed by the step manifests...]), or the typed template
-- _schema_rollouts for an empty lake. The template comes first so the view always has every
-- column of the current schema, in schema order; columns an older file lacks read as NULL.
CREATE OR REPLACE VIEW rollouts AS
SELECT * FROM _schema_rollouts
UNION ALL BY NAME
SELECT * FROM {source};
