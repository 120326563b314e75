# Two commands set up everything on a fresh machine: `make test` and `make bench`.
SHELL := /bin/bash
VENV ?= .venv
PY_VERSION := $(shell cat .python-version)
# The interpreter that creates the venv: PYTHON=... overrides; else pyenv's 3.12; else python3.12 on PATH.
PYTHON ?= $(shell (pyenv prefix $(PY_VERSION) 2>/dev/null | head -n1 | sed 's|$$|/bin/python|') || command -v python$(PY_VERSION))
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test bench setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x "$(VPY)" ]; then \
	  py="$(PYTHON)"; \
	  if [ -z "$$py" ] || ! "$$py" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then \
	    py=$$(command -v python3.12 || true); fi; \
	  if [ -z "$$py" ]; then echo "Python 3.12 not found: install it (pyenv install 3.12) or pass PYTHON=/path/to/python3.12" >&2; exit 1; fi; \
	  echo "creating $(VENV) with $$py"; "$$py" -m venv $(VENV); fi
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '.[test,serve-test,hf,eval,structured]'
	touch $(STAMP)

test: $(STAMP)
	$(VPY) -m pytest -q -n 2 --dist loadfile tests

bench: $(STAMP)
	$(VENV)/bin/jaxpaged bench serving --model=small --workload=chatbot --num_requests=8 --system_len=256 --user_len=64 --output_len=32 --kv_budget_tokens=2048 --max_model_len=1024 --max_num_batched_tokens=1024 --progress=false --json_out=out/bench_serving.json --md_out=out/bench_serving.md

clean:
	rm -rf $(VENV) .pytest_cache
