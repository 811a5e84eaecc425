#!/usr/bin/env python3
"""Checks the README and the book (docs/) for links that lead nowhere: every relative link's file
exists, every `#anchor` names a heading of its page (as GitHub and mdBook make ids), and every
page of docs/ is in docs/SUMMARY.md (so the built book has it; its entries are links too).
Exits 1 listing each problem. `--self-test` shows it failing on a tree with one of each.

    python3 scripts/check_docs.py [ROOT]
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def heading_ids(text: str) -> set[str]:
    """The ids GitHub and mdBook give a page's headings: lower case, punctuation but `-` and `_`
    dropped, spaces as `-`; a repeated one gets `-1`, `-2`..."""
    ids: set[str] = set()
    for _, line in prose_lines(text):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        title = re.sub(r"`|\*\*|\*|\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))
        base = "".join(c for c in title.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")
        slug, n = base, 0
        while slug in ids:
            n += 1
            slug = f"{base}-{n}"
        ids.add(slug)
    return ids


def check(root: Path) -> list[str]:
    problems = []
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    for page in pages:
        if not page.exists():
            continue
        for number, line in prose_lines(page.read_text()):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                where = f"{page.relative_to(root)}:{number}"
                dest = (page.parent / path).resolve() if path else page
                if not dest.exists():
                    problems.append(f"{where}: {target}: no file {path}")
                    continue
                if anchor and dest.suffix == ".md" and anchor not in heading_ids(dest.read_text()):
                    problems.append(f"{where}: {target}: no heading #{anchor} in {path or page.name}")
    summary = root / "docs" / "SUMMARY.md"
    if summary.exists():
        listed = {
            (summary.parent / t).resolve()
            for _, line in prose_lines(summary.read_text())
            for t in LINK.findall(line)
        }
        for page in sorted((root / "docs").glob("*.md")):
            if page.name != "SUMMARY.md" and page.resolve() not in listed:
                problems.append(f"docs/{page.name}: not in docs/SUMMARY.md, so not in the book")
    return problems


def self_test() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        (root / "README.md").write_text(
            "# T\n[ok](docs/a.md#the-files) [gone](docs/missing.md) [bad](docs/a.md#nowhere)\n"
            "```\n[in code](nowhere.md)\n```\n")
        (root / "docs" / "a.md").write_text("# A\n## The `files`\n")
        (root / "docs" / "orphan.md").write_text("# O\n")
        (root / "docs" / "SUMMARY.md").write_text("# Summary\n- [A](a.md)\n- [B](b.md)\n")
        found = check(root)
        expected = ["missing.md", "#nowhere", "b.md: no file", "orphan.md: not in"]
        missed = [e for e in expected if not any(e in p for p in found)]
        if missed or len(found) != len(expected):
            print(f"self-test failed: expected {expected}, found {found}", file=sys.stderr)
            return 1
    print("self-test: the four planted problems were found, and nothing else")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} broken link(s) in the docs", file=sys.stderr)
        return 1
    print("the README's and the book's links hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
