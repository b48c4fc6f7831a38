"""The contracts of the heartbeat store, the collector's marks and the inbox
(ports.HeartbeatStore, CollectorStore, Inbox), held by the fakes of
tests/fakes.py and the DynamoDB and SQS adapters alike."""
from __future__ import annotations

from datetime import timedelta

from chalicelib.adapters.heartbeat_store import SHARD_RANKS
from chalicelib.domain.clock import utcnow
from chalicelib.domain.stall import Beat
from tests.fakes import ms


def _placement(ports, ranks: int) -> tuple[str, dict[int, str]]:
    return ports.job().job_id, {r: ports.node_id(r % 2) for r in range(ranks)}


def _record(ports, job_id: str, node_of: dict[int, str], entries: list[Beat], at) -> None:
    """One post of attempt 1, with the attempt's placement as the heartbeat
    service passes it."""
    ports.beats.record(job_id, 1, entries, at, node_of)


def _beat(node_of: dict[int, str], rank: int, at, **fields) -> Beat:
    """A beat of ``rank`` received at ``at``."""
    return Beat(rank, node_of[rank], heard_at=at, **fields)


def _note(node_of: dict[int, str], rank: int, **fields) -> Beat:
    """An entry that is not a beat (a pause, a sample): never heard_at."""
    return Beat(rank, node_of[rank], **fields)


def test_each_rank_reads_back_its_own_last_beat(ports):
    """Invariant 4 rests on it: the scan judges each rank by its own receive time."""
    job_id, node_of = _placement(ports, 4)
    t0 = utcnow()
    _record(ports, job_id, node_of, [_beat(node_of, 0, t0, step=7,
                                         beat_at=t0 - timedelta(seconds=1)),
                                   _beat(node_of, 2, t0, step=3)], t0)
    t5 = t0 + timedelta(seconds=5)
    _record(ports, job_id, node_of, [_beat(node_of, 1, t5, step=9)], t5)
    beats = ports.beats.read(job_id, 1, node_of)
    assert [(b.rank, b.node_id) for b in beats] == sorted(node_of.items())
    assert [b.heard_at for b in beats] == [ms(t0), ms(t5), ms(t0), None]
    assert [b.step for b in beats] == [7, 9, 3, None]
    assert beats[0].beat_at == ms(t0 - timedelta(seconds=1)) and beats[1].beat_at is None
    assert ports.beats.read(job_id, 2, node_of)[0].heard_at is None, "another attempt's"


def test_a_new_beat_replaces_the_last_one(ports):
    job_id, node_of = _placement(ports, 1)
    t0 = utcnow()
    until = t0 + timedelta(seconds=60)
    _record(ports, job_id, node_of, [_beat(node_of, 0, t0, step=1, paused_until=until,
                                         pause_reason="eval")], t0)
    t3 = t0 + timedelta(seconds=3)
    _record(ports, job_id, node_of, [_beat(node_of, 0, t3, step=2)], t3)
    [beat] = ports.beats.read(job_id, 1, node_of)
    assert (beat.step, beat.heard_at, beat.paused_until) == (2, ms(t3), None)


def test_a_pause_or_a_sample_does_not_touch_the_last_beat(ports):
    job_id, node_of = _placement(ports, 2)
    t0 = utcnow()
    _record(ports, job_id, node_of, [_beat(node_of, 0, t0, step=5)], t0)
    until = t0 + timedelta(seconds=600)
    t1 = t0 + timedelta(seconds=1)
    _record(ports, job_id, node_of, [_note(node_of, 0, paused_until=until,
                                         pause_reason="checkpoint"),
                                   _note(node_of, 1, paused_until=until,
                                         pause_reason="checkpoint")], t1)
    sampled = t0 + timedelta(seconds=2)
    _record(ports, job_id, node_of, [_note(node_of, 0, proc={"cpu": 0.5}, sampled_at=sampled,
                                         active_at=sampled)], sampled)
    paused, never = ports.beats.read(job_id, 1, node_of)
    assert (paused.heard_at, paused.step, paused.paused_until) == (ms(t0), 5, ms(until))
    assert (paused.proc, paused.sampled_at, paused.io_at) == ({"cpu": 0.5}, ms(sampled), None)
    assert (paused.active_at, paused.pause_reason, paused.sent_at) == (ms(sampled), None, None)
    assert (never.heard_at, never.paused_until, never.proc) == (None, ms(until), None)


def test_a_later_sample_keeps_the_earlier_samples_times_it_has_none_of(ports):
    """A rank's last busy or active sample stands until a newer one is busy or
    active: an idle sample must not erase the evidence of a checkpoint."""
    job_id, node_of = _placement(ports, 1)
    t0 = utcnow()
    _record(ports, job_id, node_of, [_note(node_of, 0, proc={"io_bps": 1 << 30}, sampled_at=t0,
                                         io_at=t0, wrote_at=t0, active_at=t0)], t0)
    t9 = t0 + timedelta(seconds=9)
    _record(ports, job_id, node_of, [_note(node_of, 0, proc={"cpu": 0.0}, sampled_at=t9)], t9)
    [beat] = ports.beats.read(job_id, 1, node_of)
    assert (beat.proc, beat.sampled_at) == ({"cpu": 0.0}, ms(t9))
    assert (beat.io_at, beat.wrote_at, beat.active_at) == (ms(t0), ms(t0), ms(t0))
    assert beat.heard_at is None, "a sample is not a beat"


def test_a_pause_in_a_beat_is_kept_with_it(ports):
    job_id, node_of = _placement(ports, 1)
    t0 = utcnow()
    until = t0 + timedelta(seconds=60)
    wrote, resumed = t0 - timedelta(seconds=3), t0 - timedelta(seconds=1)
    _record(ports, job_id, node_of, [_beat(node_of, 0, t0, step=1, paused_until=until,
                                         pause_reason="eval", arrived_seq=4,
                                         arrived_name="all_reduce", wrote_at=wrote,
                                         resumed_at=resumed, resumed_gap_s=12.5,
                                         sent_at=t0 + timedelta(hours=3))], t0)
    [beat] = ports.beats.read(job_id, 1, node_of)
    assert (beat.paused_until, beat.arrived_seq, beat.arrived_name) == (
        ms(until), 4, "all_reduce")
    assert (beat.wrote_at, beat.resumed_at, beat.resumed_gap_s) == (ms(wrote), ms(resumed), 12.5)
    assert (beat.heard_at, beat.sent_at) == (ms(t0), None), "the sender's clock is not read back"


def test_every_beat_of_a_post_larger_than_one_batch_is_stored(ports):
    """A post of more ranks than one BatchWriteItem takes (25), over two
    shards: a rank whose beat was dropped would be judged silent."""
    job_id, node_of = _placement(ports, SHARD_RANKS + 40)
    t0 = utcnow()
    _record(ports, job_id, node_of, [_beat(node_of, r, t0, step=r) for r in node_of], t0)
    beats = ports.beats.read(job_id, 1, node_of)
    assert [b.step for b in beats] == list(node_of)
    assert {b.heard_at for b in beats} == {ms(t0)}


# -- the collector's marks: one item for the whole stack ---------------------------
def test_the_latest_ingest_is_the_latest_mark(whole):
    assert whole.collector.latest_ingest() is None
    t0 = utcnow()
    whole.collector.mark_ingest(t0)
    assert whole.collector.latest_ingest() == t0
    whole.collector.mark_ingest(t0 + timedelta(milliseconds=300))  # at most one a second
    assert whole.collector.latest_ingest() == t0
    whole.collector.mark_ingest(t0 + timedelta(seconds=2))
    assert whole.collector.latest_ingest() == t0 + timedelta(seconds=2)


def test_the_previous_scan_is_the_one_last_recorded(whole):
    assert whole.collector.previous_scan() == (None, None, None)
    t0 = utcnow()
    whole.collector.record_scan(t0, t0 + timedelta(seconds=130), "collector blind")
    assert whole.collector.previous_scan() == (t0, t0 + timedelta(seconds=130),
                                               "collector blind")
    whole.collector.record_scan(t0 + timedelta(seconds=60))
    assert whole.collector.previous_scan() == (t0 + timedelta(seconds=60), None, None)


# -- the inbox --------------------------------------------------------------------
def test_each_node_has_one_inbox_and_gets_what_is_sent_there(ports):
    a, b = ports.node_id(0), ports.node_id(1)
    url = ports.inbox.ensure(a)
    assert ports.inbox.ensure(a) == url, "ensuring again is harmless"
    other = ports.inbox.ensure(b)
    assert other != url
    ports.inbox.send(url, {"type": "CANCEL", "job_id": "j", "attempt": 1, "reason": None})
    ports.inbox.send(url, {"type": "CANCEL", "job_id": "j", "attempt": 2, "reason": "x"})
    got = ports.drain(url)
    assert sorted(m["attempt"] for m in got) == [1, 2]
    assert got[0] in ({"type": "CANCEL", "job_id": "j", "attempt": 1, "reason": None},
                      {"type": "CANCEL", "job_id": "j", "attempt": 2, "reason": "x"})
    assert ports.drain(other) == [] and ports.drain(url) == []


def test_a_nodes_last_post_is_when_any_of_its_items_was_last_written(ports):
    """The reconciler's second proof of life (a node silent by its call-ins
    whose beats still arrive is not DOWN): per node, the collector's time of
    its last post to any of the attempts asked about, whatever entries it
    had (a process sample too); another attempt's posts do not count."""
    job_id, node_of = _placement(ports, 32)   # 16 ranks a node: two host items each
    n0, n1 = ports.node_id(0), ports.node_id(1)
    t0 = utcnow()
    assert ports.beats.last_posts({(job_id, 1): node_of}, {n0, n1}) == {}
    _record(ports, job_id, node_of, [_beat(node_of, 0, t0, step=1)], t0)
    t5 = t0 + timedelta(seconds=5)
    # only node 0's ranks of its second item (ranks 16..30, even), a sample alone
    _record(ports, job_id, node_of, [_note(node_of, 30, proc={"cpu": 1.0}, sampled_at=t5)], t5)
    ports.beats.record(job_id, 2, [_beat(node_of, 1, t5 + timedelta(seconds=5))],
                       t5 + timedelta(seconds=5), node_of)
    assert ports.beats.last_posts({(job_id, 1): node_of}, {n0, n1}) == {n0: ms(t5)}
    assert ports.beats.last_posts({(job_id, 1): node_of}, {n1}) == {}
    assert ports.beats.last_posts({(job_id, 2): node_of}, {n1}) == {
        n1: ms(t5 + timedelta(seconds=5))}
