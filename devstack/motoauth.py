"""Only the local stack's owner reaches its moto (issue 24, item 1).

moto checks no credentials: any process that finds its port (a port scan
does) could read every table (every job's ``env``), rewrite any job, or wipe
everything with ``POST /moto-api/reset``. Ranks run on the same host. So the
stack's moto answers a connection only when the socket that opened it
belongs to the stack's own user (or root): the kernel says whose a local TCP
socket is (``/proc/net/tcp``'s ``uid`` column, the uid of the process that
made it), and a rank runs as a uid of its own (agent/isolation.py). Its
request is refused with a 403 before moto sees it, whatever credentials it
signs with.

Why not a key of the stack's own, checked on every request's signature: a
process that could not be refused by its uid runs as the stack's user, and
reads any key file the stack does. The uid is the wall; it also keeps moto's
usual contract for the owner's own tools (an outside program acting as the
agents signs with any key, ../shared/API.md).

Checked once per connection (botocore keeps its connections open): one read
of ``/proc/net/tcp``, a few ms with thousands of sockets.
"""
from __future__ import annotations

import ipaddress
import json
import os
from typing import Iterable

#: the WSGI environ key the request handler sets: the peer socket's owner
PEER_UID = "gpujobs.peer_uid"


def _hex4(ip: str, port: int) -> str:
    """An IPv4 endpoint as /proc/net/tcp writes it (the address in host byte
    order, as the kernel prints the 32-bit word)."""
    return f"{int.from_bytes(ipaddress.IPv4Address(ip).packed, 'little'):08X}:{port:04X}"


def _hex6(ip: str, port: int) -> str:
    raw = ipaddress.IPv6Address(ip).packed if ":" in ip else (
        ipaddress.IPv6Address(f"::ffff:{ip}").packed)
    words = (int.from_bytes(raw[i:i + 4], "little") for i in range(0, 16, 4))
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def socket_owner(local: tuple[str, int], remote: tuple[str, int],
                 proc_net: str = "/proc/net") -> int | None:
    """The uid owning the TCP socket bound at ``local`` and connected to
    ``remote`` (as ``/proc/net/tcp`` and ``tcp6`` list it), or None when it
    is not there (closed meanwhile, or not on this host)."""
    for table, encode in (("tcp", _hex4), ("tcp6", _hex6)):
        if table == "tcp" and ":" in local[0]:
            continue
        try:
            with open(os.path.join(proc_net, table)) as f:
                text = f.read()
        except OSError:
            continue
        needle = f" {encode(*local)} {encode(*remote)} "
        at = text.find(needle)
        if at < 0:
            continue
        # sl local rem st tx:rx tr:when retrnsmt uid ...
        line = text[text.rfind("\n", 0, at) + 1:text.find("\n", at)].split()
        return int(line[7])
    return None


def owners(uid: int | None = None) -> frozenset[int]:
    """Whose sockets the stack's moto answers: its own user's, and root's."""
    return frozenset({os.geteuid() if uid is None else uid, 0})


class OwnerOnly:
    """WSGI middleware: passes on only requests whose connection's socket
    belongs to one of ``allowed`` (the handler sets :data:`PEER_UID`)."""

    def __init__(self, app, allowed: frozenset[int]) -> None:
        self._app, self.allowed = app, allowed

    def __call__(self, environ, start_response) -> Iterable[bytes]:
        uid = environ.get(PEER_UID)
        if uid in self.allowed:
            return self._app(environ, start_response)
        who = "an unknown user" if uid is None else f"uid {uid}"
        body = json.dumps({
            "__type": "com.amazon.coral.service#AccessDeniedException",
            "message": f"the local stack's AWS answers only its owner's processes, not "
                       f"{who}'s"}).encode()
        start_response("403 Forbidden", [("Content-Type", "application/x-amz-json-1.0"),
                                         ("Content-Length", str(len(body)))])
        return [body]
