"""GET /v1/jobs/{id}/logs: the lines the agents shipped, with rank, stream and
time, newest attempt by default, paged by a signed cursor; another tenant's
job is not found, nor are its lines, whatever the log store answers; a bad
``since`` is a 400 naming it."""
import base64
import json
import time
import urllib.parse

import boto3
import pytest

from agent.logship import Shipper
from agent.records import agent_record
from chalicelib.domain.principal import Principal

from .test_events import placed

AGENT = Principal("agent", "*")


@pytest.fixture
def cluster(iso):
    return {n: iso.nodes.register(AGENT, n, {"gpus": 2}).inbox_queue_url for n in ("n1", "n2")}


def ship(tmp_path, env, job_id, attempt, rank, out="", err=""):
    d = tmp_path / "logs" / job_id / str(attempt)
    d.mkdir(parents=True, exist_ok=True)
    with (d / f"rank-{rank}.log").open("ab") as f:  # as the shim writes them: records
        for stream, text in (("stdout", out), ("stderr", err)):
            for line in text.splitlines():
                f.write(agent_record(stream, line))
    client = boto3.client("logs", endpoint_url=env["GPUJOBS_AWS_ENDPOINT_URL"],
                          region_name="us-east-1")
    Shipper(tmp_path / "logs", tmp_path / "state", env["GPUJOBS_LOG_GROUP"],
            client_factory=lambda: client).tick()


def get(client, tenants, job_id, who="a", **q):
    qs = urllib.parse.urlencode(q)
    return client.http.get(f"/v1/jobs/{job_id}/logs?{qs}", headers=tenants.headers(who))


def test_lines_of_every_rank_newest_attempt_by_default(iso, iso_client, tenants, cluster,
                                                       fresh_env, tmp_path):
    job_id, by_node = placed(iso, iso_client, tenants)
    for r in range(4):
        ship(tmp_path, fresh_env, job_id, 1, r, out=f"out {r}\n",
             err=f"err {r}\n")
    r = get(iso_client, tenants, job_id)
    assert r.status_code == 200, r.json_body
    body = r.json_body
    assert body["attempt"] == 1 and body["next_page_token"] is None
    got = sorted((x["rank"], x["stream"], x["line"]) for x in body["lines"])
    assert got == sorted([(k, "stdout", f"out {k}") for k in range(4)]
                         + [(k, "stderr", f"err {k}") for k in range(4)])
    assert all(x["time"].endswith("Z") and x["id"] for x in body["lines"])
    one = get(iso_client, tenants, job_id, rank=2).json_body["lines"]
    assert {(x["rank"], x["line"]) for x in one} == {(2, "out 2"), (2, "err 2")}


def test_pages_follow_a_signed_cursor_without_skips_or_repeats(iso, iso_client, tenants,
                                                              cluster, fresh_env, tmp_path):
    job_id, _ = placed(iso, iso_client, tenants)
    ship(tmp_path, fresh_env, job_id, 1, 0, out="".join(f"l{i}\n" for i in range(7)))
    seen, token = [], None
    for _ in range(10):
        q = {"page_size": 3, **({"page_token": token} if token else {})}
        body = get(iso_client, tenants, job_id, **q).json_body
        seen += [x["line"] for x in body["lines"]]
        token = body["next_page_token"]
        if token is None:
            break
    assert seen == [f"l{i}" for i in range(7)]
    first = get(iso_client, tenants, job_id, page_size=3).json_body["next_page_token"]
    r = get(iso_client, tenants, job_id, page_size=3, rank=0, page_token=first)
    assert r.status_code == 400 and r.json_body["field"] == "page_token", \
        "a token is bound to its filter"


def test_another_tenant_gets_404_and_bad_parameters_name_their_field(iso, iso_client, tenants,
                                                                     cluster):
    job_id, _ = placed(iso, iso_client, tenants)
    r = get(iso_client, tenants, job_id, who="b")
    assert r.status_code == 404 and r.json_body["field"] == "job_id"
    for q, field in (({"rank": 9}, "rank"), ({"attempt": 5}, "attempt"),
                     ({"since": "yesterday"}, "since"), ({"page_size": 0}, "page_size")):
        r = get(iso_client, tenants, job_id, **q)
        assert r.status_code == 400 and r.json_body["field"] == field, (q, r.json_body)


def test_since_leaves_out_older_lines(iso, iso_client, tenants, cluster, fresh_env, tmp_path):
    job_id, _ = placed(iso, iso_client, tenants)
    ship(tmp_path, fresh_env, job_id, 1, 0, out="old\n")
    assert [x["line"] for x in get(iso_client, tenants, job_id, since="1h").json_body["lines"]] \
        == ["old"]
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    assert get(iso_client, tenants, job_id, since=later).json_body["lines"] == []


def test_a_job_of_4096_ranks_reads_no_other_tenants_lines_from_moto(iso, iso_client, tenants,
                                                                     cluster, fresh_env,
                                                                     tmp_path):
    """Invariant: a job of more than 100 ranks (read by stream prefix, which
    moto ignores: shown first) gets its own lines only, page after page, and
    no page token of it carries another job's stream; a token is checked
    again on resume."""
    for n in range(4):
        iso.nodes.register(AGENT, f"big-{n}", {"gpus": 1024, "gpu_type": "big"})
    job_id, _ = placed(iso, iso_client, tenants, ranks=4096, gpu_type="big")
    r = iso_client.http.post("/v1/jobs", headers=tenants.headers("b"),
                             body=json.dumps({"command": ["train"], "ranks": 2}))
    other = r.json_body["id"]
    assert other in iso.placer.run().placed
    ship(tmp_path, fresh_env, other, 1, 0, out="globex secret 0\n")
    ship(tmp_path, fresh_env, job_id, 1, 0, out="ours 0\n")
    ship(tmp_path, fresh_env, other, 1, 1, out="globex secret 1\nglobex secret 2\n")
    ship(tmp_path, fresh_env, job_id, 2, 5, out="attempt 2 is not read\n")
    ship(tmp_path, fresh_env, job_id, 1, 4095, out="ours 4095\n", err="ours err\n")
    ship(tmp_path, fresh_env, other, 1, 0, out="globex secret 3\n")

    logs = boto3.client("logs", endpoint_url=fresh_env["GPUJOBS_AWS_ENDPOINT_URL"],
                        region_name="us-east-1")
    raw = logs.filter_log_events(logGroupName=fresh_env["GPUJOBS_LOG_GROUP"],
                                 logStreamNamePrefix=f"{job_id}/1/", interleaved=True)
    assert any(e["logStreamName"].startswith(other) for e in raw["events"]), \
        "moto ignores the prefix: the store does answer with the other job's lines"

    for page_size in (1, 2, 1000):
        lines, token = [], None
        for _ in range(50):
            q = {"page_size": page_size, **({"page_token": token} if token else {})}
            r = get(iso_client, tenants, job_id, **q)
            assert r.status_code == 200, r.json_body
            lines += r.json_body["lines"]
            token = r.json_body["next_page_token"]
            if token is None:
                break
            carried = base64.urlsafe_b64decode(token.split(".")[0] + "==").decode()
            assert other not in carried and "/2/" not in carried, carried
        assert sorted((x["rank"], x["line"]) for x in lines) == \
            [(0, "ours 0"), (4095, "ours 4095"), (4095, "ours err")], page_size


BAD_SINCE = ["739000d", "0001-01-01T00:00:00Z", "800000d", "\uff11\uff10m", "\u0663m", "",
             " ", "-5m", "1e3m", " 10m", "10m ", "10 m", "10m\n", "10M", "1h30m", "10",
             "9999-12-31T23:59:59Z", "1969-12-31T23:59:59Z", "2025-01-31T12:00:00",
             "2025-02-30T00:00:00Z", "2025-01-31T12:00:00+0100", "yesterday"]


def test_a_since_outside_its_documented_forms_is_a_400_naming_since(iso, iso_client, tenants,
                                                                     cluster):
    """Invariant: no ``since``, however malformed or far off, is a 5xx: each
    is 400 invalid_argument problem JSON naming ``since`` (739000d was an
    OverflowError, 0001-01-01T00:00:00Z a negative startTime: both 500)."""
    job_id, _ = placed(iso, iso_client, tenants)
    for value in BAD_SINCE:
        r = get(iso_client, tenants, job_id, since=value)
        assert r.status_code == 400, (value, r.status_code, r.body)
        assert r.headers["Content-Type"] == "application/problem+json", value
        assert (r.json_body["code"], r.json_body["field"]) == ("invalid_argument", "since"), value
    in_a_minute = time.strftime("%Y-%m-%dT%H:%M:%S.000+00:00", time.gmtime(time.time() + 60))
    for value in ("10m", "3d", "0s", "1970-01-01T00:00:00Z", in_a_minute):
        assert get(iso_client, tenants, job_id, since=value).status_code == 200, value


#: Lambda's limit on what a function answers, its whole proxy payload
LAMBDA_BYTES = 6_291_456
#: rank 0's control bytes, each \\u0001 (6 bytes) in JSON: more than six bounds' worth
RANK0_CHARS = 7_000_000
#: rank 1's one line of é, 2 bytes each in UTF-8: one line longer than the bound
RANK1_CHARS = 3_500_000
assert RANK0_CHARS * 6 > 6 * LAMBDA_BYTES and RANK1_CHARS * 2 > LAMBDA_BYTES


def proxy_payload_bytes(r) -> int:
    """What the response takes as Lambda's answer to API Gateway: the body as
    a JSON string among the status and headers, as the runtime encodes it."""
    return len(json.dumps({"statusCode": r.status_code, "headers": dict(r.headers),
                           "body": r.body.decode("utf-8")}).encode())


def test_logs_of_control_bytes_and_long_lines_come_in_responses_under_6_mb_on_moto(
        iso, iso_client, tenants, cluster, fresh_env, tmp_path):
    """Invariant: on moto, which takes events of any size and answers a read
    with all of them, every /logs response fits Lambda's 6 MB whatever the
    ranks wrote: 7 MB of \\x01 (a 42 MB body before: over six times the
    bound), a 7 MB line of non-ASCII (more than the bound on its own), 1.2 MB
    events an agent before issue 25 shipped, and a 2 MB event no agent
    writes (shown cut to 262,144 characters, ``cut: true``); followed by its
    tokens, each line comes once, in order, and the lines joined are what
    the ranks wrote. (Sizes are the smallest that still cross each bound:
    the 20 MB and 10 MB of before took a minute and proved no more.)"""
    job_id, _ = placed(iso, iso_client, tenants)
    group = fresh_env["GPUJOBS_LOG_GROUP"]
    logs = boto3.client("logs", endpoint_url=fresh_env["GPUJOBS_AWS_ENDPOINT_URL"],
                        region_name="us-east-1")
    d = tmp_path / "logs" / job_id / "1"
    d.mkdir(parents=True)
    (d / "rank-0.log").write_bytes(b"\x01" * RANK0_CHARS + b"\n")
    (d / "rank-1.log").write_text("\u00e9" * RANK1_CHARS + "\n", encoding="utf-8")
    shipper = Shipper(tmp_path / "logs", tmp_path / "state", group,
                      client_factory=lambda: logs)
    while shipper.tick():
        pass
    now = int(time.time() * 1000)
    old = json.dumps({"stream": "stdout", "line": "\x01" * 200_000}, ensure_ascii=False)
    logs.create_log_stream(logGroupName=group, logStreamName=f"{job_id}/1/rank-2")
    logs.put_log_events(logGroupName=group, logStreamName=f"{job_id}/1/rank-2",
                        logEvents=[{"timestamp": now, "message": old}] * 5
                        + [{"timestamp": now + 1, "message": "\x01" * 2_000_000},
                           {"timestamp": now + 2, "message": "the end"}])

    lines, token, ids = [], None, set()
    for _ in range(200):
        # page_size 100, not the default 1,000: moto answers a read with every
        # event asked for, and 1,000 of these are 150 MB (CloudWatch: 1 MB)
        q = {"page_size": 100, **({"page_token": token} if token else {})}
        r = get(iso_client, tenants, job_id, **q)
        assert r.status_code == 200, r.body[:500]
        assert proxy_payload_bytes(r) <= LAMBDA_BYTES, (len(lines), proxy_payload_bytes(r))
        page = r.json_body
        assert page["lines"] or page["next_page_token"] is None
        assert not ids & {x["id"] for x in page["lines"]}, "a line came twice"
        ids |= {x["id"] for x in page["lines"]}
        lines += page["lines"]
        token = page["next_page_token"]
        if token is None:
            break
    assert "".join(x["line"] for x in lines if x["rank"] == 0) == "\x01" * RANK0_CHARS
    assert "".join(x["line"] for x in lines if x["rank"] == 1) == "\u00e9" * RANK1_CHARS
    two = [x for x in lines if x["rank"] == 2]
    assert [x["line"] for x in two] == ["\x01" * 200_000] * 5 + ["\x01" * 262_144, "the end"]
    assert [x.get("cut", False) for x in two] == [False] * 5 + [True, False]


def put_lines(env, stream, events):
    """(ms, text, seq) each into ``stream`` as the agent writes them (seq None: none)."""
    logs = boto3.client("logs", endpoint_url=env["GPUJOBS_AWS_ENDPOINT_URL"],
                        region_name="us-east-1")
    group = env["GPUJOBS_LOG_GROUP"]
    try:
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    body = [{"timestamp": t, "message": json.dumps(
        {"stream": "stdout", "line": text, **({} if seq is None else {"seq": seq})})}
        for t, text, seq in events]
    logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=body)


def shown(lines):
    return [f"[{x['rank']}] {x['line']}" for x in lines]


def test_lines_by_time_rank_seq_and_tokens_that_resume_on_moto(iso, iso_client, tenants,
                                                                cluster, fresh_env):
    """Invariant: on moto (which answers ties stream by stream, in the order
    the streams were made: rank 1's first here), lines come by (time, rank,
    seq); page tokens resume exactly after their last line while lines are
    appended between pages (a rank's later seq in the position's
    millisecond, another rank's): each line once; a line shipped late with
    an older time is not in the pages after it, only in a read from the
    start; the last page's follow token polls for what is new."""
    job_id, _ = placed(iso, iso_client, tenants)
    t = int(time.time() * 1000) - 60_000
    put_lines(fresh_env, f"{job_id}/1/rank-1", [(t, "r1 a", 0), (t + 1, "r1 b", 5),
                                                 (t + 2, "r1 c", 10)])
    put_lines(fresh_env, f"{job_id}/1/rank-0", [(t, "r0 a", 0), (t, "r0 b", 5),
                                                 (t + 2, "r0 c", 10), (t + 2, "r0 old", None)])
    whole = get(iso_client, tenants, job_id).json_body
    assert shown(whole["lines"]) == ["[0] r0 a", "[0] r0 b", "[1] r1 a", "[1] r1 b",
                                     "[0] r0 c", "[0] r0 old", "[1] r1 c"]
    assert [x["seq"] for x in whole["lines"]] == [0, 5, 0, 5, 10, None, 10]
    first = get(iso_client, tenants, job_id, page_size=3).json_body
    assert shown(first["lines"]) == ["[0] r0 a", "[0] r0 b", "[1] r1 a"]
    put_lines(fresh_env, f"{job_id}/1/rank-0", [(t, "r0 a2", 7)])
    put_lines(fresh_env, f"{job_id}/1/rank-0", [(t - 10, "r0 late", 3)])
    put_lines(fresh_env, f"{job_id}/1/rank-1", [(t + 3, "r1 d", 15)])
    lines, token = list(first["lines"]), first["next_page_token"]
    for _ in range(20):
        page = get(iso_client, tenants, job_id, page_size=2, page_token=token).json_body
        lines += page["lines"]
        token = page["next_page_token"]
        if token is None:
            follow = page["follow_token"]
            break
    assert shown(lines) == ["[0] r0 a", "[0] r0 b", "[1] r1 a", "[1] r1 b", "[0] r0 c",
                            "[0] r0 old", "[1] r1 c", "[1] r1 d"], \
        "r0 a2 and r0 late are before the position: only a read from the start has them"
    assert "[0] r0 late" in shown(get(iso_client, tenants, job_id).json_body["lines"])
    assert get(iso_client, tenants, job_id, page_token=follow).json_body["lines"] == []
    put_lines(fresh_env, f"{job_id}/1/rank-0", [(t + 4, "r0 d", 20)])
    assert shown(get(iso_client, tenants, job_id, page_token=follow).json_body["lines"]) \
        == ["[0] r0 d"]


def test_tail_across_ranks_and_its_bounds_on_moto(iso, iso_client, tenants, cluster,
                                                  fresh_env):
    """Invariant: ``tail=N`` is the newest N lines of the ranks together, in
    order (a rank that wrote long ago, another recently: each where it
    belongs), with a follow token after the newest; a tail out of 1..10,000,
    not a number, or with a page_token is a 400 naming ``tail``."""
    job_id, _ = placed(iso, iso_client, tenants)
    now = int(time.time() * 1000)
    put_lines(fresh_env, f"{job_id}/1/rank-0", [(now - 3_000_000, "r0 early", 0),
                                                 (now - 2_000_000, "r0 last", 9)])
    put_lines(fresh_env, f"{job_id}/1/rank-1", [(now - 5_000 + i * 10, f"r1 {i}", i * 6)
                                                 for i in range(300)])
    body = get(iso_client, tenants, job_id, tail=4).json_body
    assert shown(body["lines"]) == ["[1] r1 296", "[1] r1 297", "[1] r1 298", "[1] r1 299"]
    body = get(iso_client, tenants, job_id, tail=302).json_body
    assert shown(body["lines"])[:3] == ["[0] r0 early", "[0] r0 last", "[1] r1 0"]
    assert len(body["lines"]) == 302 and body["next_page_token"] is None
    put_lines(fresh_env, f"{job_id}/1/rank-0", [(now + 5, "r0 new", 20)])
    r = get(iso_client, tenants, job_id, page_token=body["follow_token"])
    assert shown(r.json_body["lines"]) == ["[0] r0 new"]
    tail2 = get(iso_client, tenants, job_id, tail=2, rank=0).json_body
    assert shown(tail2["lines"]) == ["[0] r0 last", "[0] r0 new"]
    for value in ("0", "10001", "-1", "x", "", "1.5"):
        r = get(iso_client, tenants, job_id, tail=value)
        assert r.status_code == 400 and r.json_body["field"] == "tail", (value, r.json_body)
    r = get(iso_client, tenants, job_id, tail=3, page_token=body["follow_token"])
    assert r.status_code == 400 and r.json_body["field"] == "tail"
    assert get(iso_client, tenants, job_id, tail=10_000).status_code == 200
