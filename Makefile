# The set-up commands. Each creates .venv on first use; nothing else needs installing by hand.
#   make demo       install and run the offline quickstart (about 4 minutes on a laptop CPU)
#   make test       install with dev extras, lint (ruff), and run the whole test suite
#   make test-fast  the same without the tests marked slow (a few minutes)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Pinned: on the project's machines this wheel (a CPU build) is on local disk; elsewhere PyPI serves it.
TORCH  ?= torch==2.13.0
# The optional dependencies the README's first hour uses (pyproject.toml): `data audit` (data), the playground
# (playground), the export loaded by transformers (hf), `burnout serve` (serve).
DEMO_EXTRAS := data,hf,playground,serve

.PHONY: demo test test-fast mutation clean

$(VENV)/.stamp-base: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[$(DEMO_EXTRAS)]"
	touch $@

# llama-cpp-python (the GGUF tests' llama.cpp) has no wheel on PyPI: pip compiles it. The tests load only libllama
# and ggml, so neither its multimodal library (LLAVA_BUILD) nor llama.cpp's common library is built: 74 of the 178
# compile units (docs/TESTING.md has the times). A CMAKE_ARGS of your own (a GPU backend, say) still applies.
LLAMA_CPP_CMAKE_ARGS := -DLLAVA_BUILD=OFF '-DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/.ci/llama_cpp_lib_only.cmake'

$(VENV)/.stamp-dev: $(VENV)/.stamp-base .ci/llama_cpp_lib_only.cmake
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS) $(CMAKE_ARGS)" $(PY) -m pip install --quiet -e ".[dev]"
	touch $@

demo: $(VENV)/.stamp-base
	$(VENV)/bin/burnout quickstart --out runs/quickstart

test: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check burnout tests benchmarks
	$(PY) -m pytest

# The tests that train no more than a few steps: everything but the `slow` and `gpu` markers (docs/TESTING.md).
test-fast: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check burnout tests benchmarks
	$(PY) -m pytest -m "not slow and not gpu"

# Mutation testing of the functions behind the README's guarantees ([tool.mutmut] in pyproject.toml lists their
# modules and tests); not part of `test`. All of those modules' 4,500 mutants would take hours on 2 cores.
# MUTANTS narrows it, e.g. make mutation MUTANTS='burnout.generate.sampling.*'
GUARANTEES := 'burnout.generate.sampling.*' \
	'burnout.base.values.x_is_finite_number*' 'burnout.base.values.x_checked_number*' \
	'burnout.base.files.x_write_atomic*' \
	'burnout.playground.catalog.x_sampling_settings*' 'burnout.playground.catalog.x__check_request*' \
	'burnout.playground.catalog.xǁModelCacheǁ*' \
	'burnout.train.metrics.xǁStepLoggerǁ*' 'burnout.train.hardware.x_get_hardware*' \
	'burnout.train.hardware.x__table_hardware*' 'burnout.train.hardware.x_match_gpu*' \
	'burnout.data.loader.*' \
	'burnout.data.prepare.x__restore_streams*' 'burnout.data.prepare.xǁ_SplitWriterǁ_restore*' \
	'burnout.data.prepare.xǁ_SplitWriterǁ_save_resume_point*' 'burnout.data.prepare.x__usable_resume_point*' \
	'burnout.data.prepare.x__fingerprint*' \
	'burnout.core.checkpoint.x_save_checkpoint*' 'burnout.core.checkpoint.x_load_checkpoint*' \
	'burnout.core.checkpoint.x_checkpoint_problem*' 'burnout.core.checkpoint.x_list_checkpoints*' \
	'burnout.core.checkpoint.x_resolve_checkpoint*' \
	'burnout.train.checkpointing.x_resume_point*' 'burnout.train.checkpointing.x_load_for_resume*' \
	'burnout.train.checkpointing.x_newest_good_checkpoint*' 'burnout.train.checkpointing.xǁCheckpointerǁrestore*' \
	'burnout.train.checkpointing.xǁCheckpointerǁdue*'
MUTANTS ?= $(GUARANTEES)
mutation: $(VENV)/.stamp-dev
	$(PY) -m pip install --quiet "mutmut>=3.8,<4"
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run $(MUTANTS)
	$(PY) -m benchmarks.mutation_scores $(MUTANTS)

clean:
	rm -rf $(VENV) runs mutants
