"""The documentation holds together: every relative link in README.md, BENCHMARKS.md and docs/*.md points to a file
that exists (and, for ``page.md#anchor``, to a heading of that page, by GitHub's anchor rule); the README stays
short and starts with its two commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250

_FENCE = re.compile(r"^(```|~~~)")
_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link or a heading inside one is an example, not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), blanks to ``-``."""
    text = heading.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown text; a repeated one also as ``name-1``, ``name-2``, ... as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(text):
        match = _HEADING.match(line)
        if not match:
            continue
        name = slug(match.group(1))
        count = seen.get(name, 0)
        seen[name] = count + 1
        out.add(name if count == 0 else f"{name}-{count}")
    return out


def links(text: str) -> list[str]:
    """The targets of the inline links and images in the prose (not in code blocks or code spans)."""
    found = []
    for line in _prose(text):
        found += _LINK.findall(_CODE_SPAN.sub("", line))
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that lead nowhere, each with why."""
    bad = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ... not this repository's
            continue
        path_text, _, anchor = target.partition("#")
        dest = (page.parent / path_text).resolve() if path_text else page
        if not dest.exists():
            bad.append(f"{target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading with the anchor #{anchor} in {dest.name}")
    return bad


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_check_finds_a_missing_file_a_missing_anchor_and_ignores_code(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## The `--rdzv-conf` keys\n\n```\n# not a heading\n```\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/other.md) [ok](docs/other.md#the---rdzv-conf-keys) [ok](#top) [web](https://example.com/x.md)\n"
        "[gone](docs/missing.md) [no anchor](docs/other.md#not-a-heading)\n"
        "`[in a span](nowhere.md)`\n```\n[in a block](nowhere.md)\n```\n# Top\n"
    )
    assert broken_links(page) == [
        f"docs/missing.md: no such file {tmp_path / 'docs' / 'missing.md'}",
        "docs/other.md#not-a-heading: no heading with the anchor #not-a-heading in other.md",
    ]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("`rankrun --stacks`: stacks on demand", "rankrun---stacks-stacks-on-demand"),
    ("The legacy `torch.distributed.launch`", "the-legacy-torchdistributedlaunch"),
    ("NCCL's Flight Recorder", "nccls-flight-recorder"),
    ("Exit codes for `podFailurePolicy`", "exit-codes-for-podfailurepolicy"),
])
def test_anchors_follow_githubs_rule(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_repeated_heading_gets_a_numbered_anchor() -> None:
    assert anchors("# Notes\n## Notes\n## Notes\n") == {"notes", "notes-1", "notes-2"}


def test_the_readme_is_short_and_starts_with_its_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert "rankrun --standalone" in blocks[0] and "examples/allreduce.py" in blocks[0]
    assert blocks[1].strip() == "bash scripts/test"
    assert text.index(blocks[0]) < text.index("\n## ", text.index("## ") + 1)  # in the first section
