"""The local stack for the end-to-end tests: started by tests/conftest.py once
per session and stopped by its own process id, also when a test fails. How it
is started is devstack/stack.py's (bench/ starts it the same way)."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterable, Iterator

from devstack.stack import READY, ROOT, Api, Stack, launch, start_stack

__all__ = ["READY", "ROOT", "TOKENS", "Api", "Stack", "borrowed", "launch", "running",
           "start_stack"]

#: the nodes whose real agents the end-to-end modules start on the shared
#: stack (tests/support/agents.py), each with its agent token e2e-<node>-agent
MODULE_NODES = ("follow-1", "follow-2",                 # tests/e2e/test_logs_follow.py
                "drain-1", "drain-2", "flaky-1",        # tests/e2e/test_drain.py
                "life-1", "life-2",                     # tests/e2e/test_lifecycle.py
                "prio-1",                               # tests/e2e/test_preemption.py
                "lost-1",                               # tests/e2e/test_node_loss.py
                "flood-1",                              # tests/e2e/test_flood.py
                "usage-1")                              # tests/e2e/test_usage_rows.py
OPERATOR = "e2e-ops"
TOKENS = [{"token": "e2e-tenant", "tenant": "e2e"},
          {"token": "e2e-other", "tenant": "e2e-other"},
          {"token": "e2e-race", "tenant": "e2e-race"},
          {"token": "e2e-pipelines", "tenant": "e2e-pipelines"},
          {"token": "e2e-usage", "tenant": "e2e-usage"},       # tests/e2e/test_usage_rows.py
          {"token": "e2e-agent", "agent": "node-1"},
          *({"token": f"e2e-{node}-agent", "agent": node} for node in MODULE_NODES),
          {"token": OPERATOR, "operator": OPERATOR},
          # tests/e2e/test_drain.py's on-call operator, named in its cordons
          {"token": "e2e-operator", "operator": "ops-oncall"}]


@contextlib.contextmanager
def running(folder: Path, tokens: list[dict] = TOKENS, **env: str) -> Iterator[Stack]:
    """A throwaway stack (devstack/stack.py start_stack) for a fixture's
    scope, stopped by its own process id at the end, also when a test fails."""
    s = start_stack(folder, tokens, **env)
    try:
        yield s
    finally:
        s.stop()


@contextlib.contextmanager
def borrowed(stack: Stack, nodes: Iterable[str] = (), **settings: str) -> Iterator[Stack]:
    """The worker's shared stack for one test module: with ``settings``
    (devstack/settings.py) while the module runs, its own again after. The
    module's nodes, whose agents stop with it, are cordoned when it ends, so
    that no later module's job is placed on a node nobody runs."""
    try:
        with stack.settings(**settings):
            yield stack
    finally:
        ops = Api(stack.api, OPERATOR)
        for node in nodes:
            r = ops.post(f"/v1/nodes/{node}/cordon", json={"reason": "its test module ended"})
            assert r.status_code in (200, 404), r.text  # 404: it never registered
