# MLflow tracking server: PostgreSQL backend (psycopg2), artifacts proxied to S3/MinIO (boto3).
# The same MLflow version as the project's client.
#
#   docker build -f infra/docker/mlflow.Dockerfile -t rhymerl-mlflow:0.1.0 infra/docker
FROM python:3.11.11-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN pip install "mlflow==3.17.2" "psycopg2-binary==2.9.10" "boto3>=1.43.115,<1.43.118"
EXPOSE 5000
CMD ["mlflow", "server", "--host", "0.0.0.0", "--port", "5000"]
