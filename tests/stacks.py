"""The local stack for the end-to-end tests: started by tests/conftest.py once
per session and stopped by its own process id, also when a test fails. How it
is started is devstack/stack.py's (bench/ starts it the same way)."""
from __future__ import annotations

from devstack.stack import READY, ROOT, Api, Stack, launch, start_stack

__all__ = ["READY", "ROOT", "TOKENS", "Api", "Stack", "launch", "start_stack"]

TOKENS = [{"token": "e2e-tenant", "tenant": "e2e"},
          {"token": "e2e-other", "tenant": "e2e-other"},
          {"token": "e2e-race", "tenant": "e2e-race"},
          {"token": "e2e-pipelines", "tenant": "e2e-pipelines"},
          {"token": "e2e-agent", "agent": "node-1"},
          # tests/e2e/test_logs_follow.py's two agents
          {"token": "e2e-follow-1-agent", "agent": "follow-1"},
          {"token": "e2e-follow-2-agent", "agent": "follow-2"},
          {"token": "e2e-ops", "operator": "e2e-ops"}]
