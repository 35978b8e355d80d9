"""Every exception a command meets, as one line naming the problem and the fix, and its exit code.

``ldpipe`` promises that no traceback reaches a user: :func:`explain` turns an exception into
``(line, exit code)`` for ``main()`` (and for a background thread's failure, through
:func:`install_thread_hook`). ldpipe's own errors already say what to do, so their message is the
line; foreign errors the code could not wrap where they arose (a missing file, a dead broker, a
damaged sketch store, a Rust panic in delta-rs) get a line that names the likely cause and the
fix; anything else is ``<what> (<ExceptionType>); run with -v for the traceback``.

Exit codes: 2 for bad usage and values (``ValueError``, argparse's own), 1 for run-time
failures, 130 for Ctrl-C (quietly), as ``docs/cli.md`` states. Foreign libraries are matched
only once imported (``sys.modules``), so ``ldpipe --help`` loads none of them.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import tomllib
from dataclasses import dataclass
from typing import Any

from ldpipe.infra.storage.disk import disk_error_kind, disk_full_message
from ldpipe.infra.storage.engine import engine_errors, is_engine_panic
from ldpipe.schemas.errors import LdpipeError

__all__ = ["Failure", "ThreadFailures", "explain", "install_thread_hook"]

USAGE, RUNTIME, INTERRUPTED = 2, 1, 130
_TRACE = "run with -v for the traceback"
_LONGEST = 400  # characters of a foreign message kept in the line
_FRAME = re.compile(r"\s+\d+: ")


@dataclass(frozen=True)
class Failure:
    """What a command prints on stderr (one line, without the ``ldpipe CMD: error:`` prefix)
    and the exit code it returns."""

    message: str
    code: int


def _first_line(exc: BaseException, *, shorten: bool = True) -> str:
    """The exception's own words on one line, without the Rust backtrace delta-rs may append
    (lines `` 0: <frame>``), shortened."""
    kept = []
    for line in str(exc).strip().splitlines():
        if _FRAME.match(line):
            break
        kept.append(line)
    text = " ".join(" ".join(kept).split())
    if not text and isinstance(exc, KeyError | IndexError) and exc.args:
        text = repr(exc.args[0])
    if shorten and len(text) > _LONGEST:  # a foreign library's words; ldpipe's are kept whole
        text = text[: _LONGEST - 3] + "..."
    return text or "(no message)"


def _kind(exc: BaseException) -> str:
    return type(exc).__name__


def _loaded(module: str, *names: str) -> tuple[type[BaseException], ...]:
    """The classes ``names`` of ``module`` if it is imported already (else none can match)."""
    found = sys.modules.get(module)
    if found is None:
        return ()
    return tuple(getattr(found, name) for name in names if hasattr(found, name))


def _kafka(exc: BaseException) -> Failure | None:
    kafka = _loaded("confluent_kafka", "KafkaException")
    if not kafka or not isinstance(exc, kafka):
        return None
    error: Any = exc.args[0] if exc.args else None
    fenced = _fenced(error)
    if fenced is not None:
        return fenced
    what = f"{error.name()}: {error.str()}" if hasattr(error, "str") else _first_line(exc)
    return Failure(
        f"Kafka failed: {what}; check [kafka] bootstrap_servers in the configuration (or "
        f"--bootstrap-servers) and that the broker is running and reachable",
        RUNTIME,
    )


def _fenced(error: Any) -> Failure | None:
    """A transactional producer fenced by a newer one with its ``transactional.id``
    (``_FENCED``, ``PRODUCER_FENCED``; KIP-98): another instance took over, so this one must
    not go on, and restarting it would fence the other in turn."""
    names = ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
    name = error.name() if hasattr(error, "name") else ""
    if name not in names:
        return None
    from ldpipe.infra.runtime.clients import transactional_ids

    ids = transactional_ids()
    which = f"transactional id {ids[-1]!r}" if ids else "this transactional id"
    return Failure(  # worded as the run loop's FencedError (infra/runtime/transactions.py)
        f"another instance took over {which} (this producer was fenced: {name}); "
        f"this one stopped without committing, so nothing is lost or counted twice. If that "
        f"was not meant, two configurations share the broker, the use case and --instance: "
        f"stop one, or give each its own [kafka] bootstrap_servers or --instance",
        RUNTIME,
    )


def _store(exc: BaseException) -> Failure | None:
    """The table engine's and Arrow's errors that escaped the sketch store's own translation
    (``StoreDamagedError``, which says the same): a table is unreadable or damaged."""
    foreign = engine_errors() + _loaded("pyarrow.lib", "ArrowException")
    if not (foreign and isinstance(exc, foreign)) and not is_engine_panic(exc):
        return None
    what = "delta-rs panicked" if is_engine_panic(exc) else "a table could not be read"
    return Failure(
        f"{what}: {_first_line(exc)} ({_kind(exc)}); if it is a sketch store, `ldpipe store "
        f"verify --config FILE` names its damaged files and `ldpipe store repair` rolls it back "
        f"to its newest whole version (or restore it from a backup, or rebuild it with "
        f"`ldpipe replay`)",
        RUNTIME,
    )


def _disk_full(exc: BaseException) -> Failure | None:
    """A full disk (or quota, or a read-only file system) that no writer wrapped in
    ``infra/storage/disk.py``'s :class:`DiskFullError` (whose message is the line already),
    whoever raised it (Python, Arrow, delta-rs): the path and the fix, not a damaged-store
    diagnosis."""
    kind = disk_error_kind(exc)
    if isinstance(exc, LdpipeError) or kind is None:
        return None
    path = getattr(exc, "filename", None)
    resume = "what was committed before is whole and a restart resumes from it"
    if path is not None:
        setting = "the setting that puts it there"
        message = disk_full_message(path, what="", setting=setting, resume=resume, kind=kind)
        return Failure(message, RUNTIME)
    return Failure(
        f"no space left on the device ({_first_line(exc)}; {_kind(exc)}); free space on that "
        f"file system (or move what is written there elsewhere), then start it again: {resume}",
        RUNTIME,
    )


def _os(exc: OSError) -> Failure:
    path = exc.filename if exc.filename is not None else None
    where = f"{path}: " if path is not None else ""
    why = exc.strerror or _first_line(exc)
    if isinstance(exc, FileNotFoundError):
        fix = (
            "create it, or correct the option or configuration entry that names it "
            "(`ldpipe init DIR` writes a starter configuration and its keys)"
        )
    elif isinstance(exc, PermissionError):
        fix = "give the user running ldpipe access to it, or choose another path"
    elif isinstance(exc, IsADirectoryError | NotADirectoryError):
        fix = "a file and a directory were confused: check the path"
    elif isinstance(exc, ConnectionError):
        fix = "check that the server it connects to is running and reachable"
    else:
        fix = "check the path, the disk and the network"
    return Failure(f"{where}{why} ({_kind(exc)}); {fix}", RUNTIME)


def explain(exc: BaseException) -> Failure:
    """The one line (without the ``ldpipe CMD: error:`` prefix) and exit code for ``exc``."""
    if isinstance(exc, KeyboardInterrupt):
        return Failure("interrupted", INTERRUPTED)
    for special in (_disk_full, _kafka, _store):
        found = special(exc)
        if found is not None:
            return found
    if isinstance(exc, json.JSONDecodeError):
        return Failure(
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"({_kind(exc)}); fix or regenerate the file ({_TRACE} to see which)",
            USAGE,
        )
    if isinstance(exc, tomllib.TOMLDecodeError):
        return Failure(f"malformed TOML: {_first_line(exc)}; fix the configuration file", USAGE)
    if isinstance(exc, LdpipeError) and not isinstance(exc, ValueError):
        return Failure(_first_line(exc, shorten=False), RUNTIME)  # it says what to do
    if isinstance(exc, ValueError):  # validation errors name the problem and the fix
        return Failure(_first_line(exc, shorten=False), USAGE)
    if isinstance(exc, TimeoutError):
        return Failure(
            f"timed out: {_first_line(exc)} ({_kind(exc)}); what it waited for did not happen "
            f"in time: check that the services and the broker it needs are running",
            RUNTIME,
        )
    if isinstance(exc, OSError):
        return _os(exc)
    if isinstance(exc, MemoryError):
        return Failure(
            "out of memory (MemoryError); ask for less at once (a smaller --n, range or sketch)",
            RUNTIME,
        )
    return Failure(f"{_first_line(exc)} ({_kind(exc)}); {_TRACE}", RUNTIME)


class ThreadFailures:
    """The first exception a background thread died of, for ``main()`` to exit 1 with."""

    def __init__(self) -> None:
        self.first: BaseException | None = None


def install_thread_hook(command: str, failures: ThreadFailures, verbose: bool) -> None:
    """Replace ``threading.excepthook``: a background thread that dies prints one line (and its
    traceback with -v), not Python's traceback, and interrupts the main thread (SIGINT: a
    service stops as on Ctrl-C), so the command ends with exit 1 instead of running half dead."""
    import _thread
    import signal
    import traceback

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or isinstance(args.exc_value, SystemExit):
            return
        if failures.first is None:
            failures.first = args.exc_value
        name = args.thread.name if args.thread is not None else "a thread"
        if verbose:
            traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback)
        failure = explain(args.exc_value)
        print(f"ldpipe {command}: error: in {name}: {failure.message}", file=sys.stderr)
        _thread.interrupt_main(signal.SIGINT)

    threading.excepthook = hook
