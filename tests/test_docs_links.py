"""Every relative link in the project's Markdown points at a file that exists and, with a
``#fragment``, at a heading of that file (GitHub's anchor rules): docs that move stay linked."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.repo_files import repository_files

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".git", "node_modules", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def markdown_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.md") if not SKIP.intersection(p.relative_to(ROOT).parts))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()  # a link's text
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for line in text.splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def links(path: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    return [m.group(1) for m in LINK.finditer(text)]


def test_slugs_follow_github() -> None:
    assert slug("`ldpipe privacy report`") == "ldpipe-privacy-report"
    assert slug("Per shuffled window: amplification by shuffling") == (
        "per-shuffled-window-amplification-by-shuffling"
    )
    assert slug("`--serve`: Prometheus gauges") == "--serve-prometheus-gauges"
    assert slug("`[use_case.topics]`") == "use_casetopics"
    assert slug("Figures (2026-11-22, 2 shared cores)") == "figures-2026-11-22-2-shared-cores"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.name}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_scan_sees_the_links() -> None:
    # a pattern that silently matched nothing would pass every file above
    found = [target for path in markdown_files() for target in links(path)]
    assert len(found) > 200 and sum("#" in target for target in found) > 120
    assert links(ROOT / "infra" / "monitoring" / "README.md")[0] == (
        "../../docs/operations.md#monitoring"
    )


# A file named in prose, a docstring or a comment: a path under a top-level folder of the
# repository ending in .md (``docs/query.md``, ``schemas/store.md``), or an upper-case Markdown
# name (a design or contributing note) with or without a folder; another project's file, named
# with its owner ("librdkafka's CONFIGURATION.md"), is that project's to keep.
CITED_PATH = re.compile(
    r"(?<![\w./-])((?:docs|schemas|infra|tests|benchmarks|aggregator|producers|shuffler|discovery)"
    r"/[\w./-]*?\.md)(?![\w-])"
)
CITED_NOTE = re.compile(r"(?<![\w./-])(?<!'s )([A-Z][A-Z0-9_-]*\.md)(?![\w-])")
CITING = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".txt", ".cfg", ".ini", ".json", ".j2"}


def cited(text: str) -> list[str]:
    """The Markdown files ``text`` names, by path or as an upper-case note."""
    return [m.group(1) for m in CITED_PATH.finditer(text)] + [
        m.group(1) for m in CITED_NOTE.finditer(text)
    ]


def resolves(name: str, citing: Path) -> bool:
    """A path names a file from the root; an upper-case note may also sit beside its citer."""
    if (ROOT / name).is_file():
        return True
    return "/" not in name and (citing.parent / name).is_file()


def test_the_citation_scan_sees_citations() -> None:
    note = "DESIGN" + ".md"  # spelled apart so that this file cites nothing missing itself
    text = f"see docs/query.md and ``schemas/store.md``, (docs/cli.md#x) and {note}'s table"
    assert cited(text) == ["docs/query.md", "schemas/store.md", "docs/cli.md", note]
    assert cited("tests/test_docs_links.py, docs/*.md, mydocs/query.md, x's NOTES.md") == []
    assert not resolves(note, ROOT / "README.md")
    assert resolves("README.md", ROOT / "infra" / "monitoring" / "x.yml")


def test_every_cited_file_exists() -> None:
    """The project stands on its own files: every ``docs/*.md``, ``schemas/*.md`` or note a
    file of the repository names, in code, docstrings, comments or docs, is in the repository."""
    missing = []
    scanned = 0
    for name in repository_files():
        path = ROOT / name
        if path.suffix not in CITING:
            continue
        scanned += 1
        text = path.read_text(encoding="utf-8", errors="replace")
        for target in cited(text):
            if not resolves(target, path):
                line = text.count("\n", 0, text.index(target)) + 1
                missing.append(f"{name}:{line} cites {target}, which is not in the repository")
    assert scanned > 200, "the scan found almost no files to read"
    assert not missing, "\n".join(missing)
