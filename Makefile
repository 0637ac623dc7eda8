# NetApprox. `make demo` runs the demo experiment on the kernel switch; `make test` runs the test suite.
# Both set up what they need first: Debian packages (as root) and a project venv in .venv.
PYTHON ?= python3
VENV   ?= .venv
# The Flink port (analytics/flink.py) in a venv of its own: apache-flink's apache-beam pins cloudpickle ~= 2.2, which
# the cluster extra's dask/distributed (cloudpickle >= 3) cannot share (docs/analytics.md, Flink).
FLINK_VENV ?= .venv-flink
PY     := $(VENV)/bin/python
TARGET ?= kernel
P4C    ?= p4c-bm2-ss
P4_DEFINES ?=

.PHONY: setup test demo bench experiments p4 p4-tna clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py $(wildcard */*.c */*.h */*/*.c hostlib/native/*.[ch]) tools/setup-system.sh
	./tools/setup-system.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,torch,sim,cluster,analytics,spark]'
	$(PYTHON) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLINK_VENV)/bin/python -m pip install -q -e '.[flink]'
	touch $@

# NETAPPROX_REQUIRE_NATIVE: hostlib's tests fail (not skip) when its native cores did not build, so both run; so do
# the tests of the controller's C loops (tests/support/skips.py, need_extension).
test: setup
	NETAPPROX_REQUIRE_NATIVE=1 $(PY) -P -m pytest

demo: setup
	$(PY) -m netapprox.topo.demo --target $(TARGET)

# Also docs/bench-headline.json (committed) and README's "What the numbers say" table generated from it.
bench: setup
	$(PY) -m netapprox.bench --headline-doc docs/bench-headline.json
	$(PY) -m netapprox.experiments.report --no-doc --readme README.md

# Every experiment with 3 seeds (~17 min on 2 cores), then docs/results.md and docs/img/ from results/.
experiments: setup
	$(PY) -m netapprox.experiments all
	$(PY) -m netapprox.experiments.report --notes experiments/results_notes.md

p4: build/v1model/bmv2.json

build/v1model/bmv2.json: $(shell find p4src -name '*.p4' 2>/dev/null)
	@command -v $(P4C) >/dev/null || { echo "make p4: '$(P4C)' not found. Install p4c (https://github.com/p4lang/p4c, package 'p4lang-p4c') and put it on PATH." >&2; exit 1; }
	mkdir -p build/v1model
	$(P4C) --arch v1model --std p4-16 $(P4_DEFINES) -I p4src \
	    --p4runtime-files build/v1model/p4info.txtpb -o build/v1model/bmv2.json p4src/v1model/netapprox.p4

# The TNA tree with a Tofino compiler: bf-p4c (Intel SDE, open-p4studio) or the open-source back end
# (p4lang/p4c built with -DENABLE_TOFINO=ON: the `p4c` driver beside `p4c-barefoot`, run as `p4c --target tofino
# --arch tna`; another p4c earlier on PATH may lack the Tofino target). TNA_P4C picks one explicitly.
# ENABLE_BF_ASM=1: the open-source driver runs the assembler (build/tna/pipe/tofino.bin) only when asked.
TNA_P4C ?= $(shell if command -v bf-p4c >/dev/null 2>&1; then echo bf-p4c; \
	elif b=$$(command -v p4c-barefoot 2>/dev/null); then d=$$(dirname "$$b"); [ -x "$$d/p4c" ] && echo "$$d/p4c"; fi)
p4-tna:
	@test -n "$(TNA_P4C)" || { echo "make p4-tna: no Tofino compiler on PATH: neither bf-p4c (Intel Tofino SDE or open-p4studio: source its set_sde.bash) nor p4c with the Tofino back end (p4c-barefoot: p4lang/p4c configured with -DENABLE_TOFINO=ON). See docs/dataplane.md." >&2; exit 1; }
	mkdir -p build/tna
	ENABLE_BF_ASM=1 $(TNA_P4C) --target tofino --arch tna --std p4-16 $(P4_DEFINES) -I p4src -o build/tna \
	    --p4runtime-files build/tna/p4info.txtpb --p4runtime-force-std-externs --bf-rt-schema build/tna/bfrt.json \
	    p4src/tna/netapprox.p4

# The PTF suite on BMv2 in a private network namespace (root; p4c and simple_switch_grpc on PATH).
.PHONY: ptf testgen
ptf: setup p4
	$(PY) ptf/run_ptf.py

# p4testgen's tests for every path of the v1model program, run on BMv2 (root; p4testgen, p4c, BMv2 on PATH).
testgen: setup p4
	$(PY) ptf/testgen.py

clean:
	rm -rf build results .pytest_cache
