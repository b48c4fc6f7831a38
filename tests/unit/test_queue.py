"""Where a waiting job stands (domain/queue.py): its place among the jobs that
want the same GPUs, whose GPUs it waits for, and an estimated start whose
basis is stated, from the placer's line alone."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from chalicelib.domain.queue import MAX_HOLDERS, MAX_LINE, Entry, Line, holder_of, standing

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)


def line(entries, holders=(), capacity=None) -> Line:
    return Line.of(NOW, entries, holders, capacity if capacity is not None else {"h100": 16})


def test_position_counts_only_the_jobs_that_want_the_same_gpus():
    """A job competes with its own type and with jobs of any type, not with
    another type's: an a100 job ahead does not push an h100 job back."""
    ln = line([Entry("job_a", "acme", 8, "h100"), Entry("job_x", "acme", 8, "a100"),
               Entry("job_any", "acme", 2, "*"), Entry("job_me", "acme", 4, "h100")])
    q = standing(ln, "job_me", "acme", NOW)
    assert (q["position"], q["of"]) == (3, 3)
    assert [a["job_id"] for a in q["ahead"]] == ["job_a", "job_any"]
    assert q["gpu_type"] == "h100"


def test_another_tenants_jobs_are_shown_without_their_ids():
    """Tenant walls: the line holds every tenant's jobs, a reader sees only
    its own ids, in the jobs ahead, the holders and the estimate's basis."""
    ln = line([Entry("job_theirs", "globex", 8, "h100"), Entry("job_me", "acme", 8, "h100")],
              [holder_of("job_held", "globex", 16, "h100", NOW, 600)])
    q = standing(ln, "job_me", "acme", NOW)
    assert q["ahead"] == [{"job_id": None, "gpus": 8}]
    assert q["waiting_for"][0]["job_id"] is None
    assert "job_held" not in q["basis"] and "a job of another tenant" in q["basis"]


def test_the_estimate_is_the_limit_that_frees_enough_gpus_for_those_ahead_and_then_it():
    """16 GPUs, all held: 8 by a job ending in 5 min, 8 by one ending in 10
    min. The job ahead takes the first 8 freed, so this one starts when the
    second reaches its limit, and says so."""
    ln = line([Entry("job_ahead", "acme", 8, "h100"), Entry("job_me", "acme", 8, "h100")],
              [holder_of("job_late", "acme", 8, "h100", NOW, 600),
               holder_of("job_soon", "acme", 8, "h100", NOW, 300)])
    q = standing(ln, "job_me", "acme", NOW)
    assert q["estimated_start"] == "2026-12-07T12:10:00.000Z"
    assert q["basis"] == "about 10 min, when job_late reaches its 10 min limit"
    assert [w["job_id"] for w in q["waiting_for"]] == ["job_soon", "job_late"]
    first = standing(ln, "job_ahead", "acme", NOW)
    assert first["basis"] == "about 5 min, when job_soon reaches its 5 min limit"


def test_gpus_held_without_a_limit_make_the_start_unknown_and_say_why():
    ln = line([Entry("job_me", "acme", 8, "h100")],
              [holder_of("job_forever", "acme", 16, "h100", NOW, None)])
    q = standing(ln, "job_me", "acme", NOW)
    assert q["estimated_start"] is None
    assert q["basis"] == "unknown: the GPUs it waits for are held by jobs without a time limit"
    assert q["waiting_for"] == [{"job_id": "job_forever", "gpus": 16, "ends_by": None}]


def test_gpus_registered_and_not_held_make_no_claim_that_they_are_free():
    """The line counts registered GPUs, a DOWN node's too: when those not
    held would be enough, the basis says the estimate is unknown and why,
    never that enough GPUs are free (a DOWN node's 8 GPUs made a README
    reader's "about 10 min" read "enough GPUs are free")."""
    ln = line([Entry("job_me", "acme", 8, "h100")],
              [holder_of("job_held", "acme", 8, "h100", NOW, 600)])
    q = standing(ln, "job_me", "acme", NOW)
    assert q["estimated_start"] is None
    assert q["basis"].startswith("unknown: the registered GPUs not held would be enough")
    assert "not READY" in q["basis"] and "are free" not in q["basis"]


def test_a_holder_past_its_limit_means_any_moment_not_a_time_in_the_past():
    ln = line([Entry("job_me", "acme", 16, "h100")],
              [holder_of("job_over", "acme", 16, "h100", NOW - timedelta(hours=1), 600)])
    q = standing(ln, "job_me", "acme", NOW)
    assert q["estimated_start"] == "2026-12-07T12:00:00.000Z"
    assert q["basis"] == "any moment: job_over has reached its 10 min limit"


def test_enough_free_gpus_in_all_is_no_estimate_and_points_at_the_pending_reason():
    """Free GPUs spread over nodes too small for the gang, or a tenant limit:
    the line cannot tell which, so the estimate says where to look."""
    q = standing(line([Entry("job_me", "acme", 8, "h100")]), "job_me", "acme", NOW)
    assert q["estimated_start"] is None and "pending_reason" in q["basis"]


def test_a_job_of_any_type_counts_every_types_gpus_held():
    ln = line([Entry("job_me", "acme", 8, "*")],
              [holder_of("job_a", "acme", 8, "a100", NOW, 60),
               holder_of("job_h", "acme", 8, "h100", NOW, 120)],
              capacity={"*": 16, "h100": 8, "a100": 8})
    q = standing(ln, "job_me", "acme", NOW)
    assert q["gpu_type"] is None and len(q["waiting_for"]) == 2
    assert q["basis"] == "about 60 s, when job_a reaches its 60 s limit"


def test_a_job_not_in_the_line_has_no_standing():
    assert standing(line([Entry("job_a", "acme", 8, "h100")]), "job_b", "acme", NOW) is None
    assert standing(None, "job_b", "acme", NOW) is None


def test_the_line_keeps_its_head_and_sums_every_holders_gpus():
    """The record stays bounded: the first MAX_LINE jobs and MAX_HOLDERS
    holders (bounded ends first), while the GPUs held count them all."""
    entries = [Entry(f"job_{i:05d}", "acme", 1, "h100") for i in range(MAX_LINE + 5)]
    holders = [holder_of(f"job_h{i:05d}", "acme", 1, "h100", NOW, None if i % 2 else 60)
               for i in range(MAX_HOLDERS + 10)]
    ln = Line.of(NOW, entries, holders, {"h100": 10_000})
    assert len(ln.entries) == MAX_LINE and len(ln.holders) == MAX_HOLDERS
    assert dict(ln.held) == {"h100": MAX_HOLDERS + 10}
    assert all(h.ends_by is not None for h in ln.holders[:(MAX_HOLDERS + 10) // 2])


def test_the_line_reads_back_as_written_and_compares_without_its_time():
    ln = line([Entry("job_a", "acme", 8, "h100")],
              [holder_of("job_h", "globex", 8, "*", NOW, 90),
               holder_of("job_k", "acme", 8, "h100", None, None)])
    again = Line.from_json(ln.to_json())
    assert again == ln
    later = Line.of(NOW + timedelta(seconds=5), ln.entries, ln.holders, dict(ln.capacity))
    assert later.same_order(ln) and not later.same_order(None)
    assert not line([Entry("job_b", "acme", 8, "h100")]).same_order(ln)
