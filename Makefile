# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORE := $(VENV)/.installed-core
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint format install clean browser-setup

# The package, its dependencies and the web extra: all that `make demo` needs, its last line (serving the
# model on the web page) included. The install is part of the demo's 10 minutes.
$(CORE): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@echo "installing the package, PyTorch and the web extra into $(VENV) (a few minutes: ~6 GB, mostly PyTorch's CUDA libraries)"
	$(BIN)/pip install --quiet --no-cache-dir -e ".[web]"
	touch $(CORE)

# ... and every extra, for the tests
$(STAMP): $(CORE)
	@echo "installing the extras the tests use into $(VENV)"
	$(BIN)/pip install --quiet --no-cache-dir -e ".[dev,efficientnet,web,onnx,ecosystem,tracking,zh,subword]"
	touch $(STAMP)

install: $(STAMP)

demo: $(CORE)
	$(BIN)/captioning demo --out outputs/demo

# The tests, the browser one included, on PYTEST_WORKERS processes (default: one a core), without
# the slow ones (learning tests, multi-process and multi-node runs, load tests: `make test-slow`,
# which CI runs too). Each worker starts on a contiguous run of the tests (whole files mostly, so a
# file's module fixtures are made once) and an idle one takes tests over from a busy one (worksteal).
PYTEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q -ra --durations=15
test: $(STAMP)
	$(PYTEST) -m "not slow"

# The tests marked slow (tests that train a model until it has learned, DDP, two nodes, interrupted
# and resumed runs, the web server under load)
test-slow: $(STAMP)
	$(PYTEST) -m slow

# ruff (the lint rules and the format: pyproject.toml's [tool.ruff]; `make format` rewrites the files) and
# commit subjects of at most 72 characters (tools/dev/check_commits.py)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m tools.dev.check_commits

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Chromium and chromedriver from Debian for tests/web/test_browser.py (it skips, saying so, without them)
browser-setup:
	.ci/browser-setup

clean:
	rm -rf $(VENV) outputs lightning_logs
