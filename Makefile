# Two set-up commands: `make run` (service on embedded defaults) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench install clean

$(STAMP): requirements/base.txt requirements/dev.txt requirements/constraints.txt
	@# Debian splits venv support off python3.
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || scripts/ensure-system-packages --only python3-venv
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt -c requirements/constraints.txt
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py runall --port $(PORT)

test: $(STAMP)
	@# Real sandboxes and the browser tests need bubblewrap, passt, chromium...: see .ci/apt-packages.txt.
	scripts/ensure-system-packages
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check . || true

typecheck: $(STAMP)
	$(VENV)/bin/mypy .

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) var
