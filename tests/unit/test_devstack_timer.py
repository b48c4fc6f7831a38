"""The local timers start runs at fixed period boundaries, as EventBridge does:
a slow run does not push the next start back a whole period (which would look
like a collector pause to the stall scan)."""
import threading
import time

from devstack.__main__ import Timer, next_period_start


def test_next_start_stays_on_the_grid_after_a_slow_run():
    assert next_period_start(10.0, 5.0, 13.0) == 15.0  # run took 3 s: wait 2, not 5
    assert next_period_start(10.0, 5.0, 10.1) == 15.0
    assert next_period_start(10.0, 5.0, 21.0) == 25.0  # overran two periods: skip them


def test_slow_runs_start_at_fixed_period_starts():
    starts: list[float] = []
    stop = threading.Event()

    def slow(event, context):
        starts.append(time.monotonic())
        if len(starts) >= 4:
            stop.set()
        time.sleep(0.12)

    t = Timer("slow", 0.2, slow, stop)
    t.start()
    t.join(10)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) == 3
    # waiting a period after each run would make every gap 0.32 s
    assert all(g < 0.28 for g in gaps), gaps


def test_a_shorter_period_set_on_a_running_timer_applies_within_half_a_second():
    """Invariant (devstack/settings.py): a test that sets a shorter scan period
    on the shared stack does not wait out the period the stack started with."""
    from tests.support.waits import wait_until

    runs: list[float] = []
    stop = threading.Event()
    t = Timer("set", 3600, lambda event, context: runs.append(time.monotonic()), stop)
    t.start()
    try:
        set_at = time.monotonic()
        t.set_period(0.05)
        wait_until(lambda: len(runs) >= 3, timeout=30, what="three runs at the new period")
        assert runs[0] - set_at < 5, "the hour's wait was cut to the new period"
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()
