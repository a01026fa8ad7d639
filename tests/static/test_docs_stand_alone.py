"""The code, docs and tests cite public sources by name, never the project's build material outside
the repository (``../shared``), which a user of the repository never sees. Tests, the Makefile and
``make models`` may still read ``../shared`` (models, schemas, tools); only citations are checked."""

from __future__ import annotations

import re

from helpers import ROOT

# The spec notes and copies the project was built from: a citation of one of these is a dead link.
BUILD_MATERIAL = re.compile(
    r"\.\./shared|shared/spec|shared/design|[\w-]+-notes\b|design\.md|sie-http-api|kserve-v2-predict-protocol"
    r"|open-inference-(rest|grpc-reference)\.txt|mistralrs-http-semantics"
)
PRODUCT = ("kserve_v2", "transcoding", "adapters")
# Docs may say that `make models` copies from ../shared/models; they may not cite spec notes.
DOC_CITATION = re.compile(BUILD_MATERIAL.pattern.replace(r"\.\./shared|", ""))


def offending(pattern: re.Pattern[str], paths: list) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_product_code_cites_nothing_outside_the_repository() -> None:
    paths = [p for package in PRODUCT for p in sorted((ROOT / package).rglob("*.py"))] + sorted((ROOT / "protos").glob("*"))
    assert len(paths) > 50
    assert offending(BUILD_MATERIAL, paths) == []


def test_docs_cite_public_sources() -> None:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").glob("*.py")),
             *sorted(p for p in (ROOT / "tests").rglob("*.py") if p.name != "test_docs_stand_alone.py")]
    assert offending(DOC_CITATION, paths) == []


def test_the_check_finds_a_citation() -> None:
    assert BUILD_MATERIAL.search("follows ``hardening-notes.md`` section 4")
    assert BUILD_MATERIAL.search("# the upper half of the float32 (triton-protocol-notes 2.1)")
    assert BUILD_MATERIAL.search("see ../shared/spec/sie-http-api.txt")
    assert not DOC_CITATION.search("`make models` copies them from `../shared/models`")
