# Two commands for a newcomer: `make demo` and `make test`. Each sets up what
# is missing first (a virtual environment in .venv with the pinned torch).
#
# TORCH: the torch requirement installed first. torch==2.13.0 is the CPU wheel
# on CPU-only machines and the CUDA build on GPU hosts; on Ascend hosts add
# EXTRAS=test,npu to get the matching torch_npu (needs CANN installed).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= test
PY := $(VENV)/bin/python
comma := ,
STAMP := $(VENV)/.installed-$(subst =,-,$(TORCH))-$(subst $(comma),-,$(EXTRAS))
DEMO_RUN := demo-$(shell date +%Y%m%d-%H%M%S)
DEMO_ARGS ?=

.PHONY: setup demo test test-fast clean-runs prometheus chromium

setup: $(STAMP)

# INSTALLER: uv (the default) installs the same packages as pip, from the same places
# (.ci/uv_index_args.py reads pip's configuration: a mirror, a folder of wheels, a
# constraints file), in about 15 s against pip's 70 s on an idle 2-core machine and 18 s
# against 3.5 minutes on a loaded one; pip itself is only asked for uv. `unsafe-best-match`
# takes the newest release over all indexes, as pip does (uv's default stops at the first
# index that has the package). INSTALLER=pip installs with pip alone.
INSTALLER ?= uv
ifeq ($(filter $(INSTALLER),uv pip),)
$(error INSTALLER=$(INSTALLER) is neither uv nor pip: use `make INSTALLER=uv` or `make INSTALLER=pip`)
endif

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifeq ($(INSTALLER),uv)
	$(PY) -m pip install --quiet --disable-pip-version-check uv
	where=$$($(PY) .ci/uv_index_args.py) && eval "$(VENV)/bin/uv pip install --quiet --python $(PY) \
	  --index-strategy unsafe-best-match $$where '$(TORCH)' -e '.[$(EXTRAS)]'"
else
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH)" -e ".[$(EXTRAS)]"
endif
	touch $@

demo: $(STAMP)
	$(VENV)/bin/runmgr launch conf=demo run.name=$(DEMO_RUN) $(DEMO_ARGS)
	$(VENV)/bin/runmgr logbook show $(DEMO_RUN)

# Three pytest workers (pytest-xdist) on CI's two cores: with two, both workers often waited
# at once (on real processes: a throttled node's probe, a hang's timeout, a pause) and the cores
# were 1.60 busy on average; a third fills those waits (1.81 busy). Measured on clean clones of
# one commit (docs/testing.md, stop 52): idle 14:37 against 16:01, beside two busy loops 25:28
# against 26:30, every test passing in all four. A module's tests stay on one worker
# (--dist loadscope), so its module-scoped runs happen once, and modules go out in the order
# collected (--no-loadscope-reorder: tests/conftest.py puts the slow ones first).
TEST_WORKERS ?= 3
# Python writes its bytecode caches while the suite runs, whatever PYTHONDONTWRITEBYTECODE says
# (these machines set it): otherwise every process the suite starts (about 1,600: drivers, Ray
# workers, fork servers, torchruns) compiles runmgr's and the trainer's sources again, and each
# pytest worker rewrites all 245 test modules (12.7 CPU-seconds a collection against 4.4).
SUITE_ENV := PYTHONDONTWRITEBYTECODE=

test: $(STAMP) prometheus chromium
	$(SUITE_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --timeout=600 --durations=30

# The metrics test scrapes a real run with a real Prometheus, which sends the alerts of
# runmgr's rules to a real Alertmanager: Debian's packages (about 10 s), installed when
# missing (as root, or through sudo).
prometheus:
	@command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager >/dev/null; }

# The page's browser tests (tests/logbook/web) drive Debian's chromium through
# playwright's Python package, never a browser playwright downloads.
chromium:
	@command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

test-fast: $(STAMP)
	$(SUITE_ENV) $(PY) -m pytest -q -m "not slow" --timeout=300

clean-runs:
	rm -rf runs
