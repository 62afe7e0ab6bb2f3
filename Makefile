# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean browser-setup

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-cache-dir -e ".[dev,efficientnet,web,onnx]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/captioning demo --out outputs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=15

# Chromium and chromedriver from Debian for tests/test_web_browser.py (it skips, saying so, without them)
browser-setup:
	.ci/browser-setup

clean:
	rm -rf $(VENV) outputs lightning_logs
