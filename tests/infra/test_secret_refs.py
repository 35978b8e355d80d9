"""Secret references (``infra/runtime/secret_refs.py``): ``${env:NAME}`` and ``${file:/path}``
resolve where Kafka clients and delta-rs are configured, and no error, ``repr`` or argv ever holds
the secret."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import ldpipe.infra.storage.sketch_store as store_module
from ldpipe.infra.cli.main import main
from ldpipe.infra.runtime.kafka import KafkaSettings, parse_extra
from ldpipe.infra.runtime.secret_refs import is_reference, resolve, resolve_all
from ldpipe.infra.storage.segments import SegmentData
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms import Sketch

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2-never-printed"
VAR = "LDPIPE_TEST_KAFKA_PASSWORD"
SETTING = "kafka.extra.sasl.password"

CONFIG = """
[kafka]
bootstrap_servers = "127.0.0.1:{port}"

[kafka.extra]
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "PLAIN"
"sasl.username" = "ldpipe"
"sasl.password" = "${{env:{var}}}"
"message.max.bytes" = 2000000

[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 64
m = 64
dictionary = "builtin:emoji"
"""


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(VAR, SECRET)
    return VAR


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv(VAR, raising=False)
    return VAR


def _closed_port() -> int:
    with socket.socket() as sock:  # nothing listens there once the socket is closed
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- resolution ---------------------------------------------------------------------------------


def test_env_reference(secret_env: str) -> None:
    assert resolve(f"${{env:{secret_env}}}", SETTING) == SECRET


def test_file_reference_strips_one_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "kafka-password"
    for written, read in [
        (f"{SECRET}\n", SECRET),
        (f"{SECRET}\r\n", SECRET),
        (f"{SECRET}\n\n", f"{SECRET}\n"),  # one newline only: the rest is the secret's
        (SECRET, SECRET),
        (f" {SECRET} ", f" {SECRET} "),  # no other trimming
    ]:
        path.write_text(written, encoding="utf-8", newline="")
        assert resolve(f"${{file:{path}}}", SETTING) == read


def test_only_whole_values_are_references(secret_env: str) -> None:
    for literal in [
        "plain",
        "",
        f"x${{env:{secret_env}}}",
        f"${{env:{secret_env}}}x",
        "$",
        "${",
        "{env:X}",
    ]:
        assert resolve(literal, SETTING) == literal
        assert not is_reference(literal)


def test_escape_gives_the_literal(secret_env: str) -> None:
    assert resolve(f"$${{env:{secret_env}}}", SETTING) == f"${{env:{secret_env}}}"
    assert resolve("$${file:/etc/passwd}", SETTING) == "${file:/etc/passwd}"
    assert resolve("$$${x}", SETTING) == "$${x}"  # one $ less, whatever follows


def test_missing_variable_names_setting_reference_and_fix(no_env: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(f"${{env:{no_env}}}", SETTING)
    message = str(caught.value)
    assert message.startswith(f"{SETTING}: ${{env:{no_env}}}: environment variable {no_env} ")
    assert "is not set; export it" in message and "${file:" in message
    assert "\n" not in message
    assert isinstance(caught.value, LdpipeError) and isinstance(caught.value, ValueError)


def test_empty_variable_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, "")
    assert resolve(f"${{env:{VAR}}}", SETTING) == ""


def test_missing_file_names_setting_reference_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "nope"
    with pytest.raises(ConfigError) as caught:
        resolve(f"${{file:{path}}}", SETTING)
    message = str(caught.value)
    assert message.startswith(f"{SETTING}: ${{file:{path}}}: cannot read {path} ")
    assert "No such file or directory" in message and "\n" not in message


def test_unreadable_file_never_shows_its_contents(tmp_path: Path) -> None:
    directory = tmp_path / "dir"
    directory.mkdir()
    with pytest.raises(ConfigError, match="cannot read"):
        resolve(f"${{file:{directory}}}", SETTING)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xffhunter2")
    with pytest.raises(ConfigError, match="not UTF-8 text") as caught:
        resolve(f"${{file:{binary}}}", SETTING)
    assert "hunter2" not in str(caught.value) and caught.value.__cause__ is None
    assert caught.value.__suppress_context__


def test_malformed_references_are_refused_without_their_target() -> None:
    for bad, shown in [
        ("${vault:secret/kafka}", "${vault:...}"),
        ("${ENV:X}", "${ENV:...}"),
        ("${env:}", "${env:...}"),
        ("${env:not a name}", "${env:...}"),
        ("${file:}", "${file:...}"),
        ("${KAFKA_PASSWORD}", "${...}"),
    ]:
        with pytest.raises(ConfigError) as caught:
            resolve(bad, SETTING)
        message = str(caught.value)
        assert message.startswith(f"{SETTING}: {shown} is not a secret reference; write ")
    with pytest.raises(ConfigError, match="relative; give an absolute one"):
        resolve("${file:run/secrets/kafka}", SETTING)


def test_resolve_all_passes_non_strings_through(secret_env: str) -> None:
    mapping: dict[str, Any] = {
        "sasl.password": f"${{env:{secret_env}}}",
        "linger.ms": 5,
        "enable.idempotence": True,
        "ratio": 0.5,
        "sasl.username": "ldpipe",
    }
    assert resolve_all(mapping, "kafka.extra") == {**mapping, "sasl.password": SECRET}


def test_resolve_all_names_the_key(no_env: str) -> None:
    with pytest.raises(ConfigError, match=r"^kafka\.extra\.sasl\.password: \$\{env:"):
        resolve_all({"sasl.password": f"${{env:{no_env}}}"}, "kafka.extra")


# --- Kafka ------------------------------------------------------------------------------------


def test_kafka_settings_from_config_resolve_in_every_client_config(secret_env: str) -> None:
    config = parse_config(CONFIG.format(port=9092, var=secret_env))
    settings = KafkaSettings(config.kafka.bootstrap_servers, config.kafka.extra)
    reference = f"${{env:{secret_env}}}"
    assert settings.extra["sasl.password"] == reference  # kept as written
    for client in (
        settings.producer_config(),
        settings.consumer_config("g"),
        settings.admin_config(),
    ):
        assert client["sasl.password"] == SECRET
        assert client["sasl.username"] == "ldpipe" and client["message.max.bytes"] == "2000000"
    assert SECRET not in repr(settings) and reference not in repr(settings)  # masked key


def test_kafka_reference_in_an_unmasked_key_shows_only_the_reference(secret_env: str) -> None:
    settings = KafkaSettings("kafka:9092", parse_extra([f"sasl.username=${{env:{secret_env}}}"]))
    assert settings.producer_config()["sasl.username"] == SECRET
    assert SECRET not in repr(settings) and f"${{env:{secret_env}}}" in repr(settings)


def test_kafka_missing_secret_fails_before_connecting(no_env: str) -> None:
    settings = KafkaSettings("127.0.0.1:1", {"sasl.password": f"${{env:{no_env}}}"})
    with pytest.raises(ConfigError, match=f"^{SETTING}: "):
        settings.check_reachable(timeout=0.1)


def test_librdkafka_refusal_never_quotes_a_resolved_secret(secret_env: str) -> None:
    # librdkafka quotes a value it refuses: Invalid value "..." for configuration property
    settings = KafkaSettings("127.0.0.1:1", {"security.protocol": f"${{env:{secret_env}}}"})
    with pytest.raises(ValueError, match="librdkafka refuses") as caught:
        settings.check_reachable(timeout=0.1)
    assert SECRET not in str(caught.value) and "***" in str(caught.value)


# --- the command line -------------------------------------------------------------------------


def test_cli_passes_the_reference_through_to_resolution(
    tmp_path: Path, secret_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "ldpipe.toml"
    config.write_text(CONFIG.format(port=_closed_port(), var="UNUSED"), encoding="utf-8")
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    class ReachedError(LdpipeError):
        pass

    def check_reachable(self: KafkaSettings, timeout: float = 15.0) -> None:
        seen.append((dict(self.extra), self.admin_config()))
        raise ReachedError("stop here")

    monkeypatch.setattr(KafkaSettings, "check_reachable", check_reachable)
    argv = ["dlq", "--config", str(config), "-X", f"sasl.password=${{env:{secret_env}}}"]
    assert main(argv) == 1
    ((extra, client),) = seen
    assert extra["sasl.password"] == f"${{env:{secret_env}}}"  # -X wins over [kafka.extra]
    assert client["sasl.password"] == SECRET


def test_cli_missing_secret_is_one_line_exit_2(
    tmp_path: Path, no_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ldpipe.toml"
    config.write_text(CONFIG.format(port=_closed_port(), var=no_env), encoding="utf-8")
    assert main(["dlq", "--config", str(config), "--connect-timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ldpipe dlq: error: {SETTING}: ${{env:{no_env}}}: environment variable {no_env} is not "
        f"set; export it to ldpipe's environment, or use ${{file:/run/secrets/...}}\n"
    )


def _argv_once_exec_done(process: subprocess.Popen[str]) -> list[bytes]:
    """The process's argv as ``ps`` shows it, once it has exec'd (before, it is empty)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
        if b"ldpipe.infra.cli" in argv:
            return argv
        time.sleep(0.001)  # poll the condition: exec is a matter of microseconds
    raise AssertionError(f"{process.args} did not exec within 30 s")


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc/PID/cmdline")
def test_ps_shows_only_the_reference(tmp_path: Path) -> None:
    """A real process: its argv (what ``ps`` shows) holds the reference, librdkafka got the
    secret from the file, and nothing it prints holds the secret."""
    secret_file = tmp_path / "kafka-password"
    secret_file.write_text(f"{SECRET}\n", encoding="utf-8")
    secret_file.chmod(0o600)
    config = tmp_path / "ldpipe.toml"
    config.write_text(CONFIG.format(port=_closed_port(), var="UNUSED"), encoding="utf-8")
    reference = f"${{file:{secret_file}}}"
    command = [
        sys.executable, "-m", "ldpipe.infra.cli", "dlq", "--config", str(config),
        "--connect-timeout", "1", "-X", f"sasl.password={reference}",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        argv = _argv_once_exec_done(process)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert f"sasl.password={reference}".encode() in argv
    assert not any(SECRET.encode() in arg for arg in argv)
    assert process.returncode == 1 and "cannot reach Kafka" in err  # resolved, then connected
    assert SECRET not in out + err


# --- the sketch store ---------------------------------------------------------------------------


def test_storage_options_resolve_before_delta_rs_sees_them(
    tmp_path: Path, secret_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    given: list[Any] = []
    real_table, real_write = store_module.DeltaTable, store_module.write_deltalake

    def table(uri: str, *, storage_options: Any = None) -> Any:
        given.append(storage_options)
        return real_table(uri, storage_options=storage_options)

    def write(*args: Any, storage_options: Any = None, **kwargs: Any) -> Any:
        given.append(storage_options)
        return real_write(*args, storage_options=storage_options, **kwargs)

    monkeypatch.setattr(store_module, "DeltaTable", table)
    monkeypatch.setattr(store_module, "write_deltalake", write)
    options = {"AWS_SECRET_ACCESS_KEY": f"${{env:{secret_env}}}", "AWS_REGION": "eu-west-1"}
    store = SketchStore(tmp_path, "emoji", storage_options=options)
    sketch = Sketch.zeros(2, 3)
    sketch.counts[1] = 1
    sketch.mark_modified()
    part = SegmentData(0, 0, 3600, "cms", {"k": 2, "m": 3}, sketch)
    store.commit([part], {("ldp.emoji.shuffled", 0): (None, 7)}, writer="a")
    assert store.committed_offsets("ldp.emoji.shuffled", [0]) == {0: 7}
    resolved = {"AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "eu-west-1"}
    assert given and all(seen == resolved for seen in given)
    assert store.storage_options == options  # the public attribute keeps the reference


def test_storage_options_missing_secret_names_the_option(tmp_path: Path, no_env: str) -> None:
    options = {"AWS_SECRET_ACCESS_KEY": f"${{env:{no_env}}}"}
    with pytest.raises(ConfigError) as caught:
        SketchStore(tmp_path, "emoji", storage_options=options)
    assert str(caught.value).startswith(
        f"use_case.emoji.store.storage_options.AWS_SECRET_ACCESS_KEY: ${{env:{no_env}}}: "
    )


def test_s3_store_resolves_alongside_its_defaults(secret_env: str) -> None:
    options = {"AWS_SECRET_ACCESS_KEY": f"${{env:{secret_env}}}"}
    store = SketchStore("s3://bucket/prefix", "emoji", storage_options=options)  # not contacted
    assert store.storage_options == {**options, "conditional_put": "etag"}
    assert SECRET not in repr(vars(store).get("storage_options"))
