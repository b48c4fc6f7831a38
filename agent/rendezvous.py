"""The rendezvous port on the node that holds rank 0: checked free, then held.

Every node of an attempt reads the same ``MASTER_PORT`` from its LAUNCH (the
control plane draws it at random when it places the attempt,
``chalicelib/domain/wire.py`` ``new_master_port``, below Linux's ephemeral
range, so that no other tenant can tell it beforehand from the job id);
rank 0 listens on it (torch's TCPStore) and every other rank connects to it.
Only the node holding rank 0 can see whether the port is free, and it cannot
tell the other nodes about another port: a LAUNCH has no field for it and the
nodes do not talk to each other. So this node never moves the port. It makes
the port safe instead:

1. **Checked.** Before any rank of the attempt starts here, the agent binds
   the port on every address (``::``, dual-stack, or ``0.0.0.0``) with
   ``SO_REUSEADDR``, as TCPStore itself binds. That bind fails exactly when
   TCPStore's would: a listener holds the port, or a socket bound without
   ``SO_REUSEADDR`` (an outgoing connection that got it as its ephemeral
   port), but not for connections in TIME_WAIT, which TCPStore ignores too.
   Another attempt of this agent that holds the same port counts as taken
   even before its rank 0 listens.
2. **Held.** The bound socket (never listening) is kept until the attempt
   ends here. Linux never hands a bound port out as an ephemeral port, and
   binds without ``SO_REUSEADDR`` fail, so nothing can take the port between
   the check and rank 0's listen; rank 0's TCPStore, which sets
   ``SO_REUSEADDR`` and listens, binds beside the held socket (a bound
   socket that does not listen is no conflict for one that sets
   ``SO_REUSEADDR``; tests/agent/test_rendezvous.py shows it with a plain
   listener, tests/e2e/test_torch_ddp.py with torch 2.13's TCPStore). A retry
   is not needed to get the port: nobody else can have it. The one thing it
   asks of the job: whatever listens on ``MASTER_PORT`` sets
   ``SO_REUSEADDR``, as torch's TCPStore (both its backends) does. A job whose
   rank 0 runs some other server there sets ``GPUJOBS_HOLD_MASTER_PORT=0`` in
   its env: the port is then checked but let go just before the ranks start.
3. **Taken: nothing starts.** When the check fails, none of the node's ranks
   of the attempt is started (a rank 0 that cannot listen would fail anyway,
   and the other ranks would join whatever listens there, maybe another job's
   store): each is recorded as exited with :data:`PORT_IN_USE` (98, Linux's
   ``EADDRINUSE``), the reason in its ``rank-<r>.log`` (a stderr record) and
   the agent's log, which names the processes holding the port
   (:func:`holders`), and reported EXITED with ``not_started: port_in_use``:
   the control plane ends the attempt as ``port_in_use``, a cause outside the
   job, retried at once without counting by default (never counted by
   auto-cordon), and the next attempt draws another port. This is safe because every node agrees without
   talking: the port is the LAUNCH's, never one a node picked alone.

After an agent restart the held sockets are gone (the ranks keep running and
their TCPStore holds the port itself); nothing is re-reserved.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger("gpujobs.agent.rendezvous")

#: the exit code recorded for ranks not started because MASTER_PORT is in use
PORT_IN_USE = errno.EADDRINUSE
#: a job's env setting this to "0": the port is checked, not held
HOLD_PORT_ENV = "GPUJOBS_HOLD_MASTER_PORT"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class PortInUse(Exception):
    """The rendezvous port cannot be had on this host."""


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """Linux's ephemeral port range (first, last), or None where it is not readable."""
    try:
        first, last = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return first, last


def bind_reserved(port: int) -> socket.socket:
    """A socket bound to ``port`` on every address as TCPStore binds it
    (``SO_REUSEADDR``), never listening; OSError when the port is in use."""
    if socket.has_ipv6:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # both families
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("::", port))
            return s
        except OSError as e:
            s.close()
            if e.errno == errno.EADDRINUSE:
                raise
            # no IPv6 on this host: IPv4 alone, below
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
    except OSError:
        s.close()
        raise
    return s


#: the socket tables that say which socket (by inode) holds which local port
NET_TABLES = ("net/tcp", "net/tcp6")


def holders(port: int, proc: Path = Path("/proc")) -> str:
    """Who holds TCP ``port`` on this host, for the agent's log: "pid 123
    ('python3', uid 70001), ..." from the socket tables and each process's
    descriptors (root sees them all); "nobody this agent can see" else."""
    inodes = set()
    for table in NET_TABLES:
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) > 9 and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return "nobody this agent can see"
    found = []
    for pid in (e.name for e in os.scandir(proc) if e.name.isdigit()):
        try:
            fds = os.listdir(proc / pid / "fd")
            if not any(os.readlink(proc / pid / "fd" / fd) in inodes for fd in fds):
                continue
            comm = (proc / pid / "comm").read_text().strip()
            uid = (proc / pid).stat().st_uid
        except OSError:
            continue  # gone meanwhile, or not ours to read
        found.append(f"pid {pid} ({comm!r}, uid {uid})")  # a rank names its comm: quoted
    if not found:
        return "nobody this agent can see"
    return ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")


class PortReservations:
    """The rendezvous ports this agent holds, by attempt key."""

    def __init__(self, bind=bind_reserved, ephemeral=ephemeral_range) -> None:
        self._bind, self._ephemeral = bind, ephemeral
        self._held: dict[str, tuple[int, socket.socket]] = {}

    def reserve(self, key: str, port: int) -> None:
        """Check ``port`` is free here and hold it for attempt ``key``
        (idempotent); PortInUse says why not."""
        if key in self._held and self._held[key][0] == port:
            return
        for other, (held, _) in self._held.items():
            if held == port and other != key:
                raise PortInUse(f"MASTER_PORT {port} is already the rendezvous port of "
                                f"attempt {other} on this host")
        eph = self._ephemeral()
        if eph is not None and eph[0] <= port <= eph[1]:
            log.warning("%s: MASTER_PORT %s lies in this host's ephemeral port range %s-%s "
                        "(net.ipv4.ip_local_port_range): held from now on, but it may have "
                        "been taken already", key, port, *eph)
        try:
            sock = self._bind(port)
        except OSError as e:
            raise PortInUse(f"MASTER_PORT {port} is in use on this host ({e.strerror or e}; "
                            f"held by {holders(port)})") from None
        self.release(key)
        self._held[key] = (port, sock)

    def release(self, key: str) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            held[1].close()

    def held(self) -> dict[str, int]:
        return {k: port for k, (port, _) in self._held.items()}

    def close(self) -> None:
        for key in list(self._held):
            self.release(key)
