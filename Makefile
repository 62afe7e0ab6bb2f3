# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean browser-setup

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-cache-dir -e ".[dev,efficientnet,web,onnx,ecosystem]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/captioning demo --out outputs/demo

# Every test, the slow (learning) and browser ones included, on PYTEST_WORKERS processes (default:
# one a core). Each worker starts on a contiguous run of the tests (whole files mostly, so a file's
# module fixtures are made once) and an idle one takes tests over from a busy one (worksteal).
PYTEST_WORKERS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q -ra --durations=15

# Chromium and chromedriver from Debian for tests/test_web_browser.py (it skips, saying so, without them)
browser-setup:
	.ci/browser-setup

clean:
	rm -rf $(VENV) outputs lightning_logs
