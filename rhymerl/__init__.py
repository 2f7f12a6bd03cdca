"""RhymeRL core: pure algorithms and small classes (no Prefect, Ray, MLflow or DuckDB)."""

__version__ = "0.1.0"
