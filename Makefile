# rollflow: the README's commands. `make demo` and `make test` install what they need on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha256sum | cut -c1-12)

# Offline, telemetry-free, project-local state (see docs/operations.md).
export PREFECT_HOME ?= $(CURDIR)/runs/prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false
# Idle OpenMP threads sleep rather than spin, so the trainer and the inference server can each use every
# core while the other waits (spinning threads made 2-thread torch 4-7x slower on a busy 2-core machine).
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install demo test test-plan test-fast lint format docs bench bench-peer bench-suite clean

# Headless Chromium for the trajectory viewer's browser tests (tests/trajectories): Debian's package.
browser:
	@command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core)
.PHONY: browser

# Where torch comes from. Empty: the default index (here it serves the CPU wheel). On a machine whose
# default index serves the CUDA build (a stock Linux box: gigabytes), ask for the CPU wheel:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_PIP_INDEX := $(if $(strip $(TORCH_INDEX)),--index-url $(strip $(TORCH_INDEX)))

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first: the CPU wheel 2.13.0; anything else would pull gigabytes of CUDA.
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH_PIP_INDEX) torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

# The hard task (configs/tiny_hard.yaml: held-out problems outside the warm start's support, sparse reward);
# DEMO_CONFIG=configs/tiny_cpu.yaml is the 1-minute smoke test, configs/tiny_hard2.yaml a second (slower) hard family.
# A new trial per demo; continue one with `.venv/bin/rollflow resume NAME` (the CLI finds it in any experiment).
# It prints the run's milestones (a line per 10 % of training) and the summary; ARGS=-v prints every step.
DEMO_CONFIG ?= configs/tiny_hard.yaml
demo: install  ## bootstrap the tiny model and run async GRPO on the embedded default
	$(PY) -m flows.async_rl --config $(DEMO_CONFIG) $(ARGS)

test: test-plan install trl-venv vllm-venv sglang-venv browser  ## the whole suite (real Prefect, S3 (moto), MLflow and inference servers on 127.0.0.1)
	$(VENV)/bin/pytest -q -ra --durations=25 $(PYTEST_ARGS)

# Say what `make test` is about to build, and how big, before it builds it (only what is not built yet).
test-plan:
	@test -f $(STAMP) || echo "make test: building $(VENV) (rollflow and its test tools, about 2.6 GB, 3-5 minutes)"
	@test -f $(TRL_STAMP) || echo "make test: building $(TRL_VENV) (TRL, for the race tests against it, about 1.6 GB, 3 minutes)"
	@test -f $(VLLM_STAMP) || echo "make test: building $(VLLM_VENV) (vLLM's CPU build, for the vllm backend's tests, about 3.4 GB, 2 minutes)"
	@test -f $(SGLANG_STAMP) || echo "make test: building $(SGLANG_VENV) (SGLang's real server on CPU, for the sglang backend's tests, about 3.3 GB, 3 minutes)"

test-fast: install
	$(VENV)/bin/pytest -q -ra -m "not slow" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

docs: install  ## regenerate docs/configuration.md from the config's help text
	$(PY) -m rollflow.configuration.loader --docs > docs/configuration.md

bench: install
	$(PY) -m bench.storage
	$(PY) -m bench.inference
	$(PY) -m bench.rollout
	$(PY) -m bench.train

# TRL's GRPOTrainer as a peer baseline (bench/peer_trl.py), in its own venv so that TRL never becomes a
# dependency of rollflow.
TRL_VENV := .venv-trl
TRL_PY := $(TRL_VENV)/bin/python
TRL_STAMP := $(TRL_VENV)/.installed-$(shell cat bench/requirements-trl.txt | sha256sum | cut -c1-12)

.PHONY: trl-venv

$(TRL_STAMP):
	@test -x $(TRL_PY) || $(PYTHON) -m venv $(TRL_VENV)
	# torch first and alone: the CPU wheel 2.13.0; then the rest with torch held at 2.13.0.
	$(TRL_PY) -m pip install -q --disable-pip-version-check $(TORCH_PIP_INDEX) torch==2.13.0
	$(TRL_PY) -m pip install -q --disable-pip-version-check -r bench/requirements-trl.txt -c <(echo torch==2.13.0)
	@rm -f $(TRL_VENV)/.installed-*
	@touch $(TRL_STAMP)

trl-venv: $(TRL_STAMP)

# vLLM's CPU build (inference.backend: vllm; tests/inference run a real server), in its own venv: it
# needs transformers < 5.20 (the project pins 5.23.0). Built once (about 2 minutes, 3.4 GB) and reused
# until infra/requirements-vllm.txt changes. Its dependencies pull torchvision / torchaudio / torchcodec
# builds that do not match the CPU torch (the server fails at import): they are uninstalled.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat infra/requirements-vllm.txt | sha256sum | cut -c1-12)

.PHONY: vllm-venv

$(VLLM_STAMP):
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	# torch first and alone: the CPU wheel 2.13.0; then vLLM with torch held at 2.13.0.
	$(VLLM_PY) -m pip install -q --disable-pip-version-check $(TORCH_PIP_INDEX) torch==2.13.0
	$(VLLM_PY) -m pip install -q --disable-pip-version-check -r infra/requirements-vllm.txt -c <(echo torch==2.13.0)
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@rm -f $(VLLM_VENV)/.installed-*
	@touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# SGLang's real server on CPU (inference.backend: sglang; tests/inference run it), in its own venv: PyPI's
# sglang==0.5.23 pins a CUDA torch, so torch 2.13.0 (CPU) goes in first, then the requirements that worked
# here, then sglang itself without its dependencies, then two import edits (infra/sglang_cpu_patch.py says
# which and why). Built once (about 3 minutes, 3.3 GB) and reused until infra/requirements-sglang.txt changes.
SGLANG_VENV := .venv-sglang
SGLANG_PY := $(SGLANG_VENV)/bin/python
SGLANG_STAMP := $(SGLANG_VENV)/.installed-$(shell cat infra/requirements-sglang.txt infra/sglang_cpu_patch.py | sha256sum | cut -c1-12)

.PHONY: sglang-venv

$(SGLANG_STAMP):
	@test -x $(SGLANG_PY) || $(PYTHON) -m venv $(SGLANG_VENV)
	# torch first and alone: the CPU wheel 2.13.0; then SGLang's requirements with torch held at 2.13.0.
	$(SGLANG_PY) -m pip install -q --disable-pip-version-check $(TORCH_PIP_INDEX) torch==2.13.0
	$(SGLANG_PY) -m pip install -q --disable-pip-version-check -r infra/requirements-sglang.txt -c <(echo torch==2.13.0)
	$(SGLANG_PY) -m pip install -q --disable-pip-version-check --no-deps sglang==0.5.23
	$(SGLANG_PY) infra/sglang_cpu_patch.py
	$(SGLANG_PY) -c "import sglang.srt.entrypoints.http_server" 2>/dev/null
	@rm -f $(SGLANG_VENV)/.installed-*
	@touch $(SGLANG_STAMP)

sglang-venv: $(SGLANG_STAMP)

# Side by side with TRL: 5 seeds x 600 training seconds per system (about 2 hours on 2 cores), then the
# synchronous baseline; prints key value lines, writes bench/results/peer_<config>.{json,png}.
PEER_CONFIG ?= configs/tiny_hard.yaml
bench-peer: install trl-venv
	$(PY) -m bench.peer --config $(PEER_CONFIG) $(ARGS)

# The learning suite (docs/benchmarks.md, "The suite"): the test families, 5 seeds x 120 s, TRL then rollflow at the
# candidate defaults, about 70 minutes on 2 idle cores; one table and one picture in bench/results/suite_recalibrated/.
# SUITE_ARGS="--families dev" runs the dev families instead (about 1.5 hours).
SUITE_ARGS ?= --families test
bench-suite: install trl-venv
	$(PY) -m bench.suite.run $(SUITE_ARGS) $(ARGS)

clean:
	rm -rf runs .pytest_cache .ruff_cache
