"""MASTER_PORT on the node holding rank 0 (issue 23, item 5): checked free
before any rank starts, held for the attempt, and never a rendezvous on a port
someone else holds. Real sockets hold the ports."""
from __future__ import annotations

import contextlib
import errno
import os
import socket
import subprocess
import sys

import pytest

from agent.messages import master_port
from agent.records import lines_of
from agent.rendezvous import PORT_IN_USE, PortInUse, PortReservations, ephemeral_range
from agent.shim import read_exit_file
from chalicelib.domain import wire
from tests.hostile_ranks import TEST_UID, rank_python
from tests.support import ports as os_ports

from .harness import PY, launch, message, run_until
from .test_core import phase

NODE = {"node_id": "node-1"}
# a rank that listens on MASTER_PORT as torch's TCPStore does (SO_REUSEADDR),
# says so in argv[1], then sleeps
LISTENER = (
    "import os, socket, sys, time\n"
    "s = socket.socket(socket.AF_INET6)\n"
    "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('::', int(os.environ['MASTER_PORT']))); s.listen()\n"
    "open(sys.argv[1], 'w').write('listening')\n"
    "time.sleep(30)\n")


def free_port() -> int:
    return os_ports.free_port("127.0.0.1")


def can_bind(port: int) -> bool:
    """Whether a plain bind (no SO_REUSEADDR) of ``port`` succeeds now."""
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            assert e.errno == errno.EADDRINUSE
            return False
        return True


@contextlib.contextmanager
def connection():
    """A real TCP connection on this host: the client's local port is an
    ephemeral one, held the way an outgoing connection holds it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        try:
            yield client.getsockname()[1]
        finally:
            accepted.close()
            client.close()


def test_the_port_rule_lies_below_the_ephemeral_range():
    first, _ = ephemeral_range() or (32768, 60999)
    assert wire.MASTER_PORT_MIN + wire.MASTER_PORT_SPAN - 1 < first
    ports = {master_port(f"job_{i}", a) for i in range(200) for a in (1, 2)}
    assert min(ports) >= 20000 and max(ports) <= 32767 and len(ports) > 350


def test_a_port_held_by_a_listener_starts_no_rank_and_says_why(world, tmp_path, caplog):
    """...and says it as a cause outside the job (``not_started``), naming
    who holds the port in the agent's log."""
    agent = world.agent()
    marker = tmp_path / "ran"
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        agent.handle(message(launch("job_p", ranks=[0, 1], world_size=4, master_port=port,
                                    command=[PY, "-c", f"open({str(marker)!r}, 'w')"]), 1))
        run_until(agent, lambda: phase(world, "job_p/1") == "DONE", what="job_p done")
    assert world.api.of("EXITED") == [
        {"type": "EXITED", "ranks": [0, 1], "exit_code": PORT_IN_USE,
         "not_started": "port_in_use", **NODE}]
    assert f"held by pid {os.getpid()} (" in caplog.text, caplog.text
    assert not marker.exists(), "no rank of the attempt started on this node"
    for r in (0, 1):
        err = lines_of(world.paths.log_file("job_p", 1, r).read_bytes(), "stderr")
        assert f"MASTER_PORT {port} is in use on this host" in err[0]
        assert read_exit_file(str(world.paths.exit_file("job_p", 1, r))) == PORT_IN_USE


def test_a_port_an_outgoing_connection_holds_is_in_use(world):
    """The EADDRINUSE of the issue: the port was some connection's ephemeral port."""
    agent = world.agent()
    with connection() as port:
        agent.handle(message(launch("job_c", master_port=port), 1))
        run_until(agent, lambda: world.api.of("EXITED"), what="EXITED")
    assert world.api.of("EXITED")[0]["exit_code"] == PORT_IN_USE


def test_a_free_port_is_held_for_the_attempt_and_rank_0_still_listens_on_it(world, tmp_path):
    agent = world.agent()
    port = free_port()
    ready = tmp_path / "listening"
    agent.handle(message(launch("job_f", master_port=port,
                                command=[PY, "-c", LISTENER, str(ready)]), 1))
    run_until(agent, ready.exists, what="rank 0 listening on MASTER_PORT")
    assert not can_bind(port)
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # rank 0's listener answers, not the agent's held socket
    agent.handle(message({"type": "CANCEL", "job_id": "job_f", "attempt": 1}, 2))
    run_until(agent, lambda: phase(world, "job_f/1") == "DONE", what="job_f done")
    assert can_bind(port), "released when the attempt ended here"


def test_the_port_is_held_from_the_launch_on_before_rank_0_listens(world):
    agent = world.agent()
    port = free_port()
    agent.handle(message(launch("job_h", master_port=port, command=["sleep", "30"]), 1))
    assert not can_bind(port), "nothing can take it between the check and rank 0's listen"
    # another attempt of this host with the same port is refused even though
    # nothing listens yet
    agent.handle(message(launch("job_other", master_port=port), 2))
    run_until(agent, lambda: world.api.of("EXITED", "job_other"), what="job_other EXITED")
    assert world.api.of("EXITED", "job_other")[0]["exit_code"] == PORT_IN_USE
    assert "rendezvous port of attempt job_h/1" in lines_of(world.paths.log_file(
        "job_other", 1, 0).read_bytes(), "stderr")[0]
    assert phase(world, "job_h/1") == "RUNNING"


def test_a_job_can_have_its_port_checked_but_not_held(world, tmp_path):
    """For a rank 0 that listens on MASTER_PORT without SO_REUSEADDR."""
    agent = world.agent()
    port = free_port()
    ready = tmp_path / "listening"
    plain = ("import os, socket, sys, time\n"
             "s = socket.socket(); s.bind(('0.0.0.0', int(os.environ['MASTER_PORT'])))\n"
             "s.listen(); open(sys.argv[1], 'w').write('ok'); time.sleep(30)\n")
    agent.handle(message(launch("job_nohold", master_port=port,
                                env={"GPUJOBS_HOLD_MASTER_PORT": "0"},
                                command=[PY, "-c", plain, str(ready)]), 1))
    run_until(agent, ready.exists, what="a plain listener on MASTER_PORT")
    with connection() as taken:  # still checked
        agent.handle(message(launch("job_nohold2", master_port=taken,
                                    env={"GPUJOBS_HOLD_MASTER_PORT": "0"}), 2))
        run_until(agent, lambda: world.api.of("EXITED", "job_nohold2"), what="EXITED")
    assert world.api.of("EXITED", "job_nohold2")[0]["exit_code"] == PORT_IN_USE


def test_a_node_without_rank_0_neither_checks_nor_holds_the_port(world, tmp_path):
    agent = world.agent()
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        agent.handle(message(launch("job_n", ranks=[2, 3], world_size=4, master_port=port,
                                    command=[PY, "-c", "pass"]), 1))
        run_until(agent, lambda: phase(world, "job_n/1") == "DONE", what="job_n done")
    assert sorted(r for e in world.api.of("EXITED") for r in e["ranks"]) == [2, 3]
    assert {e["exit_code"] for e in world.api.of("EXITED")} == {0}


def test_reservations_are_idempotent_per_attempt_and_released():
    ports = PortReservations(ephemeral=lambda: None)
    port = free_port()
    ports.reserve("j/1", port)
    ports.reserve("j/1", port)  # a redelivered LAUNCH
    assert ports.held() == {"j/1": port}
    with pytest.raises(PortInUse, match="rendezvous port of attempt j/1"):
        ports.reserve("k/1", port)
    ports.release("j/1")
    assert ports.held() == {} and can_bind(port)
    ports.close()


#: another tenant's process holding many ports (argv[1] of them, each bound
#: as a plain socket): prints them, then sleeps until killed
SQUATTER = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held), flush=True)
time.sleep(600)
"""


def test_a_squatter_holding_many_ports_is_named_and_the_attempt_ends_as_not_started(
        world, caplog):
    """Issue 41, item 3: a rank of another tenant binds many ports (here 200,
    as another uid when the tests run as root); the attempt whose port it
    holds starts nothing here, and the agent's report and log say why and
    who: the control plane retries it on another port, uncounted."""
    cmd = [rank_python(sys.executable), "-c", SQUATTER, "200"]
    squatter = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                user=TEST_UID if os.geteuid() == 0 else None)
    try:
        ports = [int(p) for p in squatter.stdout.readline().split()]
        assert len(ports) == 200
        agent = world.agent()
        agent.handle(message(launch("job_sq", ranks=[0, 1], world_size=2,
                                    master_port=ports[137]), 1))
        run_until(agent, lambda: world.api.of("EXITED"), what="EXITED")
        [exited] = world.api.of("EXITED")
        assert (exited["exit_code"], exited["not_started"]) == (PORT_IN_USE, "port_in_use")
        uid = TEST_UID if os.geteuid() == 0 else os.getuid()
        assert f"MASTER_PORT {ports[137]} is in use on this host" in caplog.text
        assert f"held by pid {squatter.pid} ('python" in caplog.text
        assert f", uid {uid})" in caplog.text
    finally:
        squatter.kill()
        squatter.wait(10)
