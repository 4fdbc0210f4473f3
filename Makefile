# deltarl — set-up, main job and tests. `make run` and `make test` work on a fresh machine:
# both create .venv on first use and install deltarl into it.
PYTHON ?= python3
VENV   ?= .venv
# On CPU-only machines pin torch's CPU wheel first (a bare `torch` pulls a multi-GB CUDA build);
# on a GPU machine: make TORCH='torch' ...
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
RUN    ?= runs/quickstart-$(shell date +%Y%m%d-%H%M%S)

.PHONY: run test bench install clean-runs browser

$(BIN)/.deltarl-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[test,rlzoo]'
	# the CoopNavi reference check compares with mpe2; its pygame-ce dependency would replace
	# gymnasium's pygame, so it comes without dependencies (it needs none at test time)
	$(BIN)/pip install -q --no-deps "pettingzoo==1.27.0" "mpe2==1.1.1"
	touch $@

install: $(BIN)/.deltarl-installed

# The main job on the embedded default: safety testing of the zoo CartPole agent with CureFuzz on a
# local Ray cluster; dataset D as Parquet, MLflow in SQLite, all under the run folder.
run: $(BIN)/.deltarl-installed
	$(BIN)/deltarl run experiments/quickstart.yaml --out $(RUN)

# the report tests open the HTML in headless Chromium, and MuJoCo bug videos render offscreen through
# EGL with Mesa's software driver (Debian's packages; root installs them here)
SYSPKGS := chromium libegl1 libegl-mesa0 libgl1-mesa-dri
browser:
	@missing=""; for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -z "$$missing" ]; then :; \
	  elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null); \
	  else echo "note: missing system packages:$$missing; the report and video tests need them: sudo apt-get install -y$$missing"; fi

# lint (pyflakes + import order, settings in pyproject.toml), then the suite
test: $(BIN)/.deltarl-installed browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

bench: $(BIN)/.deltarl-installed
	$(BIN)/python benchmarks/rollout_throughput.py

clean-runs:
	rm -rf runs/
