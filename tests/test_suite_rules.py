"""Rules the test suite keeps so that its tests can share one moto server."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
IN_PROCESS_MOCK = re.compile(r"\bmock_aws\b|\bmock_dynamodb\b|\bmock_sqs\b")


def offenders(root: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  if p.name != pathlib.Path(__file__).name
                  and IN_PROCESS_MOCK.search(p.read_text(encoding="utf-8")))


def test_no_test_starts_motos_in_process_mock():
    """Its exit resets moto's backends, which the session's moto server (in the
    same process) shares with every other test of the xdist worker: the next
    tests then find no tables. A test wants a stage of its own on that server."""
    assert offenders(ROOT / "tests") == []


def test_the_rule_finds_an_in_process_mock(tmp_path):
    (tmp_path / "test_x.py").write_text("from moto import mock_aws\n")
    (tmp_path / "test_y.py").write_text("def test_y(moto_server): ...\n")
    assert offenders(tmp_path) == ["test_x.py"]
