"""The local stack's state on disk: moto's DynamoDB, SQS and CloudWatch Logs
backends (jobs, queues, the ranks' log lines), pickled whole into the state
folder at most once a second after anything changed, and on a clean stop;
restored over the freshly deployed stack on start. The snapshot holds every
job's ``env`` and every log line: it is written readable by its owner only.

A snapshot is taken with DynamoDB writes held back (the emulator's write
lock), so it never holds half a transaction; it is written to a temporary
file in the same folder and renamed, so a crash leaves the previous one whole.
A ``kill -9`` loses at most the last second.
"""
from __future__ import annotations

import copyreg
import logging
import os
import pathlib
import pickle
import threading

log = logging.getLogger("devstack")
SERVICES = ("dynamodb", "sqs", "logs")  # the backends _backends() snapshots
FILE = "moto-state.pickle"



def new_lock(reentrant: bool):
    return threading.RLock() if reentrant else threading.Lock()


# moto's SQS and CloudFormation models hold locks: a restored one gets a new lock
copyreg.pickle(type(threading.Lock()), lambda lock: (new_lock, (False,)))
copyreg.pickle(type(threading.RLock()), lambda lock: (new_lock, (True,)))


def _backends():
    from moto.backends import get_backend

    return {"dynamodb": get_backend("dynamodb"), "sqs": get_backend("sqs"),
            "logs": get_backend("logs")}


class Snapshots(threading.Thread):
    def __init__(self, folder: pathlib.Path, lock, period_s: float = 1.0) -> None:
        super().__init__(name="snapshots", daemon=True)
        self.path = folder / FILE
        self._lock, self._period = lock, period_s
        self._dirty = threading.Event()
        self._halt = threading.Event()

    def changed(self) -> None:
        self._dirty.set()

    def restore(self) -> bool:
        """Put the saved state into the running moto; False if there was none."""
        if not self.path.exists():
            return False
        with open(self.path, "rb") as f:
            saved = pickle.load(f)
        live = _backends()
        for name, backends in saved.items():
            for account, regions in backends.items():
                for region, backend in regions.items():
                    live[name][account][region].__dict__.update(backend.__dict__)
        return True

    def save(self) -> None:
        self._dirty.clear()
        self._lock.acquire_write()
        try:
            for _ in range(5):  # an SQS queue changing under pickle: take it again
                try:
                    data = pickle.dumps({n: {a: dict(r) for a, r in b.items()}
                                         for n, b in _backends().items()},
                                        protocol=pickle.HIGHEST_PROTOCOL)
                    break
                except RuntimeError:
                    continue
            else:
                self._dirty.set()
                return
        finally:
            self._lock.release_write()
        tmp = self.path.with_suffix(".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # also a temporary file an older stack left
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def run(self) -> None:
        while not self._halt.wait(self._period):
            if self._dirty.is_set():
                try:
                    self.save()
                except Exception:  # noqa: BLE001 - keep snapshotting; say what broke
                    log.exception("snapshot of the local stack failed")

    def stop(self) -> None:
        self._halt.set()
        self.save()
