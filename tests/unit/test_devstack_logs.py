"""devstack/logs.py: on the stack's terminal a warning repeated word for word
prints once, then one "(repeated N times)" line when another message comes,
after a while, or at shutdown; other lines pass as they are."""
import io
import logging

import pytest

from devstack.logs import RepeatFilter, quiet_repeats

STALL = "stall scan convicts nobody this time: %s"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def terminal():
    """A logger with one handler, as the stack's, and what it printed."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger(f"test.devstack.logs.{id(out)}")
    logger.handlers, logger.propagate, logger.level = [handler], False, logging.INFO
    clock = Clock()
    quiet = RepeatFilter(handler.handle, every_s=60, clock=clock)
    handler.addFilter(quiet)

    def lines():
        return out.getvalue().splitlines()
    yield logger, quiet, clock, lines
    logger.handlers = []


def test_a_repeated_warning_prints_once_then_its_count_when_another_comes(terminal):
    logger, _, clock, lines = terminal
    for _ in range(80):
        logger.warning(STALL, "recovering...")
        clock.now += 5 / 80
    logger.warning("placement: node local-2 is DOWN")
    name = logger.name
    assert lines() == [
        f"WARNING {name} stall scan convicts nobody this time: recovering...",
        f"WARNING {name} stall scan convicts nobody this time: recovering... "
        "(repeated 79 times)",
        f"WARNING {name} placement: node local-2 is DOWN"]


def test_after_a_while_the_count_is_said_without_waiting_for_a_change(terminal):
    logger, quiet, clock, lines = terminal
    for _ in range(13):  # one every 10 s: 2 minutes
        logger.warning(STALL, "recovering...")
        clock.now += 10
    assert len(lines()) == 3
    assert lines()[1].endswith("recovering... (repeated 6 times)")   # 60 s after the first
    assert lines()[2].endswith("recovering... (repeated 6 times)")   # 60 s after that
    logger.warning(STALL, "recovering...")
    quiet.flush()  # at shutdown: the rest
    assert lines()[3].endswith("recovering... (repeated 1 time)")
    quiet.flush()
    assert len(lines()) == 4, "nothing left to say"


def test_a_different_argument_or_level_or_logger_is_a_different_line(terminal):
    logger, quiet, _, lines = terminal
    logger.warning(STALL, "recovering...")
    logger.warning(STALL, "collector paused")
    logger.error(STALL, "collector paused")
    logging.getLogger(logger.name + ".child").warning(STALL, "collector paused")
    quiet.flush()
    assert len(lines()) == 4 and not any("repeated" in ln for ln in lines())


def test_a_repeat_below_warning_is_not_held_back(terminal):
    logger, quiet, _, lines = terminal
    for _ in range(3):
        logger.info("placed job_1")
    quiet.flush()
    assert lines() == [f"INFO {logger.name} placed job_1"] * 3


def test_quiet_repeats_fits_every_handler_of_the_named_loggers_once():
    logger = logging.getLogger("test.devstack.logs.install")
    handler = logging.StreamHandler(io.StringIO())
    logger.handlers = [handler]
    try:
        first = quiet_repeats(logger.name)
        again = quiet_repeats(logger.name)
        assert first == again and len(first) == 1
        assert [f for f in handler.filters if isinstance(f, RepeatFilter)] == first
    finally:
        logger.handlers = []
