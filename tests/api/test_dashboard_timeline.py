"""The job page's timeline (chalicelib/web/static/timeline.js, issue 46) under
node against what the server and the CLI say for the same story: each
attempt's pieces, in GPU-milliseconds, are domain/usage.py's ``span_parts``
of the spans ``spans_of`` reads from the same events, and the total line is
``gpujobs describe``'s usage sentence (gpujobs_client/cli.py) of the job's
``usage``, to the character."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from chalicelib.domain import usage
from chalicelib.domain.clock import iso
from tests.api.test_dashboard_assets import run_under_node

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(hours=3)


def at(seconds: float) -> str:
    return iso(T0 + timedelta(seconds=seconds))


def ev(kind: str, seconds: float, attempt: int | None, reason: str | None = None, **more) -> dict:
    return {"type": kind, "time": at(seconds), "attempt": attempt, "reason": reason, **more}


#: stories as GET /v1/jobs/{id}/events serves them (oldest first), each with its GPUs
STORIES = {
    # failed (rank 3 exited 1), retried, stalled and recovered, then succeeded
    "failed then stalled": (4, [
        ev("created", 0, None, "submitted"),
        ev("placed", 10, 1, "placed on 2 nodes", nodes={"n1": "0-1", "n2": "2-3"}),
        ev("rank_started", 14, 1, "ranks 0-3 started", ranks=[0, 1, 2, 3]),
        ev("started", 15, 1, "ranks started"),
        ev("rank_exited", 400, 1, "rank 3 exited with code 1", ranks=[3], exit_code=1),
        ev("retried", 401.5, 1, "rank_failed", rank=3, node_id="n2", next_attempt=2,
           decision="rank_failed (rank 3, exit code 1): retried (attempt 2 of 3)"),
        ev("placed", 430, 2, "placed on 2 nodes"),
        ev("started", 437.25, 2, "ranks started"),
        ev("stalled", 1900, 2, "rank 2 on n2 went silent first", rank=2,
           last_heard_at=at(1780.125)),
        ev("recovered", 2020, 2, "rank 2 beat again", incident="i1", rank=2),
        ev("stalled", 3000, 2, "rank 0 stalled first", rank=0, last_heard_at=None),
        ev("recovered", 3010, 2, "rank 0 beat again", incident="i2", rank=0),
        ev("finished", 7000, 2, "succeeded", state="SUCCEEDED", exit_code=0),
    ]),
    # preempted, then lost with its node, then running (stalled, not recovered)
    "preempted, node lost, running": (2, [
        ev("placed", 0, 1, "placed on 1 node"),
        ev("started", 3, 1, "ranks started"),
        ev("retried", 600, 1, "preempted", node_id="n1", next_attempt=2),
        ev("placed", 660, 2, "placed on 1 node"),
        ev("started", 661, 2, "ranks started"),
        ev("retried", 900, 2, "node_lost", rank=0, node_id="n1", next_attempt=3),
        ev("placed", 905, 3, "placed on 1 node"),
        ev("started", 930, 3, "ranks started"),
        ev("stalled", 5000, 3, "rank 1 stalled first", rank=1, last_heard_at=at(4990)),
    ]),
    # never started (port in use), then still starting
    "never started": (8, [
        ev("placed", 0, 1, "placed on 2 nodes"),
        ev("retried", 20, 1, "port_in_use", next_attempt=2),
        ev("placed", 25, 2, "placed on 2 nodes"),
    ]),
    # cancelled while stalled, an unknown end reason counted as a failed attempt
    "cancelled while stalled": (1, [
        ev("placed", 0, 1, "placed on 1 node"),
        ev("started", 1, 1, "ranks started"),
        ev("retried", 50, 1, "something_new", next_attempt=2),
        ev("placed", 60, 2, "placed on 1 node"),
        ev("started", 61, 2, "ranks started"),
        ev("stalled", 100, 2, "rank 0 stalled first", rank=0, last_heard_at=at(90)),
        ev("finished", 130, 2, "cancelled", state="CANCELLED"),
    ]),
}

SCRIPT = """
import { normaliseEvents } from './api.js';
import { attemptSpans, spanSegments, usageSentence, endWords, marksOf, fixed } from './timeline.js';
const given = JSON.parse(process.argv[2]);
const out = {};
for (const [name, [gpus, events]] of Object.entries(given.stories)) {
  const spans = attemptSpans(normaliseEvents({ events }), gpus);
  out[name] = spans.map((s) => {
    const cut = spanSegments(s, Date.parse(given.now));
    return { attempt: s.attempt, parts: cut.parts, segments: cut.segments.map((g) => g.part),
             end: endWords(s, null), marks: marksOf(s, cut, null).map((m) => [m.kind, m.text]) };
  });
}
out.sentences = given.usages.map(([u, attempts]) => usageSentence(u, attempts));
out.fixed = [fixed(0.25, 1), fixed(0.75, 1), fixed(12.5, 0), fixed(13.5, 0), fixed(0.15, 1), fixed(2.05, 1)];
console.log(JSON.stringify(out));
"""


def _expected(gpus: int, events: list[dict]) -> list[dict]:
    spans = usage.spans_of(events, gpus)
    return [{"attempt": s.attempt,
             "parts": {k: v for k, v in usage.span_parts(s, spans[i + 1:], NOW).items() if v}}
            for i, s in enumerate(spans)]


def test_the_bars_are_the_usage_of_the_same_story_and_the_total_is_describes_sentence(tmp_path):
    from gpujobs_client import cli
    from gpujobs_client.models import Attempt, Usage

    failed = [{"attempt": 1, "state": "FAILED", "placement": [], "created_at": at(10),
               "finished_at": at(401.5), "exit": {"reason": "rank_failed", "exit_code": 1, "rank": 3,
                                                  "node_id": "n2"}},
              {"attempt": 2, "state": "SUCCEEDED", "placement": [], "created_at": at(430),
               "finished_at": at(7000), "exit": {"reason": "succeeded", "exit_code": 0}}]
    usages = [(usage.usage(usage.spans_of(events, gpus), NOW), failed if name == "failed then stalled" else [])
              for name, (gpus, events) in STORIES.items()]
    usages += [({"gpu_seconds": 44640, "productive_gpu_seconds": 36360,
                 "lost_gpu_seconds": {"failed_attempt": 5760, "stalled": 1800, "startup": 720},
                 "goodput": 0.8145, "estimated": False}, failed),
               ({"gpu_seconds": 1800, "productive_gpu_seconds": 900, "lost_gpu_seconds": {"timeout": 900},
                 "goodput": 0.5, "estimated": True}, []),
               ({"gpu_seconds": 0, "productive_gpu_seconds": 0, "lost_gpu_seconds": {},
                 "goodput": None, "estimated": False}, [])]
    said = run_under_node(tmp_path, SCRIPT, {"stories": STORIES, "now": iso(NOW), "usages": usages})

    for name, (gpus, events) in STORIES.items():
        got = [{"attempt": a["attempt"], "parts": {k: v for k, v in a["parts"].items() if v}}
               for a in said[name]]
        assert got == _expected(gpus, events), name
    assert said["sentences"] == [cli.usage_sentence(Usage.from_json(u), [Attempt.from_json(a) for a in att])
                                 for u, att in usages]
    assert said["sentences"][4] == ("held 12.4 GPU-h: 10.1 productive (81 %), 1.6 failed attempt 1 "
                                    "(rank 3 exited 1), 0.5 stalled, 0.2 startup")
    assert said["sentences"][-1] == "held no GPU time yet"
    assert said["fixed"] == [f"{0.25:.1f}", f"{0.75:.1f}", f"{12.5:.0f}", f"{13.5:.0f}", f"{0.15:.1f}",
                             f"{2.05:.1f}"]


def test_each_attempt_says_how_it_ended_and_is_marked_where_it_stalled_or_was_lost(tmp_path):
    said = run_under_node(tmp_path, SCRIPT, {"stories": STORIES, "now": iso(NOW), "usages": []})
    first = said["failed then stalled"]
    assert [a["end"] for a in first] == ["failed (rank 3)", "succeeded"]
    assert first[0]["segments"] == ["startup", "failed_attempt"]
    assert first[1]["segments"] == ["startup", "productive", "stalled", "productive", "stalled",
                                    "productive"]
    assert [m for m in first[1]["marks"]] == [
        ["stall", "stalled 4 min from 00:29:40 UTC, then recovered: rank 2 on n2 went silent first"],
        ["stall", "stalled 10 s from 00:50:00 UTC, then recovered: rank 0 stalled first"]]
    lost = said["preempted, node lost, running"]
    assert [a["end"] for a in lost] == ["preempted", "node lost (n1)", "running"]
    assert [m[0] for a in lost for m in a["marks"]] == ["preempted", "node_lost", "stall"]
    assert lost[0]["marks"][0][1] == "attempt 1 preempted at 00:10:00 UTC"
    assert lost[2]["marks"][0][1].startswith("stalled 1 h 36 min from 01:23:10 UTC, still stalled")
    assert lost[2]["segments"] == ["startup", "productive", "stalled"]
    never = said["never started"]
    assert [a["end"] for a in never] == ["failed (its rendezvous port was in use)", "starting"]
    assert [a["segments"] for a in never] == [["failed_attempt"], ["startup"]]
    cancelled = said["cancelled while stalled"]
    assert [a["end"] for a in cancelled] == ["failed (something new)", "cancelled"]
    assert cancelled[1]["segments"] == ["startup", "cancelled", "stalled"]
    assert cancelled[1]["marks"][0][1].startswith("stalled 40 s from 00:01:30 UTC, until the attempt ended")
