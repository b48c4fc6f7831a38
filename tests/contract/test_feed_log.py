"""The FeedLog port (tenant event feeds) on the fake and on DynamoDB: which
story events are unfed, numbering conditioned on the head read and on no
story event fed twice, reads by number, and the push watermark."""
from __future__ import annotations

import pytest

from chalicelib.domain import feed
from chalicelib.domain.clock import parse_iso
from chalicelib.service.ports import AlreadyFed, Contended, FeedHead


def told(job_id: str, key: str, stored: dict) -> list[dict]:
    return feed.tell(job_id, key, stored)


def numbered(ports, tenant: str, head: FeedHead, pairs: list[tuple[str, str]]):
    story = {}
    for job_id, _ in pairs:
        story.setdefault(job_id, ports.feeds.unfed(job_id))
    events = [e for job_id, key in pairs for e in told(job_id, key, story[job_id][key])]
    out, ms = feed.numbered(events, tenant_tag=7, head_seq=head.seq, head_ms=head.ms,
                            now=parse_iso("2026-12-07T00:00:00Z"))
    return out, ms


def test_a_created_job_has_its_creation_unfed_under_its_tenant(ports):
    job = ports.created()
    assert list(ports.feeds.unfed(job.job_id)) == ["created"]
    assert ports.feeds.unfed(job.job_id)["created"]["type"] == "created"
    assert job.job_id in ports.feeds.unfed_jobs(job.tenant, 100)
    assert ports.feeds.unfed_jobs(ports.tenant(9), 100) == []


def test_numbering_is_conditioned_on_the_head_and_on_nothing_fed_twice(ports):
    job = ports.created()
    tenant = job.tenant
    head = ports.feeds.head(tenant)
    assert head == FeedHead()
    events, ms = numbered(ports, tenant, head, [(job.job_id, "created")])
    ports.feeds.append(tenant, head, ms, events, [(job.job_id, "created")])
    after = ports.feeds.head(tenant)
    assert (after.seq, after.ms, after.pushed) == (1, ms, 0)
    assert ports.feeds.events(tenant, 0, after.seq, 10) == [(1, events[0][1])]
    with pytest.raises(Contended):  # a head read before: another numbered since
        ports.feeds.append(tenant, head, ms, events, [])
    with pytest.raises(AlreadyFed) as e:  # fed already: named, nothing written
        ports.feeds.append(tenant, after, ms, [(2, {**events[0][1], "id": "evt_x"})],
                           [(job.job_id, "created")])
    assert e.value.fed == [(job.job_id, "created")]
    assert ports.feeds.head(tenant) == after
    assert ports.feeds.events(tenant, 1, 5, 10) == []


def test_what_is_marked_fed_leaves_the_unfed_index(ports):
    job = ports.created()
    ports.feeds.mark_fed(job.job_id, ["created"])
    assert ports.feeds.unfed(job.job_id) == {}
    assert job.job_id not in ports.feeds.unfed_jobs(job.tenant, 100)


def test_a_feed_is_due_until_pushed_to_its_head(ports):
    job = ports.created()
    tenant = job.tenant
    head = ports.feeds.head(tenant)
    events, ms = numbered(ports, tenant, head, [(job.job_id, "created")])
    ports.feeds.append(tenant, head, ms, events, [(job.job_id, "created")])
    assert tenant in ports.feeds.push_due(1000)
    read = ports.feeds.head(tenant)
    ports.feeds.pushed(tenant, read, read.seq)
    assert ports.feeds.head(tenant).pushed == 1
    assert tenant not in ports.feeds.push_due(1000)
    ports.feeds.pushed(tenant, read, read.seq)  # a repeat changes nothing
    assert ports.feeds.head(tenant).pushed == 1


def test_marking_some_keeps_the_job_in_the_index_for_the_rest(ports):
    """Only the keys marked leave: a story event told after the sequencer's
    read (here, one it never read) keeps its job unfed."""
    job = ports.created()
    ports.feeds.mark_fed(job.job_id, ["placed#9"])
    assert list(ports.feeds.unfed(job.job_id)) == ["created"]
    assert job.job_id in ports.feeds.unfed_jobs(job.tenant, 100)


def test_marking_again_what_another_sequencer_marked_is_harmless(ports):
    """Two sequencers that met over the same job (one numbered, the other
    found it fed) both mark it: the second finds nothing left to take."""
    job = ports.created()
    ports.feeds.mark_fed(job.job_id, ["created"])
    ports.feeds.mark_fed(job.job_id, ["created"])
    assert ports.feeds.unfed(job.job_id) == {}
    assert job.job_id not in ports.feeds.unfed_jobs(job.tenant, 100)
