"""The create path's fleet cache (service/jobs.py:RecentFleets) keeps time by
the service's clock, so a clock a test or a bench moves (bench/op_counts.py)
moves it too: its reads do not depend on how fast the machine runs."""
from chalicelib.domain.fleet import Fleet
from chalicelib.service.jobs import FLEET_TTL_S, RecentFleets
from tests.clock import FakeClock


def _cache(clock: FakeClock):
    reads: list[str | None] = []

    def read(gpu_type: str | None) -> Fleet:
        reads.append(gpu_type)
        return Fleet(key=gpu_type or "*")
    return RecentFleets(read, clock), reads


def test_a_fleet_is_read_again_only_after_the_ttl_on_the_services_clock():
    clock = FakeClock()
    fleets, reads = _cache(clock)
    fleets("h100"), fleets("h100")
    clock.advance(FLEET_TTL_S)
    fleets("h100")
    assert reads == ["h100"], "within the TTL: one read"
    clock.advance(0.001)
    fleets("h100"), fleets("a100")
    assert reads == ["h100", "h100", "a100"]


def test_a_clock_that_went_back_reads_again():
    clock = FakeClock()
    fleets, reads = _cache(clock)
    fleets("h100")
    clock.advance(-60)
    fleets("h100")
    assert reads == ["h100", "h100"]


def test_forget_reads_again():
    fleets, reads = _cache(FakeClock())
    fleets("h100")
    fleets.forget("h100")
    fleets("h100")
    assert reads == ["h100", "h100"]
