-- Run once by the postgres image on an empty data volume: Prefect uses the `prefect` database
-- (POSTGRES_DB), MLflow its own.
CREATE DATABASE mlflow OWNER rhymerl;
