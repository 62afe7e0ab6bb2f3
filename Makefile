# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORE := $(VENV)/.installed-core
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow test-floors gpu-check lint format install clean browser-setup notebooks

# Opt-in: the index PyTorch's wheels come from, installed before the package (which then finds them in
# place), e.g. the CPU-only build: `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu`, a fifth
# of the CUDA build PyPI serves on Linux (docs/INSTALL.md has the sizes). Default: PyPI's.
TORCH_INDEX ?=
TORCH_FROM = $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

# The package, its dependencies and the web extra: all that `make demo` needs, its last line (serving the
# model on the web page) included. The install is part of the demo's 10 minutes.
$(CORE): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@echo "installing the package, PyTorch and the web extra into $(VENV) (a few minutes: ~6 GB with PyTorch's CUDA libraries, ~1.2 GB with TORCH_INDEX=https://download.pytorch.org/whl/cpu)"
	$(if $(TORCH_INDEX),$(BIN)/pip install --quiet --no-cache-dir $(TORCH_FROM) torch torchvision)
	$(BIN)/pip install --quiet --no-cache-dir -e ".[web]"
	touch $(CORE)

# ... and every extra, for the tests
$(STAMP): $(CORE)
	@echo "installing the extras the tests use into $(VENV)"
	$(BIN)/pip install --quiet --no-cache-dir -e ".[dev,efficientnet,web,onnx,ecosystem,webdataset,tracking,zh,subword]"
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

# Every dependency at its floor (pyproject.toml's >=, pinned by tools/dev/floors.py) in a fresh
# $(FLOORS_VENV), torch and torchvision at their newest (TORCH_INDEX as above), then the smoke set
# (tools/dev/smoke.py: fit, evaluate, caption, serve's /healthz, export and caption with ONNX). CI runs it.
FLOORS_VENV ?= .venv-floors
FLOORS_EXTRAS := web,onnx
test-floors:
	rm -rf $(FLOORS_VENV)
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(PYTHON) -m tools.dev.floors --extras $(FLOORS_EXTRAS) --newest torch,torchvision --out $(FLOORS_VENV)/floors.txt
	$(FLOORS_VENV)/bin/pip install --quiet --no-cache-dir $(TORCH_FROM) torch torchvision
	$(FLOORS_VENV)/bin/pip install --quiet --no-cache-dir -c $(FLOORS_VENV)/floors.txt -e ".[$(FLOORS_EXTRAS)]"
	$(FLOORS_VENV)/bin/pip list --format=freeze > $(FLOORS_VENV)/installed.txt
	$(FLOORS_VENV)/bin/python -m tools.dev.smoke

# What a GPU user depends on, on the GPU of this machine, in one command (tools/benchmarks/gpu_check.py:
# fit steps of the soft, hard and Transformer configs in each speed mode, beam-5 decoding, the loader's
# feed rate, DDP, caption and serve on cuda); a JSON and a Markdown table in GPU_CHECK_OUT. Without
# CUDA: GPU_CHECK_ARGS=--dry-run (the same script on the CPU at tiny sizes, as CI runs it).
GPU_CHECK_OUT ?= outputs/gpu_check
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(BIN)/python -m tools.benchmarks.gpu_check --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# The notebooks of examples/ and examples/zh/, each executed top to bottom on the CPU (examples/run_notebooks.py:
# nbclient, each cell within NOTEBOOK_TIMEOUT seconds); the executed copies and their times in
# outputs/notebooks/executed/. NOTEBOOK_ARGS="--steps 20" runs them briefly (CI: .ci/run; each model trains
# 20 steps, so the stage checks that every cell runs, not what the models learn).
NOTEBOOK_TIMEOUT ?= 900
NOTEBOOK_ARGS ?=
notebooks: $(STAMP)
	$(BIN)/python examples/run_notebooks.py --timeout $(NOTEBOOK_TIMEOUT) $(NOTEBOOK_ARGS)

# The checks that read the repository rather than run the program, each printing its problems: ruff (the
# lint rules and the format: pyproject.toml's [tool.ruff]; `make format` rewrites the files), commit
# subjects of at most 72 characters, the Python floor (vermin), the package's import layers, docstrings
# (module docstrings of at most 20 lines, sentences of at most 60 words), ARCHITECTURE.md naming every
# module, and the docs (relative links, the README's length, no development history, what they quote
# from the code, the licence, citation and changelog): tools/dev/check_*.py. All run; it fails if any failed.
LINT_CHECKS := "$(BIN)/ruff check ." "$(BIN)/ruff format --check ." \
	"$(BIN)/python -m tools.dev.check_commits" "$(BIN)/python -m tools.dev.check_python_floor" \
	"$(BIN)/python -m tools.dev.check_imports" "$(BIN)/python -m tools.dev.check_docs" \
	"$(BIN)/python -m tools.dev.check_prose" "$(BIN)/python -m tools.dev.check_architecture"
lint: $(STAMP)
	@failed=""; for check in $(LINT_CHECKS); do echo "$$check"; $$check || failed="$$failed; $$check"; done; \
	if [ -n "$$failed" ]; then echo "make lint: failed:$${failed#;}"; exit 1; fi

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Chromium and chromedriver from Debian for tests/web/test_browser.py (it skips, saying so, without them)
browser-setup:
	.ci/browser-setup

clean:
	rm -rf $(VENV) $(FLOORS_VENV) outputs lightning_logs
