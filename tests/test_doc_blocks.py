"""Every shell and Python block of the README and of ``docs/`` runs verbatim, twice in a row.

The test copies the repository's files as they are on disk (tracked, plus new files not yet
ignored: what a fresh clone of the next commit holds) into a temporary directory, links this
repository's ``.venv`` into it and runs each file's blocks in the file's order from the copy's
root: a ```` ```sh ```` or ```` ```bash ```` block with ``bash -e``, a ```` ```python ````
block with ``python`` (its code in a file of its own outside the copy). The blocks run in a
shell whose ``PATH`` starts with that venv's ``bin/``, as for a user who followed the README
(``./dev.sh setup``, then ``. .venv/bin/activate``), so ``ldpipe`` and ``python`` are the venv's;
the linked venv's editable install imports this checkout's ``ldpipe``, whose files the copy
holds byte for byte. Then every block runs a second time on what the first pass left behind:
a block owns its state (it starts afresh or cleans up after itself), so both passes must pass.

Each block runs in its own process group, which is killed when the block ends, however it
ends, so nothing it started in the background outlives it. A block is not run when it runs
``./dev.sh`` (the demo and the test suite: CI runs both itself) or when an HTML comment
``<!-- not run: REASON -->`` stands on the line before its fence; the test lists those with
their reasons, and a ``not run`` comment without a reason fails. Fragments that are not
meant to run at all use another info string (```` ```text ````, ```` ```toml ````, ...).

A block marked ``<!-- run in a deployment: ... -->`` runs from the directory of a deployment
``ldpipe init`` wrote, as an operator's commands would (``--config pipeline.toml``): its broker
running with every topic, its emoji shuffler running, 20,000 reports sealed into its sketch
store, and a ``c.toml`` beside it, ``infra/sfp-example.toml`` on the same broker with its keys.
One deployment serves every such block of the module, both passes: like a real one, it outlives
the commands run against it, and each block still owns what it makes there (it stops what it
starts, and starts afresh where a rerun would be refused). The deployment takes free ports;
ports the blocks name literally lie in 19500-19599 (checked), away from README's.

README's Kafka blocks listen on fixed ports (their configurations' ``bootstrap_servers``, the
services block's metrics ports, the front door's issuer and gateway); the test fails at once,
naming them, if one is taken, as it does for a guide's block whose literal ports are taken.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ldpipe.infra.runtime.kafka import KafkaSettings, ensure_topics
from ldpipe.infra.runtime.topics import config_topics
from ldpipe.schemas.config import load_config
from tests.repo_files import copy_repository

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
RUN_AS = {"sh": "bash", "bash": "bash", "python": "python"}
NOT_RUN = re.compile(r"<!--\s*not run\b:?\s*(.*?)\s*-->\s*\Z", re.S)
WITH_README = re.compile(r"<!--\s*run with README\.md\b:?\s*(.*?)\s*-->\s*\Z", re.S)
IN_DEPLOYMENT = re.compile(r"<!--\s*run in a deployment\b:?\s*(.*?)\s*-->\s*\Z", re.S)
# a port a guide's block names: an option's value or an address on this machine
LITERAL_PORT = re.compile(r"(?:--[\w-]*ports?[ =]|127\.0\.0\.1:|localhost:)(\d{2,5})\b")
GUIDE_PORTS = range(19500, 19600)  # the guides' literal ports: README's are 9092-9095, 9101-9104
DEV_SH = "./dev.sh"  # `./dev.sh demo` and `./dev.sh test`: CI runs them anyway
PORTS = (9092, 9093, 9094, 9095, 9101, 9102, 9103, 9104)  # README's brokers, metrics, front door
BLOCK_TIMEOUT_S = 240.0
DEPLOYMENT_WAIT_S = 120.0
PASSES = 2


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, how it runs, and why not, if it is not run."""

    doc: Path
    line: int
    language: str
    code: str
    skip: str | None
    with_readme: bool = False
    in_deployment: bool = False
    front_door: bool = False  # in a deployment whose issuer and gateway run for the block

    @property
    def name(self) -> str:
        first = self.code.strip().splitlines()[0] if self.code.strip() else ""
        return f"{self.doc.relative_to(ROOT)}:{self.line} ({first[:60]})"


@dataclass(frozen=True)
class Expect:
    """A block, known by a string only it contains, and what its output must show."""

    marker: str
    patterns: tuple[str, ...]


EXPECTED = (
    Expect("ldpipe simulate --mechanism rrcms", (r"max empirical MSE [\d.]+",)),
    Expect(
        "--config infra/example.toml --metrics-port 9101",
        (
            r"produced 100,000 reports \(0 failed\)",
            r"(?m)^emoji: 100,000 reports in \d+ window\(s\)",
            r"(?m)^item +estimate +std err +95% interval +> 0$",
            r"replayed 100,000 reports \(0 rejected\)",
            r"published epoch 2",
            r"amplified eps, closed form",
            r"ldp\.emoji\.dlq \(emoji\): no dead letters",
            r"(?m)^broker stopped$",
        ),
    ),
    Expect(
        "C=infra/discovery-example.toml",
        (
            r"produced 40,000 reports \(0 failed\)",
            r"use case words: [1-9]\d* items found in 2 windows",
            r"(?m)^  the +2 ",  # the most common word, released in both windows
            r"(?m)^words: 20,000 reports in \d+ window\(s\)",
            r"(?m)^the +\d+\.\d +\d+\.\d +\[",  # ... and its estimate from the sketch
            r"(?m)^broker stopped$",
        ),
    ),
    Expect(
        "C=infra/sfp-example.toml",
        (
            r"produced 40,000 reports \(0 failed\)",
            r"20,000 word and 20,000 fragment reports",
            r"recorded in \S*infra/state/sfp/snapshots/newwords/discoveries/",
            r"use case newwords: [1-9]\d* items found in 1 windows",
            r"(?m)^newwords: 20,000 reports in 1 window\(s\)",
            r"(?m)^the +\d+\.\d +\d+\.\d +\[",
            r"(?m)^broker stopped$",
        ),
    ),
    Expect(
        "C=infra/front-door-example.toml",
        (
            r"1,000 devices of 'emoji' through http://127\.0\.0\.1:9104 sharing 20",
            r"sent 1,000: accepted 1,000, refused 0 \(none\), held for lack of tokens 0, "
            r"undelivered 0",
            r"(?m)^emoji: 1,000 reports in \d+ window\(s\)",
            r"(?m)^broker stopped$",
        ),
    ),
    Expect(
        "ldpipe init my-deployment      #",
        (
            r"wrote 19 files into my-deployment/",
            r"produced 20,000 reports \(0 failed\)",
            r"(?m)^emoji: 20,000 reports in \d+ window\(s\)",
            r"(?m)^gateway +running ",  # ldpipe up --status: every service under ldpipe up
            r"(?m)^up \| stopped$",
        ),
    ),
    Expect(
        "--metrics-ports-from 19560",  # operations.md: ldpipe up restarts a killed shuffler
        (
            r"produced 5,000 reports \(0 failed\)",
            r"(?m)^shuffler@emoji +running ",
            r"(?m)^up \| shuffler@emoji exited with -9 after [\d.]+ s; restarting in 1\.0 s$",
        ),
    ),
    Expect("ldpipe params --epsilon 4", (r'"epsilon":', r'"f1":')),
    # the guides' blocks that read README's store (docs/query.md, docs/calibrate.md)
    Expect(
        "load_merged(open_sketch_store(uc))", (r"'reports': 100000", r"epoch 1: 100,000 reports")
    ),
    Expect(
        "--serve --metrics-port 9102",
        (r'"name": ?"emoji"', r'"reports": ?100000', r'"item": ?"NINJA"', r'"z": ?-?\d'),
    ),
    Expect("--calibrate powerlaw --calibrate-fit ml --json", (r'"calibrated',)),
    # the guides' blocks run in a deployment (docs/cli.md, producers.md, aggregator.md, sfp.md)
    Expect(
        "--broker-port 19520",
        (r"wrote \d+ files into my-deployment/", r"(?m)^broker stopped$"),
    ),
    Expect("--n 20000 --seed 7 --rate 5000", (r"produced 20,000 reports \(0 failed\)",)),
    Expect(
        "zipf:d=1000,a=1.5",
        (r"produced 20,000 reports \(0 failed\)", r'"produced": 10000, "failed": 0'),
    ),
    Expect("--member emoji-a", (r"(?m)^ldpipe_aggregator_partitions_owned\{.*\} 1",)),
    Expect("--metrics-port 19512", (r"(?m)^ldpipe_aggregator_partitions_owned\{.*\} 1",)),
    Expect(
        "--metrics-port 19508",
        (
            r"(?m)^emoji: [\d,]+ reports in \d+ window\(s\)",
            r'"item": ?"GRINNING FACE"',  # --items ... --json over the last two days
            r'serving http://127\.0\.0\.1:19508/.*\n\{"use_case": ?"emoji"',  # /v1/top
            r"calibrated with a powerlaw prior",
        ),
    ),
    Expect("--store rerun-5min --window-seconds 300", (r'"aggregated": [1-9]', "writers replay")),
    Expect("--member emoji-crash", (r"died as asked: exit 137",)),
    Expect("--metrics-port 19510", (r"(?m)^ldpipe_sfp_runs_total\{",)),
)


def blocks_of(doc: Path) -> list[Block]:
    """The ```sh, ```bash and ```python blocks of ``doc``, each with its reason not to run."""
    text = doc.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        language = match.group(1)
        if language not in RUN_AS:
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        comment = NOT_RUN.search(before)
        skip = None
        with_readme = WITH_README.search(before) is not None
        deployed = IN_DEPLOYMENT.search(before)
        in_deployment = deployed is not None
        front_door = deployed is not None and "issuer and gateway running" in deployed.group(1)
        if comment:
            skip = comment.group(1)
        elif DEV_SH in match.group(2):
            skip = "runs ./dev.sh (the demo or the test suite: CI runs them itself)"
        line = text.count("\n", 0, match.start()) + 1
        found.append(
            Block(
                doc, line, language, match.group(2), skip, with_readme, in_deployment, front_door
            )
        )
    return found


ALL_BLOCKS = [block for doc in DOCS for block in blocks_of(doc)]
RUN_DOCS = sorted(
    {b.doc for b in ALL_BLOCKS if b.skip is None and not b.with_readme} | {DOCS[0]},
    key=DOCS.index,
)


def blocks_to_run(doc: Path) -> list[Block]:
    """``doc``'s blocks to run, in order; README's are followed by the guides' blocks marked
    ``<!-- run with README.md: ... -->``, which read what README's services block left in
    ``infra/state/`` (its sketch store) and so run in README's copy, after its blocks."""
    own = [b for b in blocks_of(doc) if b.skip is None and not b.with_readme]
    if doc.name != "README.md":
        return own
    return own + [b for b in ALL_BLOCKS if b.skip is None and b.with_readme]


def fresh_copy(dest: Path) -> Path:
    """The repository's files as on disk, without what .gitignore ignores (keys, state,
    caches), and this repository's .venv linked in; returns the venv's ``bin``."""
    copy_repository(dest)
    venv = ROOT / ".venv"
    if not (venv / "bin" / "ldpipe").exists():
        pytest.skip("no .venv with ldpipe installed (./dev.sh setup)")
    (dest / ".venv").symlink_to(venv, target_is_directory=True)
    return dest / ".venv" / "bin"


def activated(bin_dir: Path) -> dict[str, str]:
    """The environment of a shell after ``. .venv/bin/activate``: the venv's bin first."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def kill_group(pgid: int) -> None:
    """SIGTERM the block's process group, then SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a service's process group, reap the service (a zombie leader would keep the
    group alive for :func:`kill_group`), then kill whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10.0)
    kill_group(proc.pid)
    proc.wait()


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports no one listens on now, as the OS picks them (held together
    while picked, so none is picked twice): the deployment's own ports."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def guide_ports(block: Block) -> list[int]:
    """The ports a guide's block names literally (``--metrics-port 19508``, ``127.0.0.1:19508``)."""
    return sorted({int(port) for port in LITERAL_PORT.findall(block.code)})


def taken(ports: tuple[int, ...] | list[int]) -> list[int]:
    """Those of ``ports`` something on 127.0.0.1 listens on."""
    found = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                found.append(port)
    return found


@dataclass
class Deployment:
    """A deployment ``ldpipe init`` wrote, running, for the blocks marked ``run in a deployment``.

    Started at the first such block (:meth:`directory`) and stopped when the module ends:
    ``ldpipe init my-deployment`` with free ports, its broker with every topic of
    ``pipeline.toml`` and of ``c.toml`` (``infra/sfp-example.toml`` on this broker, keys made as
    README's SFP block makes them), the emoji shuffler, and 20,000 emoji reports sealed into
    the store by an aggregator that is then stopped, so that the blocks' own aggregators (a
    crash among them) find the consumer group empty. Every process runs in its own process
    group; the logs lie beside the deployment, not in it.
    """

    base: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # by log name
    home: Path | None = None
    failure: str | None = None
    seconds: float = 0.0  # how long the start took, until the test reports it

    def directory(self) -> Path:
        if self.failure is not None:  # one failed start fails every block that needs it
            pytest.fail(f"the deployment did not start: {self.failure}")
        if self.home is None:
            started = time.monotonic()
            try:
                self._start()
            except BaseException as exc:
                self.failure = str(exc)[-3000:] or type(exc).__name__
                self.stop()
                raise
            self.seconds = time.monotonic() - started
        assert self.home is not None
        return self.home

    def _run(self, command: str, *, check: bool = True) -> str:
        done = subprocess.run(
            command.split(),
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"deployment: {command} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    def _spawn(self, name: str, command: str) -> subprocess.Popen[bytes]:
        with (self.base / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                command.split(),
                cwd=self.home,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = proc
        return proc

    def _log(self, name: str) -> str:
        return (self.base / f"{name}.log").read_text(encoding="utf-8", errors="replace")[-3000:]

    def _wait(self, what: str, done: Callable[[], bool], name: str) -> None:
        """Until ``done()``; fails with the log of the service ``name`` if it exits or
        ``DEPLOYMENT_WAIT_S`` pass first."""
        proc = self.processes[name]
        deadline = time.monotonic() + DEPLOYMENT_WAIT_S
        while not done():
            if proc.poll() is not None:
                raise AssertionError(
                    f"deployment: the {name} exited {proc.returncode} before {what}:\n"
                    f"{self._log(name)}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"deployment: no {what} after {DEPLOYMENT_WAIT_S:g} s:\n{self._log(name)}"
                )
            time.sleep(0.5)

    def _start(self) -> None:
        broker, shuffler, aggregator, prometheus, issuer, gateway, gateway_metrics = free_ports(7)
        self.home = self.base
        self._run(
            f"ldpipe init my-deployment --broker-port {broker} --metrics-ports "
            f"{shuffler},{aggregator},{gateway_metrics} --prometheus-port {prometheus} "
            f"--issuer-port {issuer} --gateway-port {gateway}"
        )
        self.home = self.base / "my-deployment"
        bootstrap = f"127.0.0.1:{broker}"
        sfp = (ROOT / "infra" / "sfp-example.toml").read_text(encoding="utf-8")
        sfp = sfp.replace("127.0.0.1:9094", bootstrap).replace("../schemas/", "./")
        (self.home / "c.toml").write_text(sfp, encoding="utf-8")
        self._run("ldpipe keys generate --out state/sfp/keys --name newwords --key-id 3")
        self._run(
            "ldpipe keys generate --out state/sfp/shuffler-keys --name newwords-shuffler "
            "--key-id 12 --role shuffler"
        )
        self._spawn("broker", "ldpipe broker --config pipeline.toml")
        self._wait("topics", lambda: "running;" in self._log("broker"), "broker")
        sfp_topics = config_topics(load_config(self.home / "c.toml"))
        ensure_topics(KafkaSettings(bootstrap), sfp_topics)
        emoji = "--config pipeline.toml --use-case emoji"
        self._spawn("shuffler", f"ldpipe shuffler {emoji}")
        self._spawn("aggregator", f"ldpipe aggregator {emoji}")
        self._run(f"ldpipe produce {emoji} --dataset dictionary:a=1.1 --n 20000")

        def sealed() -> bool:  # exit 3 with "no data yet" until then
            return "20,000 reports" in self._run(f"ldpipe query {emoji}", check=False)

        self._wait("window sealed", sealed, "aggregator")
        stop_group(self.processes.pop("aggregator"))

    @contextlib.contextmanager
    def front_door(self) -> Iterator[None]:
        """The deployment's issuer and gateway, as ``ldpipe init`` configured them, running for
        one block (blocks of docs/gateway.md start their own on the same ports)."""
        (metrics,) = free_ports(1)
        try:
            self._spawn("issuer", "ldpipe issuer --config pipeline.toml --progress 0")
            self._wait("issuer", lambda: "running" in self._log("issuer"), "issuer")
            self._spawn(
                "gateway",
                f"ldpipe gateway --config pipeline.toml --metrics-port {metrics}",  # every use case
            )
            self._wait("gateway ready", lambda: _ready(metrics), "gateway")
            yield
        finally:
            for name in ("gateway", "issuer"):
                if name in self.processes:
                    stop_group(self.processes.pop(name))

    def stop(self) -> None:
        for proc in reversed(self.processes.values()):  # the services first, the broker last
            stop_group(proc)
        self.processes.clear()


def _ready(port: int) -> bool:
    """Whether a service's ``/readyz`` on ``port`` answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """The module's deployment, started by the first block that needs it."""
    running = Deployment(tmp_path_factory.mktemp("deployment"), activated(ROOT / ".venv" / "bin"))
    try:
        yield running
    finally:
        running.stop()


def run_block(block: Block, tag: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, float]:
    """Exit status, output (stdout and stderr) and seconds of one block."""
    log = cwd.parent / f"{tag}.log"
    if RUN_AS[block.language] == "bash":
        argv = ["bash", "-e", "-c", block.code]
    else:
        script = cwd.parent / f"{tag}.py"
        script.write_text(block.code, encoding="utf-8")
        argv = ["python", str(script)]
    started = time.monotonic()
    with log.open("wb") as out:
        # output to a file, not a pipe: background services keep their stdout open
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            status = -1
        finally:
            kill_group(proc.pid)
            proc.wait()
    return status, log.read_text(encoding="utf-8", errors="replace"), time.monotonic() - started


def test_blocks_cover_the_expectations() -> None:
    """Each expectation names exactly one block (a renamed block must not be missed)."""
    for expect in EXPECTED:
        found = [b.name for b in ALL_BLOCKS if expect.marker in b.code]
        assert len(found) == 1, f"{expect.marker!r} is in {len(found)} blocks, not 1: {found}"


def test_every_skip_says_why() -> None:
    """A block that is not run names its reason; the list printed is the one to review."""
    skipped = [b for b in ALL_BLOCKS if b.skip is not None]
    print("\n".join(["blocks not run:", *(f"  {b.name}: {b.skip}" for b in skipped)]))
    unexplained = [b.name for b in skipped if len(b.skip or "") < 10]
    assert not unexplained, f"<!-- not run: ... --> without a reason before {unexplained}"
    # what may keep a block from running: a real Kafka cluster (SASL, several brokers, Kafka's
    # own tools), ./dev.sh (CI runs it), a package index, or a run of minutes beyond the slow
    # suite's budget; a block that needs a running broker or deployment runs in one (above)
    allowed = ("real Kafka cluster", DEV_SH, "package index", "minutes")
    other = [
        f"{b.name}: {b.skip}" for b in skipped if not any(a in (b.skip or "") for a in allowed)
    ]
    assert not other, "blocks not run for a reason the suite does not accept:\n" + "\n".join(other)


def test_the_scan_sees_the_blocks() -> None:
    # a pattern that silently matched nothing would leave the slow test nothing to run
    readme = blocks_of(ROOT / "README.md")
    assert [b.language for b in readme].count("python") == 1
    assert sum(b.language == "sh" for b in readme) >= 7
    assert any(b.language == "bash" for b in ALL_BLOCKS)
    assert any(b.with_readme for b in blocks_to_run(ROOT / "README.md"))
    assert any(b.in_deployment and b.skip is None for b in ALL_BLOCKS)


def test_guide_ports_are_the_guides() -> None:
    """A guide's block that runs names only ports of 19500-19599, so it never meets README's
    brokers and services (9092-9095, 9101-9104) nor the ports the deployment takes."""
    outside = [
        f"{b.name}: {port}"
        for b in ALL_BLOCKS
        if b.doc.name != "README.md" and b.skip is None and not b.with_readme
        for port in guide_ports(b)
        if port not in GUIDE_PORTS
    ]
    assert not outside, "give these blocks' ports in 19500-19599:\n" + "\n".join(outside)


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUN_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_blocks_run_verbatim_twice(doc: Path, tmp_path: Path, deployment: Deployment) -> None:
    blocks = blocks_to_run(doc)
    if doc.name == "README.md":  # the guides' blocks take free ports (EmbeddedBroker())
        busy = taken(PORTS)
        if busy:
            pytest.fail(
                f"port(s) {', '.join(map(str, busy))} in use on 127.0.0.1: README's blocks "
                f"listen there (stop whatever holds them, e.g. a broker left from the README)"
            )
    tree = tmp_path / "ldpipe"
    tree.mkdir()
    env = activated(fresh_copy(tree))
    timings = []
    for run in range(1, PASSES + 1):
        for block in blocks:
            cwd = tree
            if block.in_deployment:
                cwd = deployment.directory()
                if deployment.seconds:
                    timings.append(f"{deployment.seconds:6.1f} s  the deployment started")
                    deployment.seconds = 0.0
            if doc.name != "README.md":
                busy = taken(guide_ports(block))
                if busy:
                    pytest.fail(
                        f"{block.name} listens on port(s) {', '.join(map(str, busy))}, in use "
                        f"on 127.0.0.1: stop whatever holds them"
                    )
            tag = f"{doc.stem}-pass{run}-{block.line}"
            with deployment.front_door() if block.front_door else contextlib.nullcontext():
                status, output, seconds = run_block(block, tag, cwd, env)
            timings.append(f"{seconds:6.1f} s  pass {run}  {block.name}")
            tail = output[-4000:]
            where = f"{block.name}, pass {run}"
            if status == -1:
                pytest.fail(f"{where} ran over {BLOCK_TIMEOUT_S:g} s:\n{tail}")
            assert status == 0, f"{where} exited {status}:\n{tail}"
            for expect in EXPECTED:
                if expect.marker in block.code:
                    for pattern in expect.patterns:
                        assert re.search(pattern, output), (
                            f"{where}: no match for {pattern!r} in its output:\n{tail}"
                        )
    print("\n".join([f"{doc.relative_to(ROOT)}:", *timings]), file=sys.stderr)
