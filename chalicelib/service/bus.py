"""The bus of domain events (domain/happened.py): each event type's handlers,
subscribed once in bootstrap, run in order when a service publishes one.

In process and synchronous, as the services of one function run: a handler
runs before ``publish`` returns, and its failure reaches the publisher as a
dependency's failure does (a 503 on a request: the caller retries, and the
transition already written makes the retry find it done). A follow-up that
must not fail what published it is subscribed ``second``: its failure is
logged, and its sweep makes it up.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Protocol, TypeVar

log = logging.getLogger(__name__)

E = TypeVar("E")


class Publish(Protocol):
    """What a service is given to tell what happened."""
    def __call__(self, event: Any) -> None: ...


def nowhere(event: Any) -> None:
    """Publish to no one (a service built alone, in a test)."""


class Bus:
    def __init__(self) -> None:
        self._handlers: dict[type, list[tuple[Callable[[Any], object], bool]]] = {}

    def subscribe(self, kind: type[E], handler: Callable[[E], object], *,
                  second: bool = False) -> None:
        """``handler`` runs for each event of type ``kind``; ``second``: its
        failure is logged and does not reach the publisher."""
        self._handlers.setdefault(kind, []).append((handler, second))

    def publish(self, event: Any) -> None:
        for handler, second in self._handlers.get(type(event), ()):
            if not second:
                handler(event)
                continue
            try:
                handler(event)
            except Exception:  # noqa: BLE001 - the transition is written; its sweep follows up
                log.exception("a handler of %s failed; its sweep follows up",
                              type(event).__name__)
