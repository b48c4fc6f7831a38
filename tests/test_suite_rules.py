"""Rules the test suite keeps: its tests can share one moto server, and no
file imports a conftest module (shared helpers live in tests/support)."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
IN_PROCESS_MOCK = re.compile(r"\bmock_aws\b|\bmock_dynamodb\b|\bmock_sqs\b")
#: `from tests.x.conftest import`, `from .conftest import`, `import tests.x.conftest`,
#: `from tests.x import conftest`, at the start of a line (indented too)
CONFTEST_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+[\w.]*\bconftest[ \t]+import\b"
    r"|import[ \t]+[\w.]*\bconftest\b"
    r"|from[ \t]+[\w.]+[ \t]+import[ \t]+(?:\([\w\s,]*|[\w \t,]*)\bconftest\b)", re.M)


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


def conftest_importers(root: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  if p.name != pathlib.Path(__file__).name
                  and CONFTEST_IMPORT.search(p.read_text(encoding="utf-8")))


def test_no_file_imports_a_conftest_module():
    """Fixtures are found by pytest, never imported. What tests of several
    folders share lives in tests/support, what one folder's tests share in a
    module of that folder; a conftest.py holds fixtures (and hooks) only."""
    assert conftest_importers(ROOT / "tests") == []


def test_the_rule_finds_a_conftest_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "test_a.py").write_text("from tests.agent.conftest import wait_until\n")
    (tmp_path / "pkg" / "test_b.py").write_text("def f():\n    from .conftest import x\n")
    (tmp_path / "test_c.py").write_text("import tests.client.conftest as c\n")
    (tmp_path / "test_d.py").write_text("from tests.browser import (\n    ui,\n    conftest,\n)\n")
    (tmp_path / "test_e.py").write_text(
        "from tests.support.waits import wait_until\n"
        "# fixtures come from tests/agent/conftest.py\n"
        "def conftest_of(folder): ...\n"
        "def test_e(world): ...\n")
    assert conftest_importers(tmp_path) == ["pkg/test_b.py", "test_a.py", "test_c.py",
                                            "test_d.py"]
