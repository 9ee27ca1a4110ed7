"""Every relative link in README.md, docs/*.md and benchmarks/*.md must resolve: the file exists and a `#anchor`
names a heading of the target file (GitHub's slugs). The docs are a map; a dead link is a
wrong turn that no other test would notice."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "benchmarks").glob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code removed (links there are not links)."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file; repeated headings get -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    out = set()
    in_fence = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            out.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return out


def broken_links(md: Path) -> list[str]:
    """The relative links of one markdown file that do not resolve, as 'target (why)'."""
    broken = []
    for line in prose_lines(md.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            path_part, _, anchor = target.partition("#")
            dest = (md.parent / path_part).resolve() if path_part else md
            if not dest.exists():
                broken.append(f"{target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(md: Path) -> None:
    assert broken_links(md) == []


def test_checker_finds_broken_links(tmp_path: Path) -> None:
    """The checker itself: a missing file and a missing anchor are reported; good links, links in
    code and external links are not."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Keys: `a.b` (2026-11-23)\n\n## Keys: `a.b` (2026-11-23)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Local part\n\n"
        "[ok](other.md) [ok](other.md#other-page) [ok](other.md#keys-ab-2026-11-23-1) [ok](#local-part)\n"
        "[web](https://example.org/x.md#nope) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n# not a heading\n```\n"
        "[bad file](missing.md) [bad anchor](other.md#keys) [bad local](#not-a-heading)\n"
    )
    assert broken_links(page) == [
        "missing.md (no such file)",
        "other.md#keys (no heading #keys in other.md)",
        "#not-a-heading (no heading #not-a-heading in page.md)",
    ]


def test_readme_is_a_map() -> None:
    """The README stays a short map; details belong on the docs pages."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
