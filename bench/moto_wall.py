"""What the local stack's moto wall costs a request: walled against open.

The stack's moto answers only its owner's processes (devstack/motoauth.py),
and werkzeug's server closes every connection after its answer, so the owner
is looked up once a request. A busy stack leaves thousands of sockets in
TIME_WAIT; the lookup must not grow with them. This bench first leaves
``--sockets`` of them (connections to a local listener, opened and closed),
then times UpdateItems (a heartbeat-like item: a map of 8 ranks' records)
through boto3 against two embedded moto servers of devstack/motoserver.py, one
walled (``owners``), one open, in interleaved rounds. Ends with ``moto-wall-bench:
sockets=.. us_lookup=.. ms_open=.. ms_walled=.. ratio=..`` (medians;
``--quick`` makes fewer sockets and requests). With the wall reading
/proc/net/tcp, as it first did, the ratio was 3.96 at 3,901 sockets (an
11.3 ms lookup); docs/benchmarks.md has the runs.
"""
from __future__ import annotations

import pathlib
import socket
import statistics
import sys
import time

import _quiet  # noqa: F401 - first: no INFO logs unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

TABLE = "moto-wall"


def leave_time_waits(count: int) -> int:
    """Open and close ``count`` connections (the side that closes first keeps
    a socket in TIME_WAIT); returns how many the host now has."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        where = listener.getsockname()
        for _ in range(count):
            c = socket.create_connection(where)
            listener.accept()[0].close()
            c.close()
    return sum(1 for line in open("/proc/net/tcp") if line.split()[3:4] == ["06"])


def client(server):
    import boto3

    return boto3.client("dynamodb", endpoint_url=server.endpoint_url, region_name="us-east-1",
                        aws_access_key_id="bench", aws_secret_access_key="bench")


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--sockets", type=int)
    args = p.parse_args()
    sockets = harness.pick(args.sockets, 3000, 500, args.quick)
    n, rounds = (10, 1) if args.quick else (200, 7)
    harness.banner("moto wall", "server")
    from devstack.motoauth import owners, socket_owner
    from devstack.motoserver import MotoServer

    time_waits = leave_time_waits(sockets)
    # the open server first: both serve one process's shared moto backends
    servers = {"open": MotoServer().start(), "walled": MotoServer(owners=owners()).start()}
    try:
        clients = {name: client(s) for name, s in servers.items()}
        clients["open"].create_table(
            TableName=TABLE, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}])
        ranks = {"M": {str(r): {"M": {"s": {"N": "5"}, "h": {"S": "2026-01-01T00:00:00.000Z"}}}
                       for r in range(8)}}

        def requests(c) -> float:
            began = time.perf_counter()
            for i in range(n):
                c.update_item(TableName=TABLE, Key={"k": {"S": str(i)}},
                              UpdateExpression="SET #r = :r", ExpressionAttributeNames={"#r": "ranks"},
                              ExpressionAttributeValues={":r": ranks})
            return (time.perf_counter() - began) / n * 1000

        for c in clients.values():  # warm: clients, connections, the table's items
            requests(c)
        ms: dict[str, list[float]] = {"open": [], "walled": []}
        for _ in range(rounds):
            for name in ms:
                ms[name].append(requests(clients[name]))
        with socket.create_server(("127.0.0.1", 0)) as listener, \
                socket.create_connection(listener.getsockname()) as c:
            began = time.perf_counter()
            for _ in range(1000):
                if socket_owner(c.getsockname(), listener.getsockname()) is None:
                    raise harness.Fail("the wall did not find a socket of this process")
            lookup_us = (time.perf_counter() - began) / 1000 * 1e6
    finally:
        for s in servers.values():
            s.stop()
    ratio = harness.median_ratio(ms["walled"], ms["open"])
    print(f"{time_waits} sockets in TIME_WAIT; one UpdateItem (medians of {rounds} x {n}): "
          f"open {statistics.median(ms['open']):.2f} ms, walled "
          f"{statistics.median(ms['walled']):.2f} ms, ratio {ratio:.2f} (the wall's lookup "
          f"{lookup_us:.1f} us)")
    harness.machine_line("moto-wall", sockets=time_waits, us_lookup=f"{lookup_us:.1f}",
                         ms_open=f"{statistics.median(ms['open']):.2f}",
                         ms_walled=f"{statistics.median(ms['walled']):.2f}", ratio=f"{ratio:.2f}")


if __name__ == "__main__":
    main()
