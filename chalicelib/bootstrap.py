"""Wires adapters into services, once per process, on first use.

Nothing here runs at import time: a Lambda cold start pays for it on the first
request, and tests can bind their own configuration (or fakes) first.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from .adapters import models
from .adapters.inbox import SqsInbox
from .adapters.job_store import DynamoJobStore
from .adapters.tokens import TokenStore
from .config import Config
from .service.auth import Authenticator
from .service.jobs import JobsService
from .service.ports import JobStore


@dataclass
class Services:
    config: Config
    store: JobStore
    jobs: JobsService
    auth: Authenticator


_lock = threading.Lock()
_services: Services | None = None


def build(config: Config, *, inbox=None, store: JobStore | None = None,
          tokens: TokenStore | None = None) -> Services:
    connection = models.bind(config)
    store = store or DynamoJobStore(connection)
    inbox = inbox or SqsInbox(config)
    if tokens is None:
        tokens = TokenStore.from_file(config.tokens_file) if config.tokens_file \
            else TokenStore({})
    jobs = JobsService(store, inbox, page_token_key=config.page_token_key,
                       scans_per_hour=config.scans_per_hour,
                       cancel_resend_after_s=config.cancel_resend_after_s)
    return Services(config, store, jobs, Authenticator(tokens))


def services() -> Services:
    global _services
    if _services is None:
        with _lock:
            if _services is None:
                _services = build(Config.from_env())
    return _services


def install(s: Services | None) -> None:
    """Use these services from now on (tests, the local stack); None rebuilds lazily."""
    global _services
    with _lock:
        _services = s
