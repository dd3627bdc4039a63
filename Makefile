# Set-up and entry points. `make demo` and `make test` are the two commands
# the README promises: each installs everything it needs first.
#
# torch is pinned and installed FIRST: the local CPU wheel installs in
# seconds, whereas letting pip resolve the package's `torch>=2.1` range on
# its own could pull a multi-GB CUDA build.

PYTHON ?= python
PIP := $(PYTHON) -m pip
TORCH_PIN := torch==2.13.0

install:
	$(PIP) install $(TORCH_PIN)
	$(PIP) install -e ".[test]"

install-bench: install
	$(PIP) install -e ".[benchmarks]"

demo: install
	$(PYTHON) -m gpytorch_augment.demo

# The numerically sensitive tests (the regression pins, numerics, distributions, predictive CDFs and quantiles, the
# one-call fit) run a second time on PyTorch's portable CPU kernels, as another CPU computes: a tolerance that only
# this CPU's vector kernels meet fails here, before it lands.
PORTABLE_TESTS := tests/test_regression_pins.py tests/test_numerics.py tests/distributions \
	tests/likelihoods/test_count_predictive.py tests/likelihoods/test_robust_predictive.py \
	tests/inference/test_hyperparameters.py tests/inference/test_fit_model.py

.PHONY: install install-bench demo test test-fast test-portable bench docs gpu-check

# Everything: the whole suite, slow tier included (spread over the machine's cores by pytest-xdist: every test is
# seeded on its own, so the order does not matter), then the portable-kernel pass.
test: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q -p no:cacheprovider -n auto
	$(MAKE) --no-print-directory test-portable

# Everyday work: the suite without the slow tier (Geweke batteries, notebooks, the Sphinx build, multi-process runs,
# the largest fuzz matrices, simulation coverage).
test-fast: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest -q -p no:cacheprovider -m "not slow"

test-portable:
	ATEN_CPU_CAPABILITY=default $(PYTHON) -m pytest -q -p no:cacheprovider $(PORTABLE_TESTS)

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
