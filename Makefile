# Two set-up commands: `make run` (service on embedded defaults) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench install clean

$(STAMP): requirements/base.txt requirements/dev.txt requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt -c requirements/constraints.txt
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py runall --port $(PORT)

test: $(STAMP)
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
