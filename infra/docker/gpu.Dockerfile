# RhymeRL on NVIDIA GPUs (upstream vLLM): Ray GPU worker nodes (engines and the trainer).
# CUDA runtime base (torch's wheels bring cuDNN and the rest); Python 3.11 (the project's version) from
# Ubuntu 22.04; torch's CUDA wheel pinned first, then the project with the `gpu` extra (vllm).
#
#   docker build -f infra/docker/gpu.Dockerfile -t rhymerl-gpu:0.1.0 .
FROM nvidia/cuda:12.8.1-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false \
    VLLM_CACHE_ROOT=/opt/rhymerl/.cache/vllm TORCHINDUCTOR_CACHE_DIR=/opt/rhymerl/.cache/inductor \
    PATH=/opt/venv/bin:$PATH
# g++ and python3.11-dev: Triton and FlashInfer compile kernels at first use.
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev g++ libnuma1 \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv

WORKDIR /opt/rhymerl
RUN pip install "torch==2.13.0"
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
COPY scripts ./scripts
COPY infra ./infra
RUN pip install ".[gpu]"
RUN python -c "import torch, vllm, ray; print('stack ok: torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__)"
CMD ["rhymerl", "--help"]
