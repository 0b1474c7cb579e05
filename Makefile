# Two commands: `make run` and `make test`. Each creates .venv, installs pinned
# dependencies and builds the tiny test model when missing; a second run reuses them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PEARL := $(VENV)/bin/pearl
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_CPU_KVCACHE_SPACE ?= 1
export RAY_AUTH_MODE := disabled
export PYTHONDONTWRITEBYTECODE := 1
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
REQS := requirements/$(if $(HAS_GPU),gpu,cpu).txt
NODEPS := $(if $(HAS_GPU),,requirements/cpu-nodeps.txt)
STAMP := $(VENV)/.installed-$(shell cat $(REQS) $(NODEPS) pyproject.toml | sha1sum | cut -c1-12)
TINY := artifacts/models/tiny/config.json
CONFIG ?= configs/experiments/default.yaml

.PHONY: run test venv model clean-venv

venv: $(STAMP)
model: $(TINY)

$(STAMP): $(REQS) $(NODEPS) pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "installing pinned dependencies from $(REQS) (first run only: a few minutes)"
	$(VENV)/bin/pip install -qq --disable-pip-version-check -r $(REQS)
	$(if $(NODEPS),$(VENV)/bin/pip install -qq --disable-pip-version-check --no-deps -r $(NODEPS))
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers`
	@# beside the CPU torch; triton has no CPU backend. vLLM runs without all four.
	@if [ -z "$(HAS_GPU)" ]; then $(VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true; fi
	$(VENV)/bin/pip install -qq --disable-pip-version-check --no-deps -e .
	@rm -f $(VENV)/.installed-*
	@touch $@

$(TINY): $(STAMP) scripts/make_tiny_model.py
	$(PY) scripts/make_tiny_model.py artifacts/models/tiny

# The main job: every policy (PEARL, ROLL, RLBoost+) through the simulator on the default
# config and the real Bamboo spot trace; a table on stdout and a plot under results/.
run: $(STAMP) $(TINY)
	@mkdir -p results
	$(PEARL) compare --config $(CONFIG) --hours 2 --plot results/compare.png

# Three passes: the engine-free tests on two xdist workers; the tests that start real vLLM
# engines or Ray clusters on two workers too, a whole file per worker (a module's cluster or
# engines serve its tests; about a third of one pass's CPU sat idle while one engine ran
# alone); last, one at a time, the runs marked `alone`, whose assertions read the wall clock.
# Exit 5 (nothing selected, e.g. PYTEST_ARGS names one file) is not a failure; any other
# failing pass fails the target.
test: $(STAMP) $(TINY)
	@fail=0; \
	for pass in "not vllm and not ray|-n 2" "(vllm or ray) and not alone|-n 2 --dist loadfile --durations=10" "alone|"; do \
	  marks="$${pass%%|*}"; rc=0; \
	  $(PY) -m pytest -q --timeout=1200 -m "$$marks" $${pass#*|} $(PYTEST_ARGS) || rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest: no tests selected by -m '$$marks' (exit 5)"; elif [ $$rc -ne 0 ]; then fail=$$rc; fi; \
	done; exit $$fail

clean-venv:
	rm -rf $(VENV)
