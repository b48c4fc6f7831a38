# Two commands do all set-up on a fresh machine: `make up` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt constraints.txt client/pyproject.toml | cksum | cut -d' ' -f1)

STAGE  ?= dev

.PHONY: up test lint bench clean package

$(STAMP): requirements.txt requirements-dev.txt constraints.txt client/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
	rm -f $(VENV)/.installed-*
	touch $@

## up: the whole system locally (moto server, API, timers, agents) until Ctrl-C
up: $(STAMP)
	$(PY) -m devstack

## lint: the CloudFormation template
lint: $(STAMP)
	$(VENV)/bin/cfn-lint infra/template.yaml

## test: installs what it needs, then runs every test
test: $(STAMP) lint
	$(PY) -m pytest

## bench: ratios against a baseline measured in the same run
bench: $(STAMP)
	$(PY) bench/endpoints.py
	$(PY) bench/placement.py
	$(PY) bench/scan.py
	$(PY) bench/stall_sim.py
	$(PY) bench/beat_cost.py
	$(PY) bench/scale.py

## package: the deployable bundle of STAGE (default dev): build/STAGE/sam.json, deployment.zip
package: $(STAMP)
	$(PY) infra/package.py --stage $(STAGE) --out build/$(STAGE)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
