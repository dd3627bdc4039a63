# Set-up and entry points. `make demo` and `make test` are the two commands
# the README promises: each installs everything it needs first.
#
# torch is pinned and installed FIRST: the local CPU wheel installs in
# seconds, whereas letting pip resolve the package's `torch>=2.1` range on
# its own could pull a multi-GB CUDA build.

PYTHON ?= python
PIP := $(PYTHON) -m pip
TORCH_PIN := torch==2.13.0

.PHONY: install install-bench demo test bench docs gpu-check

install:
	$(PIP) install $(TORCH_PIN)
	$(PIP) install -e ".[test]"

install-bench: install
	$(PIP) install -e ".[benchmarks]"

demo: install
	$(PYTHON) -m gpytorch_augment.demo

test: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q -p no:cacheprovider

bench: install-bench
	$(PYTHON) benchmarks/classification.py

# The documentation site (docs/): warnings are errors; the tutorials are rendered
# with their committed outputs, never executed. Output: docs/_build/html/index.html
docs: install
	$(PIP) install -e ".[docs]"
	$(PYTHON) -m sphinx -W --keep-going -b html docs docs/_build/html

# On a CUDA machine: the device tests and the GPU benchmark in a short mode (about 7 minutes on an H100, an
# estimate), results in benchmarks/results/gpu/ (and copied to $(OUT) if set). Needs no install: it runs the
# checkout's package. Rehearse it on a CPU with: python benchmarks/gpu_check.py --device cpu
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py --device cuda $(if $(OUT),--copy-to $(OUT))
