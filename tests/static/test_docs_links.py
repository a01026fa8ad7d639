"""The README and docs/ hold together: every relative link resolves (the file, and the heading a
``#fragment`` names), every docs page opens with its title and a paragraph of its own, and the
README's documentation index lists every page."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text without code blocks and code spans, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: its text lowercased, punctuation other than - and _ dropped,
    spaces made hyphens (links and code keep only their text)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 ... suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = anchor(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``page`` that resolves to nothing, named with the page's path under ``root``."""
    broken = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
            continue
        path, _, fragment = unquote(target).partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{page.relative_to(root)}: {target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{page.relative_to(root)}: {target}: no such heading")
    return broken


def test_every_relative_link_resolves() -> None:
    assert len(PAGES) > 10
    assert [problem for page in PAGES for problem in broken_links(page)] == []


def test_every_docs_page_opens_with_its_title_and_a_paragraph() -> None:
    """A page reached from a search says what it is about before anything else."""
    for page in PAGES[1:]:
        blocks = [b for b in page.read_text(encoding="utf-8").split("\n\n") if b.strip()]
        assert blocks[0].startswith("# ") and "\n" not in blocks[0].strip(), page.name
        assert not blocks[1].lstrip().startswith(("#", "```", "|", "-", "*")), f"{page.name}: no opening paragraph"


def test_the_readme_indexes_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {Path(target.partition("#")[0]).name for target in LINK.findall(prose(readme))
              if target.startswith("docs/")}
    assert linked >= {page.name for page in PAGES[1:]}


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    assert anchor("Worker replicas (`--workers`)") == "worker-replicas---workers"
    assert anchor("The `python` backend: [BLS](x.md)") == "the-python-backend-bls"
    page = tmp_path / "page.md"
    page.write_text("# T\n\n## Here\n\n[a](#here) [b](#gone) [c](missing.md) `[d](missing.md)`\n", encoding="utf-8")
    problems = [p.split(": ", 1)[1] for p in broken_links(page, tmp_path)]
    assert problems == ["#gone: no such heading", "missing.md: no such file"]

