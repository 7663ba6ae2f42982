# Two commands on a fresh machine: `make demo` and `make test`.
# python3 resolves through pyenv, which reads .python-version (3.12) in this folder.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

# setup.py, _accel.c, _lines.c: the editable install compiles the C loops in place, so a change to any of them reinstalls
$(STAMP): pyproject.toml setup.py addon/streamtap/wire/_accel.c addon/streamtap/recording/_lines.c
	@$(PY) -c 'import sys; v = sys.version_info; sys.exit(0 if v >= (3, 12) else f"streamtap needs Python 3.12 or newer, {sys.executable} is {v.major}.{v.minor} (pyenv reads .python-version)")'
	@bash scripts/system-deps.sh --build
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/streamtap demo

# Two pytest workers, each taking whole test files (module fixtures start once): most tests wait on
# real processes and sockets, so two at a time fit two cores; the timing tests are written for that.
test: $(STAMP)
	@bash scripts/system-deps.sh
	$(BIN)/python -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/decoders.py

clean:
	rm -rf $(VENV) build addon/*.egg-info addon/streamtap/wire/*.so
