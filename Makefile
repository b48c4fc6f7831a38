# Two commands do all set-up on a fresh machine: `make up` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt constraints.txt client/pyproject.toml | cksum | cut -d' ' -f1)

STAGE  ?= dev

.PHONY: up test lint bench clean package

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

## up: the whole system locally (moto server, API, timers, agents) until Ctrl-C;
## V=1 shows the services' INFO logs and EMF metrics
up: $(STAMP)
	$(PY) -m devstack $(if $(V),-v)

## lint: the CloudFormation template
lint: $(STAMP)
	@echo "==> linting infra/template.yaml (cfn-lint)"
	$(VENV)/bin/cfn-lint infra/template.yaml

## test: installs what it needs, then runs every test
test: $(STAMP) lint
	@echo "==> running every test (pytest prints how long they took)"
	$(PY) -m pytest

## bench: ratios against a baseline measured in the same run; V=1 shows INFO logs and EMF
bench: export GPUJOBS_VERBOSE = $(V)
bench: $(STAMP)
	$(PY) bench/endpoints.py
	$(PY) bench/placement.py
	$(PY) bench/scan.py
	$(PY) bench/stall_sim.py
	$(PY) bench/beat_cost.py

## package: the deployable bundle of STAGE (default dev): build/STAGE/sam.json, deployment.zip
package: $(STAMP)
	$(PY) infra/package.py --stage $(STAGE) --out build/$(STAGE)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
