"""Local services and the process environment, below every layer that runs something.

`environment` (`project_env()`: the variables every entry point sets before Prefect, Ray or vLLM
import), `servers` (child server processes, free ports, health waits), `local_api` (Prefect's
temporary local API), `local_s3` (a standalone local S3 server); compose.yaml, docker/, k8s/ and
postgres/ deploy the services.
"""
