"""`gpujobs logs`, `describe` and pending reasons, against the fake server:
rank prefixes when ranks interleave, stderr kept on stderr, --tail, --follow
until the job ends (each line once), and the SDK's iterator underneath."""
from __future__ import annotations

import itertools
import json

from gpujobs_client import Client

_ids = itertools.count(1)


def line(rank, text, t, stream="stdout", attempt=1, seq=None):
    return {"rank": rank, "stream": stream, "time": t, "line": text, "seq": seq,
            "id": f"e{next(_ids)}", "attempt": attempt}


def running_job(fake, ranks=2):
    job = fake.add_job(ranks=ranks)
    fake.place(job["id"], ["n1"])
    return job


def test_logs_interleave_ranks_with_prefixes_and_keep_stderr_apart(run, fake):
    job = running_job(fake)
    fake.logs[job["id"]] = [line(0, "hello 0", "2030-01-01T00:00:00.000Z"),
                            line(1, "oops", "2030-01-01T00:00:00.001Z", "stderr"),
                            line(1, "hello 1", "2030-01-01T00:00:00.002Z")]
    r = run("logs", job["id"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == ["[rank 0] hello 0", "[rank 1] hello 1"]
    assert r.stderr.splitlines() == ["[rank 1] oops"]
    one = run("logs", job["id"], "--rank", "1")
    assert one.stdout.splitlines() == ["hello 1"], "one rank: no prefix"
    assert fake.sent("GET", f"/v1/jobs/{job['id']}/logs")[-1].query["rank"] == ["1"]
    assert run("logs", job["id"], "--rank", "1", "--all-ranks").exit_code == 2


def test_tail_and_json_lines(run, fake):
    job = running_job(fake, ranks=1)
    fake.logs[job["id"]] = [line(0, f"l{i}", f"2030-01-01T00:00:0{i}.000Z", seq=3 * i)
                            for i in range(5)]
    assert run("logs", job["id"], "--tail", "2").stdout.splitlines() == ["[rank 0] l3",
                                                                        "[rank 0] l4"]
    r = run("-o", "json", "logs", job["id"], "--tail", "1")
    assert [(json.loads(x)["line"], json.loads(x)["seq"]) for x in r.stdout.splitlines()] \
        == [("l4", 12)]


def test_tail_asks_the_server_for_the_newest_lines_of_every_rank(run, fake):
    """Invariant: `logs --tail N` prints the newest N lines of the ranks
    together, in time order (a rank that wrote long ago where it belongs),
    as the server's tail answers: the server is asked for N lines, not the
    whole log read and cut here."""
    job = running_job(fake, ranks=2)
    fake.logs[job["id"]] = (
        [line(0, "rank 0 early", "2030-01-01T00:00:00.000Z", seq=0),
         line(0, "rank 0 last", "2030-01-01T00:10:00.000Z", seq=13)]
        + [line(1, f"rank 1 step {i}", f"2030-01-01T00:{i // 60:02d}:{i % 60:02d}.500Z",
                seq=20 * i) for i in range(900)])
    r = run("logs", job["id"], "--tail", "4")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        "[rank 1] rank 1 step 896", "[rank 1] rank 1 step 897", "[rank 1] rank 1 step 898",
        "[rank 1] rank 1 step 899"]
    asked = fake.sent("GET", f"/v1/jobs/{job['id']}/logs")
    assert [q.query.get("tail") for q in asked] == [["4"]] and fake.logs_served == 4
    r = run("logs", job["id"], "--tail", "302")
    out = r.stdout.splitlines()
    assert len(out) == 302 and out[:3] == ["[rank 1] rank 1 step 599", "[rank 0] rank 0 last",
                                           "[rank 1] rank 1 step 600"]
    assert run("logs", job["id"], "--tail", "10001").exit_code == 2


def test_follow_with_tail_continues_after_the_tail(run, fake):
    """Invariant: `logs -f --tail N` prints the newest N lines, then each new
    line once (the server's tail, then polls), and returns once the job ends."""
    job = running_job(fake, ranks=2)
    lines = fake.logs[job["id"]] = [line(r, f"old {r}.{i}", f"2030-01-01T00:00:0{i}.00{r}Z",
                                         seq=i) for i in range(5) for r in range(2)]
    gets = []

    def on_get(_):
        gets.append(1)
        if len(gets) == 2:
            lines.append(line(1, "new 1", "2030-01-01T00:00:09.000Z", seq=9))
            lines.append(line(0, "late 0", "2030-01-01T00:00:05.000Z", seq=5))
        if len(gets) == 3:
            fake.update_job(job["id"], state="SUCCEEDED")
            lines.append(line(0, "last 0", "2030-01-01T00:00:09.500Z", seq=6))

    fake.on_get_job.append(on_get)
    r = run("logs", job["id"], "-f", "--tail", "3", "--interval", "0")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == ["[rank 1] old 1.3", "[rank 0] old 0.4", "[rank 1] old 1.4",
                                     "[rank 0] late 0", "[rank 1] new 1", "[rank 0] last 0"]


def test_follow_prints_each_line_once_until_the_job_ends(fake):
    job = running_job(fake, ranks=1)
    lines = fake.logs[job["id"]] = [line(0, "a", "2030-01-01T00:00:00.000Z"),
                                    line(0, "b", "2030-01-01T00:00:00.000Z")]
    polls = []

    def sleep(_):
        polls.append(1)
        if len(polls) == 1:
            lines.append(line(0, "c", "2030-01-01T00:00:00.000Z"))  # same ms as before
            lines.append(line(0, "d", "2030-01-01T00:00:01.000Z"))
        if len(polls) == 2:
            fake.update_job(job["id"], state="SUCCEEDED")
            lines.append(line(0, "e", "2030-01-01T00:00:02.000Z"))

    with Client(fake.url, "t1") as c:
        got = [x.line for x in c.iter_logs(job["id"], follow=True, interval_s=0,
                                           sleep=sleep)]
    assert got == ["a", "b", "c", "d", "e"]


def test_describe_shows_attempts_health_and_the_story(run, fake):
    job = running_job(fake)
    fake.events[job["id"]] = [
        {"type": "created", "time": "2030-01-01T00:00:00.000Z", "attempt": None,
         "reason": "submitted"},
        {"type": "placed", "time": "2030-01-01T00:00:01.000Z", "attempt": 1,
         "reason": "placed on 1 node", "nodes": {"n1": "0-1"}}]
    r = run("describe", job["id"])
    assert r.exit_code == 0, r.output
    for text in ("attempts", "n1: 0-1", "events", "created", "placed on 1 node"):
        assert text in r.stdout, text
    r = run("-o", "json", "describe", job["id"])
    body = json.loads(r.stdout)
    assert [e["type"] for e in body["events"]] == ["created", "placed"]
    assert body["job"]["id"] == job["id"] and len(body["attempts"]) == 1


def test_describe_health_starts_with_the_verdict_and_labels_the_rank_silent_longest(run, fake):
    """Invariant: describe's health says the verdict first (text, then stack,
    then how it was reached), then the incident; first_stalled_rank appears
    only as the silence order, labelled evidence, never as the rank that
    stopped."""
    from .test_cli import COLLECTIVE
    job = running_job(fake, ranks=4)
    fake.update_job(job["id"], health={"status": "STALLED", "first_stalled_rank": 2,
                                       "detected_at": fake.now(), "stalled_ranks": [0, 1, 2],
                                       "verdict": COLLECTIVE})
    lines = [ln.strip() for ln in run("describe", job["id"]).stdout.splitlines()]
    at = lines.index("health    STALLED  threshold 30.0s")
    assert lines[at + 1:at + 6] == [
        f"Verdict: {COLLECTIVE['text']}", "Stack: train.py:88 in forward → time.sleep(3600)",
        "by collective, confidence certain",
        "stall detected 2025-01-31 12:00:00Z; stalled ranks: 0-2",
        "silence order (evidence, not the verdict): rank 2 silent longest (last heard never)"]
    assert "first stalled" not in " ".join(lines).lower()


def test_describe_prints_the_stop_time_stacks_under_their_rank_stopped_event(run, fake):
    """Invariant: each entry of a rank_stopped event's stacks is one indented
    line right under that event: "rank N: <where>"."""
    job = running_job(fake, ranks=4)
    where = "train.py:88 in forward → time.sleep(3600)"
    fake.events[job["id"]] = [
        {"type": "stalled", "time": "2030-01-01T00:00:05.000Z", "attempt": 1,
         "reason": "rank 3 on n1 is not in a collective", "rank": 3, "ranks": [3]},
        {"type": "rank_stopped", "time": "2030-01-01T00:00:06.000Z", "attempt": 1,
         "reason": "SIGTERM (stall restart)",
         "stacks": [{"rank": 3, "where": where, "frames": ["forward (train.py:88)"]},
                    {"rank": 0, "where": "dist.py:12 in all_reduce", "frames": []}]},
        {"type": "exit", "time": "2030-01-01T00:00:07.000Z", "attempt": 1, "reason": "stalled"}]
    out = run("describe", job["id"]).stdout.splitlines()
    at = next(i for i, ln in enumerate(out) if "rank_stopped" in ln)
    assert out[at + 1].strip() == f"rank 3: {where}"
    assert out[at + 2].strip() == "rank 0: dist.py:12 in all_reduce"
    assert out[at + 1].index("rank 3") > out[at].index("SIGTERM")  # under the reason, indented
    assert "exit" in out[at + 3]


def test_pending_reason_in_get_list_and_the_sdk(run, fake):
    job = fake.add_job(ranks=99)
    fake.update_job(job["id"], pending_reason="can never fit: needs 99 GPUs; the fleet has 16")
    assert "can never fit" in run("get", job["id"]).stdout
    assert "can never fit" in run("list").stdout
    with Client(fake.url, "t1") as c:
        assert c.get_job(job["id"]).pending_reason.startswith("can never fit")
