"""domain/stacks.bounded: a stored stack's size in bytes has a ceiling, so a
host's heartbeat item holds every rank's stack under DynamoDB's 400 KB."""
from datetime import datetime, timezone

from chalicelib.domain.stacks import MAX_STACK_BYTES, bounded
from chalicelib.domain.stall import received

NOW = datetime(2026, 12, 6, tzinfo=timezone.utc)


def _size(stack: dict) -> int:
    return sum(len(t.encode()) for t in [*stack["frames"], stack.get("code", "")])


def test_the_widest_ascii_stack_the_api_takes_is_kept_whole():
    """Invariant: 16 frames of 200 ASCII characters and a line of 200 are
    stored as sent: the ceiling only ever cuts wider characters."""
    stack = {"frames": [f"{'f' * 180} ({'x' * 12}.py:1)"[:200]] * 16, "code": "c" * 200,
             "age_s": 1.5}
    assert bounded(stack) == stack


def test_wide_characters_lose_the_outermost_frames_and_keep_the_innermost():
    """Invariant: what is kept is the innermost frames in order, the line and
    the age, and its UTF-8 size is within the ceiling."""
    frames = [f"f{i}_{chr(0x1F600) * 150} (train.py:{i})" for i in range(16)]
    stack = {"frames": frames, "code": "x = 1", "age_s": 2}
    kept = bounded(stack)
    assert 0 < len(kept["frames"]) < 16 and kept["frames"] == frames[:len(kept["frames"])]
    assert (kept["code"], kept["age_s"]) == ("x = 1", 2)
    assert _size(kept) <= MAX_STACK_BYTES < _size({**kept, "frames": frames[:len(kept["frames"]) + 1]})


def test_a_received_sample_is_stored_with_its_stack_bounded():
    frames = [f"{chr(0x4E2D) * 190} (a.py:1)"] * 16
    beat = received({"rank": 0, "proc": {"cpu": 0.0, "stack": {"frames": frames}}},
                    node_id="n", now=NOW)
    assert beat.proc is not None and _size(beat.proc["stack"]) <= MAX_STACK_BYTES
    assert beat.proc["cpu"] == 0.0 and beat.proc["stack"]["frames"][0] == frames[0]
