"""What both demos share: a work directory, the embedded broker, progress lines, clean-up."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ldpipe.infra.runtime.broker import EmbeddedBroker

__all__ = ["demo_broker", "progress"]


def progress(args: argparse.Namespace) -> Callable[[str], None]:
    """Print a progress line to stderr, unless ``--json``."""

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    return say


@contextmanager
def demo_broker(
    args: argparse.Namespace, say: Callable[[str], None]
) -> Iterator[tuple[Path, EmbeddedBroker]]:
    """A work directory (``--keep DIR``, else a temporary one removed afterwards, unless the
    demo failed: its services' logs are there) and the embedded broker logging into it,
    running until the block ends."""
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="ldpipe-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        with EmbeddedBroker(log_dir=workdir) as broker:
            say(f"broker    {broker.bootstrap_servers} (embedded, in memory)")
            yield workdir, broker
    except Exception:  # Ctrl-C cleans up; a failure keeps the logs
        failed = True
        raise
    finally:
        if not args.keep and not failed:
            shutil.rmtree(workdir, ignore_errors=True)
