# Two commands do all set-up on a fresh machine: `make up` and `make test`.
# the virtualenvs are made from a python3 every user can run: as root, make up
# runs each job's ranks as a uid of its own, and a job's `python` is the
# virtualenv's (devstack/interpreter.py says how it picks; PYTHON=... overrides)
PYTHON ?= $(shell python3 devstack/interpreter.py)
# ... and those uids must pass through every folder above a virtualenv, which a
# checkout under a folder others cannot search (a 0700 /root, mktemp -d) never
# lets them: as root there, the virtualenvs live in /var/tmp/gpujobs-<hash of
# the checkout's path>/ instead, .venv and .venv-torch in the checkout linking to
# them; anywhere else, in the checkout (devstack/reach.py). VENV=... overrides
VENV   ?= $(shell python3 -m devstack.reach .venv)
VENV   := $(VENV)
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt constraints.txt client/pyproject.toml | cksum | cut -d' ' -f1)

STAGE  ?= dev

# the real-torch tests' own virtualenv (requirements-torch.txt and the rank-side
# helper, agent/rankside), kept across runs: a machine pays for torch once
TORCH_VENV  ?= $(shell python3 -m devstack.reach .venv-torch)
TORCH_VENV  := $(TORCH_VENV)
ifeq ($(and $(VENV),$(TORCH_VENV)),)
$(error no place for the virtualenvs: devstack/reach.py says why above)
endif
TORCH_PY    := $(TORCH_VENV)/bin/python
TORCH_STAMP := $(TORCH_VENV)/.installed-$(shell cat requirements-torch.txt agent/rankside/pyproject.toml agent/rankside/gpujobs_heartbeat.py | cksum | cut -d' ' -f1)

.PHONY: up test test-fast lint fmt bench bench-quick bench-scale record-torch clean package browser torch-venv

# bash for pipefail: the install's output is filtered to one line a package
SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c

$(STAMP): requirements.txt requirements-dev.txt constraints.txt client/pyproject.toml
	@test -x $(PY) || { echo "==> creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> installing requirements-dev.txt into $(VENV), pinned by constraints.txt" \
	      "($$(grep -c '==' constraints.txt) pins; a few minutes on a fresh machine)"
	@$(PY) -m pip install --disable-pip-version-check --progress-bar off \
	    -r requirements-dev.txt -c constraints.txt \
	  | sed -un -e 's/^Collecting \([^ ]*\).*/    \1/p' -e 's/^Successfully installed.*/    done/p'
	@rm -f $(VENV)/.installed-*
	@touch $@

## torch-venv: torch (CPU) and the rank-side helper in $(TORCH_VENV), for the real DDP tests
torch-venv: $(TORCH_STAMP)
$(TORCH_STAMP): requirements-torch.txt agent/rankside/pyproject.toml agent/rankside/gpujobs_heartbeat.py
	@test -x $(TORCH_PY) || { echo "==> creating $(TORCH_VENV) with $(PYTHON)"; $(PYTHON) -m venv $(TORCH_VENV); }
	@echo "==> installing requirements-torch.txt into $(TORCH_VENV) (once a machine)"
	@$(TORCH_PY) -m pip install --disable-pip-version-check --progress-bar off \
	    -r requirements-torch.txt \
	  | sed -un -e 's/^Collecting \([^ ]*\).*/    \1/p' -e 's/^Successfully installed.*/    done/p'
	@echo "==> installing the rank-side helper (pip install ./agent/rankside) into $(TORCH_VENV)"
	@$(TORCH_PY) -m pip install --disable-pip-version-check --no-deps --no-build-isolation \
	    --force-reinstall --quiet ./agent/rankside
	@rm -rf agent/rankside/build agent/rankside/*.egg-info  # the in-tree build's leftovers
	@rm -f $(TORCH_VENV)/.installed-*
	@touch $@

## up: the whole system locally (moto server, API, timers, agents) until Ctrl-C;
## V=1 shows the services' INFO logs and EMF metrics
up: $(STAMP)
	$(PY) -m devstack $(if $(V),-v)

## lint: the CloudFormation template, ruff (rules in ruff.toml) and mypy (mypy.ini)
lint: $(STAMP)
	@echo "==> linting infra/template.yaml (cfn-lint)"
	$(VENV)/bin/cfn-lint infra/template.yaml
	$(PY) -m ruff check .
	$(PY) -m mypy

## fmt: apply ruff's fixable findings (import order, unused imports)
fmt: $(STAMP)
	$(PY) -m ruff check --fix .

## browser: headless Chromium and its driver for the dashboard's tests (Debian packages)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; else \
	  echo "installing chromium and chromium-driver (apt-get) for the browser tests"; \
	  { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	    --no-install-recommends chromium chromium-driver fonts-dejavu-core; } || \
	  echo "!!! chromium could not be installed: the browser tests will be SKIPPED !!!"; fi

## test: installs what it needs, builds the bundle, then runs every test
## (tests/package invoke every function of that bundle as Lambda does)
## Two workers (pytest-xdist, a test file each at a time); the IAM policy checks
## then read every AWS call the workers recorded, in a session of their own.
IAM_RECORDS := $(CURDIR)/build/iam-records
## (tests/e2e/test_torch_ddp.py runs real DDP jobs with $(TORCH_VENV)'s python,
## and fails rather than skips when it is missing)
test: $(STAMP) $(TORCH_STAMP) lint browser package
	@echo "==> running every test on 2 workers (pytest prints how long they took)"
	@rm -rf $(IAM_RECORDS) && mkdir -p $(IAM_RECORDS)
	IAM_RECORD_DIR=$(IAM_RECORDS) GPUJOBS_BUNDLE=build/$(STAGE) \
	  GPUJOBS_TORCH_PYTHON=$(abspath $(TORCH_PY)) GPUJOBS_REQUIRE_TORCH=1 \
	  $(PY) -m pytest -n 2 --dist loadfile -m "not iam_last and not scale"
	@echo "==> the IAM policies against every AWS call recorded above"
	IAM_RECORD_DIR=$(IAM_RECORDS) $(PY) -m pytest -q tests/test_iam_policy.py -m iam_last

## test-fast: the domain, the service logic on the in-memory fakes and the fakes'
## side of the contract suite; no moto, no stack, no processes, and not the few
## tests marked slow (their largest sizes; make test runs them): under 15 s
FAST_TESTS := tests/unit tests/service tests/contract tests/test_openapi.py
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not moto and not e2e and not slow" $(FAST_TESTS)

## bench: ratios against a baseline measured in the same run, each script's
## time after it (docs/benchmarks.md: about 7 minutes on 2 cores); V=1 shows
## the services' INFO logs and EMF metrics
BENCHES := endpoints placement arrays scan scan_rank_cost stall_sim beat_cost beat_write telemetry_cost moto_wall dashboard load scale
bench: export GPUJOBS_VERBOSE = $(V)
bench: $(STAMP) browser
	@total=0; for b in $(BENCHES); do start=$$(date +%s); \
	  $(PY) bench/$$b.py || exit 1; took=$$(( $$(date +%s) - start )); \
	  total=$$(( total + took )); echo "== bench/$$b.py: $$took s"; done; \
	  echo "== make bench: $$total s"

## bench-scale: the runs at the API's largest sizes, each with its verdict (pass or
## fail) and its time: the 65,536-rank whole-job hang on every surface (the tests
## marked scale; make test runs their 1,024-rank size) and bench/arrays.py's
## 10,000-index arrays (docs/benchmarks.md: about 15 minutes on 2 cores)
bench-scale: export GPUJOBS_VERBOSE = $(V)
bench-scale: $(STAMP) browser
	$(PY) -m pytest -m scale --durations=0 -p no:cacheprovider tests
	$(PY) bench/arrays.py

## bench-quick: every script with --quick, as the test suite runs them (about 3 minutes on 2 busy cores)
bench-quick: $(STAMP)
	$(PY) -m pytest tests/test_bench_smoke.py -q

## record-torch: re-record bench/traces/torch_ddp.json, the real DDP runs bench/stall_sim.py
## draws its torch-shaped scenario from and compares against (6 to 9 minutes on 2 cores)
record-torch: $(STAMP) $(TORCH_STAMP)
	GPUJOBS_TORCH_PYTHON=$(abspath $(TORCH_PY)) $(PY) bench/record_torch.py

## package: the deployable bundle of STAGE (default dev): build/STAGE/sam.json, deployment.zip
package: $(STAMP)
	$(PY) infra/package.py --stage $(STAGE) --out build/$(STAGE)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
