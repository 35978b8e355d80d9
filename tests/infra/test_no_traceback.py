"""No traceback reaches a user: every ``ldpipe`` command, started as a real subprocess with a
dead broker, a damaged store, a missing file and a bad value, ends in one line.

Commands are enumerated from ``ldpipe.infra.cli.main.COMMANDS`` (and their subcommands from
the parser), so a new command is covered as soon as it is listed; a required option this file
cannot fill fails :func:`test_every_command_can_be_started`, naming it. The acceptance shape of
each run: no ``Traceback`` and no ``panicked at`` on stderr, exit code non-zero (or 0 where the
command legitimately succeeds), stderr's last line ``ldpipe CMD: error: ...``, within a bound.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ldpipe.infra.cli.init import init
from ldpipe.infra.cli.main import COMMANDS, build_parser
from ldpipe.infra.runtime.broker import EmbeddedBroker
from ldpipe.infra.runtime.kafka import KafkaSettings, ensure_topics
from ldpipe.infra.runtime.topics import config_topics
from ldpipe.schemas.config import load_config
from ldpipe.schemas.keys import KeyPair, save_key_pair
from tests.store_helpers import seal_windows

TIMEOUT = 60.0  # seconds a command may take to give up (the dead broker's: --connect-timeout)
CONNECT_TIMEOUT = "2"

# a value for every required option of a command, by option string; (command, option) wins
FILL: dict[str, str] = {
    "--epsilon": "4",
    "--epsilon0": "4",
    "--n": "1000",
    "--delta": "1e-9",
    "--mechanism": "cms",
    "--protocol": "aux",
    "--seed": "1",
    "--dataset": "zipf:d=100,a=1.1",
    "--out": "new-keys",
    "--device": "phone-1",
    "--client": "no-such-ldpipe-client",
}
FILL_FOR: dict[tuple[str, str], str] = {
    ("produce", "--dataset"): "dictionary:a=1.1",
}
# the use case each command is pointed at in the starter deployment (`ldpipe init`)
USE_CASE = {"discovery-shuffler": "words", "discovery-aux": "words", "discovery-server": "words",
            "discoveries": "words", "sfp-discover": "newwords"}  # fmt: skip
# commands that run until stopped, and the line that says they run: the test stops them (SIGTERM)
SERVES = {"broker": "running; Ctrl-C stops", "issuer": "running; Ctrl-C stops"}
# the situations a command with --config meets through its configuration
CONFIG_SITUATIONS = ("dead broker", "garbled store", "missing segment", "missing config",
                     "missing key", "bad config value")  # fmt: skip
# one command per kind of failure runs in the default suite; the whole matrix is slow
QUICK = {("query", "garbled store"), ("store verify", "missing segment"), ("dlq", "dead broker"),
         ("produce", "missing key"), ("aggregator", "bad config value"),
         ("store list", "missing config"), ("simulate", "missing dataset file"),
         ("params", "bad option value"), ("issuer", "missing key"),
         ("issuer credentials add", "missing config"),
         ("conformance", "bad option value"), ("up", "dead broker")}  # fmt: skip
# commands that take no configuration: only the bad value and a missing dataset file apply
NO_FILES = {"demo", "params", "simulate", "discover-sim", "privacy amplification", "keys tag",
            "keys generate", "init", "conformance"}  # fmt: skip


@dataclass(frozen=True)
class Leaf:
    """One runnable command: its words (``store verify``) and its parser."""

    words: tuple[str, ...]
    parser: argparse.ArgumentParser

    @property
    def name(self) -> str:
        return " ".join(self.words)

    def __str__(self) -> str:
        return self.name

    def options(self) -> set[str]:
        return {s for a in self.parser._actions for s in a.option_strings}

    def required(self) -> list[argparse.Action]:
        return [
            a
            for a in self.parser._actions
            if a.required and not isinstance(a, argparse._SubParsersAction)
        ]


def _subparsers(
    parser: argparse.ArgumentParser,
) -> Iterator[argparse._SubParsersAction[argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield action


def _leaves() -> list[Leaf]:
    top = next(_subparsers(build_parser()))
    found: list[Leaf] = []

    def walk(words: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        children = [c for s in _subparsers(parser) for c in s.choices.items()]
        if not children or not all(s.required for s in _subparsers(parser)):
            found.append(Leaf(words, parser))  # runs by itself too (`ldpipe issuer`)
        for name, child in children:
            walk((*words, name), child)

    for command in COMMANDS:
        walk((command.name,), top.choices[command.name])
    return found


LEAVES = _leaves()


def _closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class World:
    """The files of every situation, under one temporary directory."""

    root: Path
    good: Path  # `ldpipe init`'s configuration, its broker dead
    broken_store: Path  # its store a garbled Delta log
    missing_segment: Path  # a real store whose Parquet segment is gone
    missing_key: Path  # names a key file that does not exist
    bad_value: Path  # a use case parameter of the wrong type


def _rewrite(source: Path, target: Path, *pairs: tuple[str, str]) -> Path:
    text = source.read_text(encoding="utf-8")
    for old, new in pairs:
        assert old in text, f"{old!r} not in {source}: update this test's rewrite"
        text = text.replace(old, new)
    target.write_text(text, encoding="utf-8")
    return target


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("situations")
    init(root)
    _add_sfp_use_case(root)
    dead = f'bootstrap_servers = "127.0.0.1:{_closed_port()}"'
    base = root / "pipeline.toml"
    good = _rewrite(base, root / "dead-broker.toml", ('bootstrap_servers = "127.0.0.1:9092"', dead))
    broken_store = _rewrite(good, root / "broken-store.toml", ('uri = "store"', 'uri = "garbled"'))
    for use_case in TABLES:
        log = root / "garbled" / use_case / "_delta_log"
        log.mkdir(parents=True)
        (log / "00000000000000000000.json").write_text('{"protocol": {"minReaderVers', "utf-8")
    missing_segment = _rewrite(
        good, root / "missing-segment.toml", ('uri = "store"', 'uri = "gutted"')
    )
    _seal_then_delete_segments(missing_segment)
    missing_key = _rewrite(
        good,
        root / "missing-key.toml",
        ('public_key = "keys/emoji/emoji-1.public.json"', 'public_key = "keys/e-9.public.json"'),
        ('private_keys = ["keys/emoji"]', 'private_keys = ["no-such-keys"]'),
        (
            'private_keys = ["shuffler-keys/emoji-shuffler-11.private.json"]',
            'private_keys = ["shuffler-keys/emoji-shuffler-99.private.json"]',
        ),
    )
    bad_value = _rewrite(good, root / "bad-value.toml", ("epsilon = 4.0", 'epsilon = "four"'))
    return World(root, good, broken_store, missing_segment, missing_key, bad_value)


# the sketch store's tables in the situations' configuration
TABLES = ("emoji", "words", "newwords", "newwords.fragments")
SFP_USE_CASE = """
[[use_case]]
name = "newwords"          # small shapes: the test writes its store
k = 16
m = 32
public_key = "keys/newwords-3.public.json"
private_keys = ["keys"]

[use_case.shuffle]
public_key = "shuffler-keys/newwords-shuffler-12.public.json"
private_keys = ["shuffler-keys/newwords-shuffler-12.private.json"]
n_min = 1000

[use_case.store]
uri = "store"

[use_case.sfp]
fragment_k = 16
fragment_m = 32
"""


def _add_sfp_use_case(root: Path) -> None:
    """``ldpipe init``'s deployment has no SFP use case: add one, so sfp-discover reads a store."""
    save_key_pair(KeyPair.generate(key_id=3, name="newwords"), root / "keys")
    shuffler = KeyPair.generate(key_id=12, name="newwords-shuffler", role="shuffler")
    save_key_pair(shuffler, root / "shuffler-keys")
    config = root / "pipeline.toml"
    config.write_text(config.read_text(encoding="utf-8") + SFP_USE_CASE, encoding="utf-8")


def _seal_then_delete_segments(config_path: Path) -> None:
    """A real store, as the aggregator writes it, whose Parquet files are then deleted."""
    config = load_config(config_path)
    for name in TABLES:
        use_case = config.use_case(name)
        sketch = use_case.mechanism.new_sketch()
        store = seal_windows(use_case, [(0, 3600, sketch)], offsets={0: 1})
        for part in Path(store.uri).glob("*.parquet"):
            part.unlink()


def _argv(leaf: Leaf, config: Path | None) -> list[str]:
    """``leaf``'s words with every required option filled, ``--config`` set to ``config``."""
    argv = list(leaf.words)
    for action in leaf.required():
        option = action.option_strings[0] if action.option_strings else None
        if option == "--config":
            continue
        if option is None:  # a positional (init's DIR)
            continue
        value = FILL_FOR.get((leaf.name, option), FILL.get(option))
        if value is None and option == "--store":
            value = str(config.parent / "replay-store") if config else "replay-store"
        assert value is not None, f"{leaf.name}: add a value for {option} to FILL"
        argv += [option, value]
    options = leaf.options()
    if config is not None and "--config" in options:
        argv += ["--config", str(config)]
    if "--use-case" in options and config is not None:
        argv += ["--use-case", USE_CASE.get(leaf.name, "emoji")]
    if "--connect-timeout" in options:
        argv += ["--connect-timeout", CONNECT_TIMEOUT]
    return argv


@dataclass(frozen=True)
class Outcome:
    code: int
    stderr: str


def _run(leaf: Leaf, argv: list[str], cwd: Path, what: str) -> Outcome:
    """Run ``ldpipe argv``; a command that serves (``SERVES``) is stopped with SIGTERM once it
    says it runs. A command still running after ``TIMEOUT`` fails the test, naming it."""
    shown = f"ldpipe {' '.join(argv)} ({what})"
    with subprocess.Popen(
        [sys.executable, "-m", "ldpipe.infra.cli", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        out: list[str] = []
        err: list[str] = []
        readers = [
            threading.Thread(target=lambda: out.extend(iter(process.stdout.readline, ""))),  # type: ignore[union-attr]
            threading.Thread(target=lambda: err.extend(iter(process.stderr.readline, ""))),  # type: ignore[union-attr]
        ]
        for reader in readers:
            reader.start()
        marker = SERVES.get(leaf.name)
        deadline = time.monotonic() + TIMEOUT
        while process.poll() is None and time.monotonic() < deadline:
            if marker is not None and any(marker in line for line in out):
                process.send_signal(signal.SIGTERM)  # a service: it must stop cleanly
                marker = None
            time.sleep(0.1)
        if process.poll() is None:
            process.kill()
            process.wait()
            for reader in readers:
                reader.join()
            pytest.fail(f"{shown} did not end within {TIMEOUT:.0f} s; stderr:\n{''.join(err)}")
        for reader in readers:
            reader.join()
    return Outcome(process.returncode, "".join(err))


def _check(leaf: Leaf, argv: list[str], outcome: Outcome, what: str) -> None:
    shown = f"ldpipe {' '.join(argv)} ({what}), exit {outcome.code}; stderr:\n{outcome.stderr}"
    assert "Traceback" not in outcome.stderr, shown
    assert "panicked at" not in outcome.stderr, shown
    if outcome.code == 0:
        return
    if outcome.code == 3 and leaf.words[0] == "query":
        return  # nothing to estimate from (docs/cli.md): one statement on stdout, not an error
    assert outcome.code in (1, 2), shown
    lines = outcome.stderr.strip().splitlines()
    assert lines, shown
    # argparse names a subcommand's parser in full (``ldpipe keys generate: error: ...``)
    prog = " ".join(leaf.words) if "usage:" in outcome.stderr else leaf.words[0]
    assert lines[-1].startswith(f"ldpipe {prog}: error: "), shown


def test_every_command_can_be_started() -> None:
    assert {leaf.words[0] for leaf in LEAVES} == {command.name for command in COMMANDS}
    for leaf in LEAVES:
        _argv(leaf, Path("pipeline.toml"))  # every required option has a value


def _config(world: World, situation: str) -> Path:
    return {
        "dead broker": world.good,
        "garbled store": world.broken_store,
        "missing segment": world.missing_segment,
        "missing config": world.root / "no-such.toml",
        "missing key": world.missing_key,
        "bad config value": world.bad_value,
    }[situation]


def _bad_option(leaf: Leaf) -> list[str]:
    """An option of ``leaf`` that takes a number, given a word (none: the command has none)."""
    for action in leaf.parser._actions:
        if action.option_strings and action.type is not None and action.type is not str:
            return [action.option_strings[-1], "lots"]
    return []


def _cases() -> Iterator[object]:
    """(leaf, situation) for every command and every situation that applies to it; those not
    in ``QUICK`` run in the slow suite (each is a Python start, some wait for a broker)."""
    for leaf in LEAVES:
        situations = [] if leaf.name in NO_FILES else list(CONFIG_SITUATIONS)
        if "--dataset" in leaf.options():
            situations.append("missing dataset file")
        if _bad_option(leaf):
            situations.append("bad option value")
        for situation in situations:
            marks = () if (leaf.name, situation) in QUICK else (pytest.mark.slow,)
            yield pytest.param(leaf, situation, marks=marks, id=f"{leaf.name}-{situation}")


def _situation_argv(leaf: Leaf, situation: str, world: World) -> list[str]:
    if situation in CONFIG_SITUATIONS:
        return _argv(leaf, _config(world, situation))
    argv = _argv(leaf, world.good if "--config" in leaf.options() else None)
    if situation == "missing dataset file":
        return [*argv, "--dataset", f"file:{world.root / 'no-such-words.txt'}"]
    return [*argv, *_bad_option(leaf)]


@pytest.mark.parametrize(("leaf", "situation"), list(_cases()))
def test_a_command_meets_a_broken_situation_in_one_line(
    leaf: Leaf, situation: str, world: World
) -> None:
    argv = _situation_argv(leaf, situation, world)
    _check(leaf, argv, _run(leaf, argv, world.root, situation), situation)


CONSUMERS = [leaf for leaf in LEAVES if "--idle-exit" in leaf.options()]  # the Kafka services


class _Running:
    """``ldpipe argv`` started in the background, its output collected line by line."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ldpipe.infra.cli", *argv],
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        streams = ((self.process.stdout, self.out), (self.process.stderr, self.err))
        self._readers = [
            threading.Thread(target=lines.extend, args=(iter(stream.readline, ""),))  # type: ignore[union-attr]
            for stream, lines in streams
        ]
        for reader in self._readers:
            reader.start()

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"waited {TIMEOUT:.0f} s for {what}; stderr:\n{''.join(self.err)}")
            time.sleep(0.1)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join()


@pytest.mark.slow
@pytest.mark.parametrize("leaf", CONSUMERS, ids=str)
def test_a_service_whose_broker_dies_warns_in_lines_and_stops_on_sigterm(
    leaf: Leaf, tmp_path: Path
) -> None:
    """The broker answers at the start, then dies: a service keeps retrying (librdkafka does),
    says so in log lines, not a traceback, and still stops cleanly on SIGTERM."""
    init(tmp_path)
    broker = EmbeddedBroker(log_dir=tmp_path / "broker-log").start()
    service: _Running | None = None
    try:
        servers = broker.bootstrap_servers
        config = _rewrite(
            tmp_path / "pipeline.toml", tmp_path / "live.toml", ("127.0.0.1:9092", servers)
        )
        ensure_topics(KafkaSettings(servers), config_topics(load_config(config)))
        argv = [*_argv(leaf, config), "--progress", "0"]
        service = _Running(argv, tmp_path)
        service.wait_for(lambda: bool(service and service.out), f"{leaf.name} to start")
        assert service.process.poll() is None, "".join(service.err)
        broker.stop()
        running = service
        running.wait_for(
            lambda: (
                running.process.poll() is not None
                or any("ldpipe.rdkafka" in line for line in running.err)
            ),
            f"{leaf.name} to warn that the broker is gone, or to give up",
        )
        if service.process.poll() is None:  # it retries: SIGTERM must still stop it
            service.process.send_signal(signal.SIGTERM)
            code = service.process.wait(timeout=TIMEOUT)
            if code != 0:  # it gave up as the signal came: then its own reason, in one line
                err = "".join(service.err).strip().splitlines()
                assert code in (1, -signal.SIGTERM), "".join(service.err)
                assert err and err[-1].startswith(f"ldpipe {leaf.words[0]}: error: "), err
                return
    finally:
        broker.stop()
        if service is not None:
            service.close()
    # or it gave up (a transaction cannot start, say): then in one line, exit 1
    _check(leaf, argv, Outcome(service.process.returncode, "".join(service.err)), "broker died")
