# RhymeRL on NVIDIA GPUs (upstream vLLM): Ray GPU worker nodes (engines and the trainer).
# CUDA runtime base (torch's wheels bring cuDNN and the rest); Python 3.11 (the project's version) from
# Ubuntu 22.04. The project goes in as in cpu.Dockerfile: the stack first (a layer rebuilt only when
# pyproject.toml changes), then the whole source tree (`COPY . .`, with the repository's .dockerignore
# keeping out the benchmarks, tests, caches and run outputs) installed with `pip install .`. Only the
# stack differs from cpu.Dockerfile: torch's CUDA wheel (PyPI's default build) and the `gpu` extra
# (upstream vLLM); nothing is removed, since vLLM on CUDA needs triton and the torchvision/torchaudio
# wheels match this torch.
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
# The stack: pyproject.toml's dependencies and its `gpu` extra, without the project's sources.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['gpu']))" >/tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
# The project: every source folder, so none can be forgotten; not editable, the stack is in place.
COPY . .
RUN pip install --no-deps .
# From / so the installed package imports, not the sources in the working directory.
RUN cd / && python -c "import torch, vllm, ray, flows.run, workers.actors, cli.main; print('stack ok: torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__)"
CMD ["rhymerl", "--help"]
