# The two set-up commands. Both create .venv on first use; nothing else needs installing by hand.
#   make demo   install and run the offline quickstart (about 4 minutes on a laptop CPU)
#   make test   install with dev extras, lint (ruff), and run the whole test suite

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Pinned: on the project's machines this wheel (a CPU build) is on local disk; elsewhere PyPI serves it.
TORCH  ?= torch==2.13.0

.PHONY: demo test mutation clean

$(VENV)/.stamp-base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.stamp-dev: $(VENV)/.stamp-base
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

demo: $(VENV)/.stamp-base
	$(VENV)/bin/burnout quickstart --out runs/quickstart

test: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check burnout tests benchmarks
	$(PY) -m pytest

# Mutation testing of the modules behind the guarantees ([tool.mutmut] in pyproject.toml); not part of `test`.
# MUTANTS narrows it, e.g. make mutation MUTANTS='burnout.generate.sampling.*'
mutation: $(VENV)/.stamp-dev
	$(PY) -m pip install --quiet "mutmut>=3.8,<4"
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run $(MUTANTS)
	$(PY) -m benchmarks.mutation_scores

clean:
	rm -rf $(VENV) runs mutants
