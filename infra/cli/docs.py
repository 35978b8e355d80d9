"""``ldpipe docs [TOPIC]``: the documentation that came with the install, in the terminal.

``--help`` and ``pipeline.toml`` point at pages of ``docs/``; a wheel install has no repository
beside it, so the pages ship as data of ``ldpipe.docs`` (``pyproject.toml``) and this command
reads them from there: with no topic, each page's name and title; with one, the page itself.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "pages", "run", "title"]


def _folders() -> list[Path]:
    """Where ``ldpipe.docs`` is: site-packages/ldpipe/docs from a wheel, the checkout's docs/
    from an editable install (whose namespace path also holds a placeholder that is no folder,
    which ``importlib.resources`` cannot read past on Python 3.11)."""
    spec = importlib.util.find_spec("ldpipe.docs")
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations if Path(p).is_dir()]


def pages() -> dict[str, Path]:
    """Topic (the page's file name without ``.md``) -> the page, sorted by topic."""
    found = {path.stem: path for folder in _folders() for path in folder.glob("*.md")}
    return dict(sorted(found.items()))


def title(page: Path) -> str:
    """The page's first heading, without its Markdown marks."""
    with page.open(encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("# "):
                return line[2:].strip().replace("`", "")
    return ""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "docs",
        help="the documentation installed with ldpipe: list its topics, or print one",
        description=(
            "Print a page of ldpipe's documentation (Markdown), read from the installed "
            "package: no repository or network needed. Without TOPIC, list the topics and "
            "their titles."
        ),
    )
    p.add_argument("topic", metavar="TOPIC", nargs="?", help="a topic of the list, e.g. cli")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    found = pages()
    if not found:
        raise ValueError(
            "no documentation is installed with this ldpipe (ldpipe/docs/ is missing); "
            "reinstall it from its wheel or checkout"
        )
    if args.topic is None:
        width = max(map(len, found)) + 2
        print("ldpipe's documentation (ldpipe docs TOPIC prints a page):")
        for topic, page in found.items():
            print(f"  {topic:<{width}}{title(page)}")
        return 0
    chosen = found.get(args.topic.removesuffix(".md").removeprefix("docs/"))
    if chosen is None:
        raise ValueError(f"no topic {args.topic!r}; the topics are: {', '.join(found)}")
    print(chosen.read_text(encoding="utf-8"), end="")
    return 0
