"""A toy data-parallel job: N ranks all-reduce a vector over local TCP, in a ring,
once per step, marking each collective as they enter it. With HANG_RANK and
HANG_STEP set, that rank hangs (alive, silent) at that step *before* arriving at
the step's all-reduce; every other rank then blocks inside it. The stall scan
names the culprit by the collective it never arrived at (``health.verdict``).

    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT   set by the host agent
    HANG_RANK, HANG_STEP                         optional: who hangs, and when
    STEPS (default 100000), STEP_S (default 0.1) the loop
"""
import json
import os
import socket
import struct
import time

from gpujobs_heartbeat import beat, collective

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ADDR, PORT = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"])
HANG_RANK = int(os.environ.get("HANG_RANK", "-1"))
HANG_STEP = int(os.environ.get("HANG_STEP", "-1"))


def _lines(conn):
    return conn.makefile("r")


def rendezvous(listen_port: int) -> list[int]:
    """Every rank's listening port, gathered by rank 0 on MASTER_PORT."""
    if RANK == 0:
        srv = socket.create_server((ADDR, PORT))
        ports, conns = {0: listen_port}, []
        while len(ports) < WORLD:
            c, _ = srv.accept()
            r, p = map(int, _lines(c).readline().split())
            ports[r] = p
            conns.append(c)
        table = json.dumps([ports[r] for r in range(WORLD)]) + "\n"
        for c in conns:
            c.sendall(table.encode())
            c.close()
        srv.close()
        return [ports[r] for r in range(WORLD)]
    for _ in range(600):
        try:
            c = socket.create_connection((ADDR, PORT), timeout=60)
            break
        except OSError:
            time.sleep(0.1)
    c.sendall(f"{RANK} {listen_port}\n".encode())
    table = json.loads(_lines(c).readline())
    c.close()
    return table


def recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer gone")
        buf += chunk
    return buf


def main() -> None:
    listener = socket.create_server((ADDR, 0))
    ports = rendezvous(listener.getsockname()[1])
    # the ring: send to the next rank, receive from the previous one
    nxt = socket.create_connection((ADDR, ports[(RANK + 1) % WORLD]))
    prev, _ = listener.accept()
    value = [float(RANK)] * 4
    for step in range(int(os.environ.get("STEPS", "100000"))):
        value = [v + 1.0 for v in value]           # "compute"
        beat(step)
        if RANK == HANG_RANK and step == HANG_STEP:
            time.sleep(3600)                       # the culprit: alive, never arrives
        with collective("allreduce", seq=step):
            total, carry = list(value), list(value)
            for _ in range(WORLD - 1):             # pass partial sums round the ring
                nxt.sendall(struct.pack("4d", *carry))
                carry = list(struct.unpack("4d", recv_exact(prev, 32)))
                total = [a + b for a, b in zip(total, carry)]
            value = [t / WORLD for t in total]
        time.sleep(float(os.environ.get("STEP_S", "0.1")))


if __name__ == "__main__":
    main()
