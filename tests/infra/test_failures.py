"""The last-resort handler of ``ldpipe`` (``infra/cli/failures.py``, ``main()``): an exception of
each kind is one line naming the problem and the fix, with its exit code; ``-v`` adds the
traceback; Ctrl-C is exit 130 and quiet; a background thread's death is one line too."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from ldpipe.infra.cli.failures import ThreadFailures, explain, install_thread_hook
from ldpipe.infra.cli.main import main
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.errors import SnapshotError


def _raised(action: object) -> BaseException:
    try:
        action()  # type: ignore[operator]
    except BaseException as exc:
        return exc
    raise AssertionError("nothing was raised")


def _garbled_table(root: Path) -> DeltaError:
    log = root / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text('{"protocol": {"minRe', "utf-8")
    exc = _raised(lambda: DeltaTable(str(root)))
    assert isinstance(exc, DeltaError)
    return exc


class PanicException(BaseException):
    """Stands for pyo3's ``pyo3_runtime.PanicException``, which Python code cannot raise at
    will: a BaseException matched by its name."""


def test_each_kind_of_exception_is_one_line_with_its_exit_code(tmp_path: Path) -> None:
    missing = _raised(lambda: (tmp_path / "nope.json").read_text())
    cases: list[tuple[BaseException, int, str]] = [
        (ConfigError("k must be positive; set k = 1024"), 2, "k must be positive; set k = 1024"),
        (SnapshotError("snapshot x is truncated; delete it"), 1, "snapshot x is truncated"),
        (ValueError("--top: must be 1 or more"), 2, "--top: must be 1 or more"),
        (TimeoutError("timed out after 120 s"), 1, "timed out: timed out after 120 s"),
        (missing, 1, f"{tmp_path / 'nope.json'}: No such file or directory (FileNotFoundError)"),
        (PermissionError(13, "Permission denied", "/etc/x"), 1, "give the user running ldpipe"),
        (KeyError("emoji"), 1, "'emoji' (KeyError); run with -v for the traceback"),
        (
            KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused")),
            1,
            "bootstrap_servers",
        ),
        (_garbled_table(tmp_path / "table"), 1, "ldpipe store verify"),
        (PanicException("assertion failed"), 1, "delta-rs panicked: assertion failed"),
        (_raised(lambda: json.loads("{")), 2, "malformed JSON"),
        (_raised(lambda: tomllib.loads("a = ")), 2, "malformed TOML"),
        (RuntimeError("line one\nline two"), 1, "line one line two (RuntimeError)"),
        (OSError("Kernel error\n   0: <unknown>\n   1: clone3"), 1, "Kernel error (OSError)"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ]
    for exc, code, words in cases:
        failure = explain(exc)
        assert failure.code == code, (exc, failure)
        assert words in failure.message, (exc, failure)
        assert "\n" not in failure.message, (exc, failure)


def test_main_prints_one_line_and_with_v_the_traceback_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "nowhere.toml"
    assert main(["store", "list", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"ldpipe store: error: configuration file {config} does not exist")
    assert main(["-v", "store", "list", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1].startswith("ldpipe store: error: configuration file")


def test_a_damaged_store_is_one_line_naming_it_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _garbled_table(tmp_path / "store" / "emoji")
    config = tmp_path / "pipeline.toml"
    config.write_text(
        "[[use_case]]\nname='emoji'\nmechanism='cms'\nepsilon=4.0\nk=16\nm=32\n"
        "[use_case.store]\nuri='store'\n",
        encoding="utf-8",
    )
    assert main(["store", "list", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"ldpipe store: error: cannot read the sketch store {tmp_path}/store")
    assert "`ldpipe store verify` names the damaged files" in err


def test_a_dying_background_thread_is_one_line_and_stops_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failures = ThreadFailures()
    previous = threading.excepthook
    # as in a fresh process: an in-process service test earlier in this worker may have left its
    # stop handler on SIGINT (stop_on_signals), which interrupt_main would call instead
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    install_thread_hook("shuffler", failures, verbose=False)
    try:
        with pytest.raises(KeyboardInterrupt):  # interrupt_main: the command stops as on Ctrl-C
            empty: dict[str, int] = {}
            thread = threading.Thread(target=lambda: empty["missing"], name="ldpipe-progress")
            thread.start()
            thread.join()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        threading.excepthook = previous
        signal.signal(signal.SIGINT, previous_sigint)
    assert isinstance(failures.first, KeyError)
    err = capsys.readouterr().err
    assert err == (
        "ldpipe shuffler: error: in ldpipe-progress: 'missing' (KeyError); run with -v for the "
        "traceback\n"
    )


def test_ctrl_c_exits_130_quietly() -> None:
    """A real command interrupted as a terminal's Ctrl-C would (SIGINT): its own start line,
    then nothing (no traceback, no error line)."""
    # as from a terminal: SIGINT neither ignored nor blocked, whatever this test worker inherited
    # or had changed by earlier tests (an ignored or blocked signal passes on to a child)
    terminal = (
        "import signal, sys\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from ldpipe.infra.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", terminal, "simulate", "--mechanism", "cms",
         "--epsilon", "4", "--dataset", "zipf:d=1000,a=1.1", "--n", "2000000", "--trials", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:  # fmt: skip
        # its start line says the interpreter is up and the command runs (a fixed sleep was
        # not enough on a loaded machine: a SIGINT before Python's own handler kills it as -2)
        assert process.stderr is not None
        first = process.stderr.readline()
        assert first.startswith("ldpipe simulate: "), first
        time.sleep(0.5)  # into its trials (which take minutes)
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=60)
    err = first + rest
    assert process.returncode == 130, err
    assert [line for line in err.splitlines() if not line.startswith("ldpipe simulate: ")] == []
    assert "error" not in err
