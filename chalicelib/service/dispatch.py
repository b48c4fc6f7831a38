"""Sending recorded intents to node inboxes.

An intent is durable in the outbox before it is sent, so a failed send is only
logged: the reconciler resends whatever no agent has acknowledged in time.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from ..domain.intents import Intent
from .ports import Inbox

log = logging.getLogger(__name__)
_WORKERS = 8


class Dispatcher:
    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox

    def send(self, intent: Intent, node_ids: set[str] | None = None) -> int:
        """Send to every target (or to ``node_ids`` among them); how many went out."""
        targets = [(n, u) for n, u in intent.targets.items()
                   if node_ids is None or n in node_ids]

        def one(target: tuple[str, str]) -> bool:
            node_id, url = target
            try:
                self.inbox.send(url, intent.message_for(node_id))
                return True
            except Exception:  # noqa: BLE001 - any failure leaves it to the reconciler
                log.warning("sending %s of %s to %s failed; the reconciler will resend",
                            intent.intent_id, intent.job_id, node_id, exc_info=True)
                return False

        if len(targets) <= 1:
            return sum(map(one, targets))
        with ThreadPoolExecutor(min(_WORKERS, len(targets))) as pool:
            return sum(pool.map(one, targets))
