"""The documentation stays true to the repository: docs/api.md covers every
operation of docs/openapi.yaml, and the READMEs and docs link only to files
inside the repository (no link points outside it, none is broken)."""
from __future__ import annotations

import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted({ROOT / "README.md", ROOT / "client" / "README.md", ROOT / "agent" / "README.md",
               *(ROOT / "docs").glob("*.md")})
METHODS = ("get", "put", "post", "patch", "delete")
# [text](target) outside code spans and fences
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def operations() -> list[tuple[str, str]]:
    spec = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
    return [(m.upper(), path) for path, ops in spec["paths"].items() for m in ops
            if m in METHODS]


def prose(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to -."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", prose_keep_headings(text), re.M)}


def prose_keep_headings(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def test_the_api_reference_covers_every_operation_of_the_openapi_document():
    text = (ROOT / "docs" / "api.md").read_text()
    headings = set(re.findall(r"^#+ `(GET|PUT|POST|PATCH|DELETE) (/\S*)`$", text, re.M))
    missing = [f"{m} {p}" for m, p in operations() if (m, p) not in headings]
    assert len(operations()) >= 14
    assert not missing, f"docs/api.md has no heading for: {missing}"
    unknown = [f"{m} {p}" for m, p in headings if (m, p) not in set(operations())]
    assert not unknown, f"docs/api.md documents operations the API does not have: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(doc):
    links = LINK.findall(prose(doc.read_text()))
    bad = []
    for target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            bad.append(f"{target}: points outside the repository")
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.is_relative_to(ROOT) or not file.exists():
            bad.append(f"{target}: no such file in the repository")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            bad.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not bad, f"{doc.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_link_check_can_fail(tmp_path):
    """The checker itself: an outside link, a missing file and a missing anchor."""
    doc = "[a](https://example.com) [b](nope.md) [c](README.md#no-such-heading) [d](#ok)\n# ok\n"
    found = LINK.findall(prose(doc))
    assert found == ["https://example.com", "nope.md", "README.md#no-such-heading", "#ok"]
    assert "no-such-heading" not in anchors((ROOT / "README.md").read_text())
    assert "quickstart-with-the-cli" in anchors((ROOT / "README.md").read_text())
