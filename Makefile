# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[dev,efficientnet]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/captioning demo --out outputs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=15

clean:
	rm -rf $(VENV) outputs lightning_logs
