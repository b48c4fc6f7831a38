"""Only the local stack's owner reaches its moto (issue 24, item 1).

moto checks no credentials: any process that finds its port (a port scan
does) could read every table (every job's ``env``), rewrite any job, or wipe
everything with ``POST /moto-api/reset``. Ranks run on the same host. So the
stack's moto answers a connection only when the socket that opened it
belongs to the stack's own user (or root): the kernel says whose a local TCP
socket is (the uid of the process that made it, which ``ss -e`` and
``/proc/net/tcp`` show; asked here with one sock_diag query for that socket),
and a rank runs as a uid of its own (agent/isolation.py). Its request is
refused with a 403 before moto sees it, whatever credentials it signs with.

Why not a key of the stack's own, checked on every request's signature: a
process that could not be refused by its uid runs as the stack's user, and
reads any key file the stack does. The uid is the wall; it also keeps moto's
usual contract for the owner's own tools (an outside program acting as the
agents signs with any key, ../shared/API.md).

Checked once per connection: werkzeug's server closes each after its answer,
so once per request, at the cost of one sock_diag query whatever the
host's socket count (reading ``/proc/net/tcp`` cost 7 ms a request with the
3,000 sockets a busy stack leaves in TIME_WAIT).
"""
from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
from typing import Iterable

#: the WSGI environ key the request handler sets: the peer socket's owner
PEER_UID = "gpujobs.peer_uid"


#: linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLMSG_ERROR = 4, 20, 1, 2
#: a request naming one socket by its addresses: header, then inet_diag_req_v2
_REQUEST = struct.Struct("=IHHII" "BBBBI" "2s2s16s16s" "III")  # ports and addresses big-endian
_NOCOOKIE = 0xFFFFFFFF
#: where inet_diag_msg's idiag_state and idiag_uid sit in an answer (after
#: its 16-byte header)
_STATE_AT, _UID_AT = 16 + 1, 16 + 4 + 48 + 12
#: a connected socket (linux/tcp_states.h): a closed one in TIME_WAIT (or an
#: orphan in FIN_WAIT2, kept as one) has no owner left and reads as uid 0
TCP_ESTABLISHED = 1


def _diag_request(family: int, local: tuple[str, int], remote: tuple[str, int]) -> bytes:
    def packed(ip: str) -> bytes:
        if family == socket.AF_INET:
            return ipaddress.IPv4Address(ip).packed.ljust(16, b"\0")
        return (ipaddress.IPv6Address(ip) if ":" in ip else
                ipaddress.IPv6Address(f"::ffff:{ip}")).packed
    return _REQUEST.pack(_REQUEST.size, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0,
                         family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF,  # any state
                         local[1].to_bytes(2, "big"), remote[1].to_bytes(2, "big"),
                         packed(local[0]), packed(remote[0]),
                         0, _NOCOOKIE, _NOCOOKIE)


def socket_owner(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid owning the connected TCP socket bound at ``local`` and
    connected to ``remote``, or None when there is none (not on this host,
    or closed meanwhile: a client that sent its request and closed at once
    leaves a socket the kernel names as uid 0, root's, which must not pass).
    One sock_diag query for that one socket, as ``ss`` asks the kernel: its
    cost does not grow with the host's sockets (reading /proc/net/tcp did,
    7 ms a request with 3,000 sockets in TIME_WAIT)."""
    families = [socket.AF_INET6] if ":" in local[0] else [socket.AF_INET, socket.AF_INET6]
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        for family in families:  # an IPv4 peer may hold an IPv6 socket (v4-mapped)
            nl.send(_diag_request(family, local, remote))
            answer = nl.recv(4096)
            kind = struct.unpack_from("=H", answer, 4)[0]
            if kind == NLMSG_ERROR:  # no such socket (ENOENT) in this family
                continue
            if kind == SOCK_DIAG_BY_FAMILY and len(answer) >= _UID_AT + 4:
                if answer[_STATE_AT] != TCP_ESTABLISHED:
                    return None
                return struct.unpack_from("=I", answer, _UID_AT)[0]
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
