"""Invariant (issue 24, item 1): the local stack's moto answers only its
owner's processes. A connection from a socket of another uid (a rank's,
which found the port by a scan) is refused with a 403 that says whose it
was, whatever key it signs with, and on moto's own ``/moto-api/reset``;
nothing it sends changes anything. The owner's clients (DynamoDB, SQS,
CloudWatch Logs, as the API and the agents call them, with any key as moto's
clients do) work as before. On a moto server of the module's own, wrapped as
devstack/__main__.py wraps the stack's; the other uid is a real process that
dropped to ``nobody``'s uid, so this takes root, as CI runs."""
from __future__ import annotations

import json
import os
import socket
import subprocess

import boto3
import pytest

from devstack.motoauth import OwnerOnly, owners, socket_owner
from devstack.motoserver import MotoServer

TABLE = "motoauth-t"
OTHER_UID = 65534  # nobody

#: run as OTHER_UID by /usr/bin/python3 (stdlib only): what moto answers it
INTRUDER = r"""
import json, sys, urllib.error, urllib.request
endpoint = sys.argv[1]
def post(path, headers):
    req = urllib.request.Request(endpoint + path, data=b"{}", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
fake = ("AWS4-HMAC-SHA256 Credential=testing/20261202/us-east-1/dynamodb/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64)
print(json.dumps({
    "reset": post("/moto-api/reset", {}),
    "put": post("/", {"X-Amz-Target": "DynamoDB_20120810.DeleteTable", "Authorization": fake,
                      "Content-Type": "application/x-amz-json-1.0"}),
}))
"""


@pytest.fixture(scope="module")
def server():
    s = MotoServer(owners=owners()).start()
    try:
        client(s).create_table(
            TableName=TABLE, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}])
        yield s
    finally:
        s.stop()


def client(server, service: str = "dynamodb"):
    return boto3.client(service, endpoint_url=server.endpoint_url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def test_the_kernel_names_a_local_socket_s_owner():
    listener = socket.create_server(("127.0.0.1", 0))
    where = listener.getsockname()
    with listener, socket.create_connection(where) as c:
        accepted, _ = listener.accept()
        with accepted:
            assert socket_owner(c.getsockname(), where) == os.geteuid()
            assert socket_owner(where, c.getsockname()) == os.geteuid()
        assert socket_owner(("127.0.0.1", 1), where) is None, "no such socket"


def test_the_kernel_names_the_owner_of_ipv6_and_v4_mapped_sockets():
    """A server listening on IPv6 holds an IPv4 client's connection as a
    v4-mapped IPv6 socket: both ends, and a plain IPv6 connection, are found."""
    listener = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    port = listener.getsockname()[1]
    with listener, socket.create_connection(("127.0.0.1", port)) as v4, \
            socket.create_connection(("::1", port)) as v6:
        accepted = [listener.accept()[0] for _ in range(2)]
        try:
            assert socket_owner(v4.getsockname()[:2], ("127.0.0.1", port)) == os.geteuid()
            assert socket_owner(("127.0.0.1", port), v4.getsockname()[:2]) == os.geteuid(), \
                "the server's end, a v4-mapped IPv6 socket"
            assert socket_owner(v6.getsockname()[:2], ("::1", port)) == os.geteuid()
            assert socket_owner(("::1", 1), ("::1", port)) is None, "no such socket"
        finally:
            for a in accepted:
                a.close()


def test_a_socket_closed_after_its_request_has_no_owner_not_root():
    """Invariant: another uid's client that sends its request and closes at
    once leaves a socket the kernel lists as uid 0 (TIME_WAIT keeps no
    owner); looked up after that, it is no one's, never root's, so the
    request it left behind is refused."""
    if os.geteuid() != 0:
        pytest.skip("a process of another uid takes root to start")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        where = listener.getsockname()
        code = (f"import socket, sys; c = socket.create_connection({where!r}); "
                "print(c.getsockname()[1], flush=True); sys.stdin.readline(); "
                "c.sendall(b'POST /moto-api/reset'); c.close()")
        proc = subprocess.Popen(["/usr/bin/python3", "-I", "-c", code], user=OTHER_UID,
                                group=OTHER_UID, extra_groups=[], cwd="/", text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            client = ("127.0.0.1", int(proc.stdout.readline()))
            accepted, _ = listener.accept()
            with accepted:
                assert socket_owner(client, where) == OTHER_UID, "while it is connected"
                proc.communicate("go\n", timeout=30)
                while accepted.recv(64):  # its request, then its close (EOF)
                    pass
                assert socket_owner(client, where) is None
        finally:
            proc.kill()
            proc.wait()


def test_the_owner_s_own_clients_are_answered(server):
    """DynamoDB, SQS (a queue URL with a path) and CloudWatch Logs."""
    client(server).put_item(TableName=TABLE, Item={"k": {"S": "own"}})
    assert client(server).get_item(TableName=TABLE, Key={"k": {"S": "own"}})["Item"]
    sqs = client(server, "sqs")
    url = sqs.create_queue(QueueName="motoauth-q")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "hello"
    logs = client(server, "logs")
    logs.create_log_group(logGroupName="motoauth-g")
    # moto's backends are the process's: the session's other servers' groups show too
    assert "motoauth-g" in [g["logGroupName"] for g in logs.describe_log_groups()["logGroups"]]


def test_another_uid_s_process_is_refused_and_changes_nothing(server):
    if os.geteuid() != 0:
        pytest.skip("a process of another uid takes root to start")
    r = subprocess.run(["/usr/bin/python3", "-I", "-c", INTRUDER, server.endpoint_url],
                       capture_output=True, text=True, timeout=60, user=OTHER_UID,
                       group=OTHER_UID, extra_groups=[], cwd="/")
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    for what in ("reset", "put"):
        status, body = seen[what]
        assert status == 403, (what, status, body)
        assert json.loads(body)["message"] == (
            f"the local stack's AWS answers only its owner's processes, not uid {OTHER_UID}'s")
    assert TABLE in client(server).list_tables()["TableNames"], "neither reset nor deleted"


def test_a_connection_whose_owner_is_unknown_is_refused():
    """The middleware alone: no uid (the socket was gone when looked up) is
    not the owner."""
    reached: list[int] = []
    app = OwnerOnly(lambda environ, start: reached.append(1) or [b"moto"], owners())
    statuses: list[str] = []
    body = b"".join(app({}, lambda status, headers: statuses.append(status)))
    assert statuses == ["403 Forbidden"] and not reached
    assert b"not an unknown user's" in body
    assert b"".join(app({"gpujobs.peer_uid": os.geteuid()}, lambda s, h: None)) == b"moto"
