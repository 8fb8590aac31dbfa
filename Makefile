# shardlab — build the book, run the tests.
#
#   make book        environment (if missing) + widget JS + live-calculator runtime (Pyodide,
#                    wheels: tools/build_live.py) + book build, then serve on :8000
#   make test        environment (if missing) + ruff + pytest + nbval (the book build is in
#                    make test-slow, which CI also runs)
#
# Notebooks are discovered by glob: book/**/*.ipynb and labs/**/*.ipynb, except _build,
# .ipynb_checkpoints and hidden/ folders (the same set tools/execute_notebooks.py uses).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON3 ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
VENV_STAMP := $(VENV)/.requirements-installed
WIDGET_JS := book/_widgets_js
WIDGET_STAMP := $(WIDGET_JS)/.fetched
# Pyodide + wheels for the live calculators (tools/build_live.py); downloads cached here
LIVE_DIR := book/_live
LIVE_CACHE := .cache/live
HTML := _build/html
PORT ?= 8000
# `make book BIND=0.0.0.0` to serve beyond this machine
BIND ?= 127.0.0.1
# pytest-xdist workers for the test and notebook passes
WORKERS ?= 2
# Another machine, simulated (issue 23): PyTorch picks its CPU kernels per machine (default /
# AVX2 / AVX512 / ARM) and the intra-op thread count changes reduction order, so the last bits
# of results differ between laptops. make test-slow runs nbval once more with the portable
# kernels and one thread, and the pytest pass with AVX2 kernels (x86-64; elsewhere default).
ALT_KERNELS := ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1
ALT_UNIT_CAPABILITY := $(if $(filter x86_64 amd64,$(shell uname -m)),avx2,default)
# `make execute NB="book/01_collectives.ipynb"` re-executes only those
NB ?=

NOTEBOOKS = $(shell find book labs -name '*.ipynb' \
	-not -path '*/_build/*' -not -path '*/.ipynb_checkpoints/*' -not -path '*/hidden/*' \
	2>/dev/null | sort)

# `make book JUPYTERHUB_URL=https://hub.example.edu` adds a JupyterHub launch button
JUPYTERHUB_URL ?=
HUB_CONFIG := _config.hub.yml
JB_BUILD := $(BIN)/jupyter-book build . --all -W --keep-going \
	$(if $(strip $(JUPYTERHUB_URL)),--config $(HUB_CONFIG))
NBVAL := $(BIN)/pytest --nbval --nbval-current-env \
	--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600 \
	-p no:cacheprovider

.PHONY: gpu-check help venv widget-js live-js book-build book test test-slow lint pytest nbval execute lab clean distclean

help:
	@echo "make book        build the book (creates .venv if missing) and serve it on http://localhost:$(PORT)"
	@echo "make book-build  build the book into $(HTML) only (warnings are errors)"
	@echo "make test        ruff, pytest, nbval over every notebook"
	@echo "make lint | pytest | nbval   one part of make test"
	@echo "make test-slow   book build, real-lab grading, hidden lab tests, 10x launcher fault repeats (CI runs it)"
	@echo "make execute     re-execute every notebook in place (NB=\"a.ipynb b.ipynb\" for some)"
	@echo "make lab         open the labs in JupyterLab"
	@echo "make gpu-check   on a machine with a GPU: measured vs predicted on CUDA/nccl (about 8 min)"
	@echo "make clean       remove build outputs (keeps .venv); make distclean also removes .venv"

# --- environment -----------------------------------------------------------------------

venv: $(VENV_STAMP)

$(VENV_STAMP): requirements.txt pkg/pyproject.toml
	@test -x $(PY) || { echo "creating $(VENV) with $(PYTHON3)"; $(PYTHON3) -m venv $(VENV); }
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(PY) -m pip install -r requirements.txt
	@touch $@

widget-js: $(WIDGET_STAMP)

$(WIDGET_STAMP): tools/fetch_widget_js.sh
	bash tools/fetch_widget_js.sh $(WIDGET_JS)

# Runs every build: with a warm cache it uses no network and rewrites only changed files
# (the shardlab wheel follows pkg/shardlab); then the Python snapshot a first visit restores
# is made in headless Chromium when the lock file changed (skipped without Chromium).
live-js: venv
	$(PY) tools/build_live.py --dest $(LIVE_DIR) --cache $(LIVE_CACHE)
	$(PY) tools/build_snapshot.py --dest $(LIVE_DIR)

# --- book --------------------------------------------------------------------------------

# One sentence per missing system tool (bubblewrap, npm, chromium), or installed when root
# with apt-get; runs before the environment is created.
prereqs-%:
	@bash tools/prereqs.sh $*

book-build: prereqs-book venv widget-js live-js
	$(if $(strip $(JUPYTERHUB_URL)),$(PY) tools/hub_config.py "$(JUPYTERHUB_URL)" $(HUB_CONFIG))
	@# Sphinx copies static files over the old ones and never removes any: a previous build's
	@# 8 MB Python snapshot (another lock file's name) would stay in the published site
	rm -rf $(HTML)/_static/shardlab-live
	$(JB_BUILD)
	$(PY) tools/check_site.py $(HTML)

book: book-build
	@echo
	@echo "The book is at http://localhost:$(PORT)/  (Ctrl-C stops the server)"
	@echo
	$(PY) -m http.server $(PORT) --bind $(BIND) --directory $(HTML)

# --- tests -------------------------------------------------------------------------------

# The book build (-W, every page and cross-reference) runs in test-slow: it adds a minute and
# a half of downloads and rendering to a loop that should stay under ten minutes.
test: prereqs-test venv
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory pytest
	$(MAKE) --no-print-directory nbval
	@echo "make test: all checks passed"

lint: venv
	$(BIN)/ruff check .

# Unit and public lab tests (pytest.ini: testpaths = tests labs). Notebooks are not
# collected here (no --nbval), so nothing runs twice. Exit code 5 (no tests) is an error.
# The labs' hidden tests (4-rank and larger cases) run in test-slow, where the grader also
# runs them against the reference, the released stub and the planted bugs.
pytest: venv
	$(BIN)/pytest -n $(WORKERS) -m "not slow" tests labs --ignore-glob='labs/*/hidden/*'

# Minutes-long checks CI also runs (.ci/run): every real lab graded three ways (reference,
# released stub, planted bug), the labs' hidden tests, slow checks kept beside the labs, and
# each launcher fault repeated 10 times.
test-slow: prereqs-test-slow venv
	$(MAKE) --no-print-directory book-build
	$(BIN)/pytest -n $(WORKERS) -m slow tests labs
	$(BIN)/pytest -n $(WORKERS) -m "not slow" $(sort $(wildcard labs/*/hidden))
	SHARDLAB_FAULT_REPEATS=10 $(BIN)/pytest -n $(WORKERS) tests/test_dist_faults.py
	@echo "make test-slow: strict nbval again with $(ALT_KERNELS) (stored outputs must not depend on the CPU)"
	$(ALT_KERNELS) $(MAKE) --no-print-directory nbval
	@echo "make test-slow: unit and public lab tests with ATEN_CPU_CAPABILITY=$(ALT_UNIT_CAPABILITY)"
	ATEN_CPU_CAPABILITY=$(ALT_UNIT_CAPABILITY) $(MAKE) --no-print-directory pytest

# Strict nbval over the notebook files only: passing the .ipynb paths (not folders) keeps
# pytest from collecting the .py tests a second time. loadscope keeps each notebook's cells
# together, in order, on one worker.
nbval: venv
	@if [ -z "$(strip $(NOTEBOOKS))" ]; then echo "nbval: no notebooks found"; exit 0; fi
	$(NBVAL) -n $(WORKERS) --dist loadscope $(NOTEBOOKS)

# Measured vs predicted on CUDA/nccl (peaks, GEMM TFLOP/s, lab tests with the GPU visible);
# needs one GPU, never part of CI (tools/gpu_check.py says what it runs).
gpu-check: venv
	$(PY) tools/gpu_check.py

execute: venv
	$(PY) tools/execute_notebooks.py $(NB)

lab: venv
	$(BIN)/jupyter lab labs/

clean:
	rm -rf _build $(WIDGET_JS) $(LIVE_DIR) shots
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(LIVE_CACHE)
