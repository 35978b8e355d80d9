"""Property-based fuzzing (hypothesis) of every parser not fuzzed next to its codec.

Payloads and envelopes are fuzzed in ``test_payloads.py`` and ``test_envelope.py``; this file
covers the rest. For each parser only its typed error may escape, whatever the input:

* ``ldpipe.schemas.config.parse_config``: arbitrary text, TOML token soup, and structured mutations
  of valid configurations of every mechanism (values of the wrong type at every key, unknown keys,
  missing keys, out-of-range numbers, tables where scalars belong, dictionary files with random
  bytes): only ``ConfigError`` (the exact type), whose message names the field;
* ``ldpipe.aggregator.snapshot.read_snapshot``: random bytes, byte-level mutations of valid files
  (flip, set, truncate, extend, insert, delete, splice), read verified and unverified, and
  metadata mutations behind a recomputed (valid) checksum: only ``SnapshotError``; a verified
  read accepts nothing but the original bytes;
* ``ldpipe.shuffler.contributions.decode_entries``: only ``ValueError``, and encode/decode
  round-trips;
* ``ldpipe.producers.datasets.parse_spec`` / ``load_population``: only ``DatasetError`` (``file:``
  specs point only at files written here);
* ``ldpipe.infra.runtime.kafka.parse_extra``: only ``ValueError``, and a later key wins;
* ``ldpipe.aggregator.windows.decode_batch`` (envelope + payload): never raises, accepted and
  rejected positions partition the batch, every valid envelope is accepted and decodes as sent.

Known bugs are strict-xfail tests at the end of the file ("Known bugs"). The fuzzers tolerate
exactly those failures (exception type *and* the input that triggers it, see ``known_*_bug``)
so they keep guarding everything else, and avoid only inputs that would take minutes or
gigabytes (ocms with a large m, zipf with a huge d).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import hashlib
import itertools
import json
import math
import struct
import subprocess
import sys
import tempfile
import textwrap
import tomllib
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldpipe.aggregator.snapshot import read_snapshot, write_snapshot
from ldpipe.aggregator.snapshot_contents import SnapshotFile, WindowSketch
from ldpipe.aggregator.windows import decode_batch
from ldpipe.infra.runtime.kafka import parse_extra
from ldpipe.producers.client import DeviceClient
from ldpipe.producers.datasets import DatasetError, load_population, parse_spec
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.config_tables import ShuffleConfig, SnapshotConfig
from ldpipe.schemas.envelope import EnvelopeHeader, EnvelopeRejection, open_envelope, seal
from ldpipe.schemas.errors import SnapshotError
from ldpipe.schemas.keys import KeyPair, KeyRing
from ldpipe.schemas.mechanisms import Sketch, build_mechanism
from ldpipe.schemas.payloads import PayloadCodec, PayloadError, PayloadRejection
from ldpipe.shuffler.contributions import decode_entries, encode_entries, token_digest

ROOT = Path(__file__).resolve().parents[2]


def fuzz(examples: int) -> Callable[[Any], Any]:
    """Fixed examples, no deadline, no example database: the same inputs on every run."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


_serial = itertools.count()


def fresh(directory: Path, suffix: str) -> Path:
    """A new file name per example: a memory-mapped file is never truncated under a reader."""
    return directory / f"f{next(_serial):06d}{suffix}"


def text_no_surrogates(max_size: int) -> st.SearchStrategy[str]:
    return st.text(st.characters(exclude_categories=("Cs",)), max_size=max_size)


# ==== configuration =============================================================================
EDGE_INTS = [
    -(2**63), -(2**31), -1, 0, 1, 2, 3, 51, 52, 64, 65, 1024,
    2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**63 - 1, 2**64,
]  # fmt: skip
EDGE_FLOATS = [
    math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e-300, 1e-12, 0.5, 1.0, 4.0, 709.0,
    710.0, 1000.0, 1e300, 1.7976931348623157e308, -4.0,
]  # fmt: skip
WORDS = ["cms", "hcms", "gcms", "ocms", "rrcms", "oue", "builtin:emoji", "mse", "l2", "emoji"]

toml_scalars = st.one_of(
    st.booleans(),
    st.sampled_from(EDGE_INTS),
    st.integers(),
    st.sampled_from(EDGE_FLOATS),
    st.floats(),
    st.sampled_from(WORDS),
    text_no_surrogates(12),
    st.dates(),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)),
    st.times(),
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(text_no_surrogates(6), inner, max_size=3)
    ),
    max_leaves=6,
)


def toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    """One value as TOML on one line (tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict), value
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(doc: dict[str, Any]) -> str:
    return "".join(f"{toml_string(key)} = {toml_value(value)}\n" for key, value in doc.items())


MECHANISM_OPTIONS: dict[str, dict[str, Any]] = {
    "cms": {"k": 16, "m": 64},
    "hcms": {"k": 16, "m": 64},
    "gcms": {"k": 16, "m": 64, "s": 3},
    "ocms": {"k": 16, "m": 64, "target_frequency": 0.05},
    "rrcms": {"k": 16, "objective": "l2"},
    "oue": {"dictionary": "builtin:emoji"},
}
TABLE_KEYS: dict[str, list[str]] = {  # docs: infra/example.toml and schemas/config.py
    "top": ["kafka", "use_case"],
    "kafka": ["bootstrap_servers", "extra"],
    "use_case": [
        "name", "mechanism", "epsilon", "epoch", "k", "m", "p", "s", "hash_seed",
        "target_frequency", "objective", "f_star", "dictionary", "private_keys", "public_key",
        "topics", "shuffle", "snapshot",
    ],
    "topics": ["reports", "shuffled", "dlq", "shuffler_state", "partitions"],
    "shuffle": [f.name for f in dataclasses.fields(ShuffleConfig)],
    "snapshot": [f.name for f in dataclasses.fields(SnapshotConfig)],
    "sfp": [
        "enabled", "epsilon_fragment", "fragment_mechanism", "fragment_k", "fragment_m",
        "fragment_hash_seed", "word_length", "fragment_length", "piece_bits", "alphabet", "pad",
        "lowercase", "fragment_z", "word_z", "fragment_top", "max_words_per_piece", "threshold",
        "store", "topics",
    ],
}  # fmt: skip
SFP_TABLE = {  # a small valid [use_case.sfp] (cms and hcms use cases only)
    "fragment_k": 8, "fragment_m": 64, "word_length": 4, "fragment_length": 2, "piece_bits": 2,
    "alphabet": "abc", "topics": {"dlq": "ldp.emoji.fragments.dead"},
}  # fmt: skip


def valid_use_case(mechanism: str, name: str = "emoji") -> dict[str, Any]:
    return {
        "name": name,
        "mechanism": mechanism,
        "epsilon": 4.0,
        "epoch": 3,
        **({} if mechanism == "oue" else {"hash_seed": 7}),
        **MECHANISM_OPTIONS[mechanism],
        "private_keys": ["keys/emoji.private.json"],
        "public_key": "keys/emoji.public.json",
        "topics": {"partitions": 2, "dlq": "ldp.emoji.dead"},
        "shuffle": {"n_min": 10, "max_reports": 100, "max_wait_seconds": 1.5, "delta": 1e-7},
        "snapshot": {"directory": "snapshots", "interval_seconds": 1.0, "keep_files": 3},
    }


def valid_config(mechanism: str) -> dict[str, Any]:
    return {
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "extra": {"client.id": "fuzz"}},
        "use_case": [valid_use_case(mechanism)],
    }


def tables(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(kind, table) of every table of a configuration document that is still a table."""
    found: list[tuple[str, dict[str, Any]]] = [("top", doc)]
    if isinstance(doc.get("kafka"), dict):
        found.append(("kafka", doc["kafka"]))
    cases = doc.get("use_case")
    for case in cases if isinstance(cases, list) else []:
        if isinstance(case, dict):
            found.append(("use_case", case))
            for key in ("topics", "shuffle", "snapshot", "sfp"):
                if isinstance(case.get(key), dict):
                    found.append((key, case[key]))
            sfp = case.get("sfp")
            if isinstance(sfp, dict) and isinstance(sfp.get("topics"), dict):
                found.append(("topics", sfp["topics"]))
    return found


INT_KEYS = {
    "epoch", "k", "m", "s", "hash_seed", "partitions", "n_min", "max_reports",
    "contribution_limit", "contribution_period_seconds", "window_seconds", "keep_windows",
    "keep_files", "dedupe_horizon", "fragment_k", "fragment_m", "fragment_hash_seed",
    "word_length", "fragment_length", "piece_bits", "fragment_top", "max_words_per_piece",
}  # fmt: skip
FLOAT_KEYS = {
    "epsilon", "p", "target_frequency", "f_star", "max_wait_seconds", "delta", "interval_seconds",
    "epsilon_fragment", "fragment_z", "word_z", "threshold",
}  # fmt: skip
MECHANISM_KEYS = ("k", "m", "p", "s", "hash_seed", "target_frequency", "objective", "f_star")


def typed_values(key: str) -> st.SearchStrategy[Any]:
    """Values of the type ``key`` takes (so range checks are reached), many at the edges."""
    if key in INT_KEYS:
        return st.sampled_from(EDGE_INTS) | st.integers(-3, 300)
    if key in FLOAT_KEYS:  # an integer is a valid float setting
        return st.sampled_from(EDGE_FLOATS) | st.floats(-1, 10) | st.integers(-2, 5)
    if key in ("private_keys", "public_key"):
        return st.lists(text_no_surrogates(6), max_size=2) | text_no_surrogates(6)
    return st.sampled_from(WORDS) | text_no_surrogates(10)


@st.composite
def mutated_configs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A valid configuration with 1-3 mutations; and dictionary files to write first."""
    mechanism = draw(st.sampled_from(sorted(MECHANISM_OPTIONS)))
    doc = valid_config(mechanism)
    if mechanism in ("cms", "hcms") and draw(st.booleans()):  # an SFP use case
        doc["use_case"][0]["sfp"] = copy.deepcopy(SFP_TABLE)
    files: dict[str, bytes] = {}
    for _ in range(draw(st.integers(1, 3))):
        found = tables(doc)  # the top level rarely: replacing [kafka] or use_case hides the rest
        top = draw(st.integers(0, 9)) == 9 or len(found) == 1
        kind, table = found[0] if top else draw(st.sampled_from(found[1:]))
        action = draw(
            st.sampled_from(
                ["typed", "typed", "typed", "set", "unknown", "delete", "table", "dup", "dict"]
            )
        )
        key = draw(st.sampled_from(TABLE_KEYS[kind]))
        if action == "typed":  # right type, maybe out of range
            table[key] = draw(typed_values(key))
        elif action == "set":  # any value: mostly the wrong type
            table[key] = draw(toml_values)
        elif action == "unknown":
            table[draw(text_no_surrogates(8))] = draw(toml_values)
        elif action == "delete" and table:
            del table[draw(st.sampled_from(sorted(table)))]
        elif action == "table":  # a table where a scalar belongs
            table[key] = draw(st.dictionaries(text_no_surrogates(6), toml_scalars, max_size=2))
        elif action == "dup" and isinstance(doc.get("use_case"), list):
            cases = doc["use_case"]
            cases.append(copy.deepcopy(cases[0]) if cases else {})
            if cases[0] and draw(st.booleans()):
                cases[-1]["name"] = "other"
        elif action == "dict" and kind == "use_case":  # an oue dictionary file of random bytes
            content = draw(
                st.binary(max_size=60)
                | st.lists(text_no_surrogates(8), max_size=5).map(
                    lambda lines: "\n".join(lines).encode()
                )
            )
            name = f"dict-{hashlib.sha256(content).hexdigest()[:16]}.txt"
            files[name] = content
            for option in MECHANISM_KEYS:
                table.pop(option, None)
            table.update(mechanism="oue", dictionary=name)
    return doc, files


TOKENS = [
    "[[use_case]]\n", "[kafka]\n", "[use_case.shuffle]\n", "[use_case.topics]\n",
    "[use_case.snapshot]\n", "[kafka.extra]\n", "\n", "name = ", '"emoji"', "mechanism = ",
    '"cms"', '"oue"', '"ocms"', '"rrcms"', "epsilon = ", "4.0", "1e999", "nan", "-inf", "k = ",
    "m = ", "16", "-1", "0", "true", "dictionary = ", '"builtin:emoji"', "n_min = ",
    "max_reports = ", "public_key = ", "[]", "{}", "{ a = 1 }", "[1, 2]", "=", "[", "]", "{",
    "}", ",", '"', "'", "#", "1979-05-27", "use_case = ", "kafka = ", "extra = ",
]  # fmt: skip


def slow_config(doc: Any) -> bool:
    """ocms optimizes over an (m-1) x 256 grid: m = 65536 takes seconds, m = 2^20 a minute."""
    if not isinstance(doc, dict) or not isinstance(doc.get("use_case"), list):
        return False
    for case in doc["use_case"]:
        if isinstance(case, dict) and case.get("mechanism") == "ocms":
            m = case.get("m")
            if isinstance(m, int) and not isinstance(m, bool) and 1024 < m <= 2**32:
                return True
    return False


def known_config_bug(doc: Any, exc: BaseException) -> str | None:
    """Which known bug (tests below) explains ``exc`` escaping for ``doc``; None if none does."""
    cases = doc.get("use_case") if isinstance(doc, dict) else None
    for case in cases if isinstance(cases, list) else []:
        if not isinstance(case, dict):
            continue
        eps, mech = case.get("epsilon"), case.get("mechanism")
        big = isinstance(eps, int | float) and not isinstance(eps, bool) and eps > 709
        if isinstance(exc, OverflowError) and big and mech in ("gcms", "ocms", "rrcms"):
            return "test_config_huge_epsilon_is_a_config_error"
        if isinstance(exc, RuntimeWarning) and mech == "ocms":
            return "test_config_ocms_tiny_epsilon_is_a_config_error_naming_epsilon"
        if isinstance(exc, UnicodeDecodeError) and mech == "oue":
            return "test_config_dictionary_file_not_utf8_is_a_config_error"
    return None


def check_config(text: str, base: Path) -> None:
    try:
        doc: Any = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        doc = None
    if slow_config(doc):
        return
    try:
        cfg = parse_config(text, base=base)
    except ConfigError as exc:
        assert type(exc) is ConfigError
        assert str(exc).startswith(("configuration", "kafka", "use_case")), str(exc)
        return
    except Exception as exc:
        if known_config_bug(doc, exc) is None:
            raise
        return
    assert cfg.use_cases and len({uc.name for uc in cfg.use_cases}) == len(cfg.use_cases)
    for uc in cfg.use_cases:  # validated: the mechanism was built inside parse_config
        assert uc.mechanism.name == uc.mechanism_name
        assert uc.shuffle.n_min <= uc.shuffle.max_reports and uc.topics.partitions >= 1


@pytest.mark.parametrize("mechanism", sorted(MECHANISM_OPTIONS))
def test_config_base_documents_are_valid(mechanism: str, workdir: Path) -> None:
    cfg = parse_config(toml_document(valid_config(mechanism)), base=workdir)
    uc = cfg.use_case("emoji")
    assert uc.mechanism.name == mechanism and uc.topics.dlq == "ldp.emoji.dead"
    assert uc.snapshot.directory == workdir / "snapshots"


@pytest.mark.parametrize("mechanism", ["cms", "hcms"])
def test_config_sfp_base_documents_are_valid(mechanism: str, workdir: Path) -> None:
    doc = valid_config(mechanism)
    doc["use_case"][0]["sfp"] = copy.deepcopy(SFP_TABLE)
    word, fragments = parse_config(toml_document(doc), base=workdir).use_cases
    assert (word.name, fragments.name) == ("emoji", "emoji.fragments")
    assert fragments.mechanism.k == 2 * 8 and fragments.topics.dlq == "ldp.emoji.fragments.dead"


@fuzz(300)
@given(text_no_surrogates(200))
def test_config_arbitrary_text(workdir: Path, text: str) -> None:
    check_config(text, workdir)


@fuzz(300)
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map("".join))
def test_config_token_soup(workdir: Path, text: str) -> None:
    check_config(text, workdir)


@fuzz(400)
@given(mutated_configs())
def test_config_structured_mutations(
    workdir: Path, case: tuple[dict[str, Any], dict[str, bytes]]
) -> None:
    doc, files = case
    for name, content in files.items():
        (workdir / name).write_bytes(content)
    check_config(toml_document(doc), workdir)


# ==== snapshots =================================================================================
@cache
def snapshot_bytes(compression: str) -> bytes:
    """A valid snapshot file: two windows (cms, oue) and seen digests."""
    rng = np.random.default_rng(11)
    cms = build_mechanism("cms", epsilon=4.0, k=4, m=8, seed=1)
    oue = build_mechanism("oue", epsilon=2.0, dictionary=("a", "b", "c"))
    windows = []
    for mech, start in ((cms, 0), (oue, 3600)):
        counts = rng.integers(0, 1000, size=(mech.k, mech.m), dtype=np.int64)
        sketch = Sketch(counts, rng.integers(0, 100, size=mech.k, dtype=np.int64))
        windows.append(
            WindowSketch.from_mechanism(
                "emoji", mech, sketch, epoch=1, window_start=start, window_end=start + 3600
            )
        )
    snap = SnapshotFile(
        "agg-0",
        7,
        {("ldp.emoji.shuffled", 0): 10, ("ldp.emoji.shuffled", 1): 12},
        tuple(windows),
        created_at=1.7e9,
        seen=np.arange(5, dtype=np.uint64),
    )
    with tempfile.TemporaryDirectory() as directory:
        return write_snapshot(directory, snap, compression=compression).read_bytes()  # type: ignore[arg-type]


def check_snapshot(
    directory: Path,
    data: bytes,
    *,
    mutated: bool = False,
    tolerate: Callable[[BaseException], bool] | None = None,
) -> None:
    """Only SnapshotError (or a ``tolerate``d known bug), reading 4 ways; a verified read of a
    mutated file accepts only a valid file's exact bytes."""
    path = fresh(directory, ".arrow")
    path.write_bytes(data)
    try:
        for mmap, verify in itertools.product((True, False), (True, False)):
            try:
                snap = read_snapshot(path, mmap=mmap, verify=verify)
            except SnapshotError as exc:
                assert str(exc)
                continue
            except Exception as exc:
                if tolerate is None or not tolerate(exc):
                    raise
                continue
            if verify and mutated:  # a graft may rebuild the other valid file
                valid = (snapshot_bytes("none"), snapshot_bytes("zstd"))
                assert data in valid, "a verified read accepted altered bytes"
            assert snap.writer and all(w.sketch.counts.ndim == 2 for w in snap.windows)
            del snap
    finally:
        path.unlink()


@fuzz(150)
@given(st.binary(max_size=400))
def test_snapshot_random_bytes(workdir: Path, data: bytes) -> None:
    check_snapshot(workdir, data)
    check_snapshot(workdir, b"ARROW1\0\0" + data + b"ARROW1")


@st.composite
def mutated_snapshots(draw: st.DrawFn) -> bytes:
    original = snapshot_bytes(draw(st.sampled_from(["none", "zstd"])))
    data = bytearray(original)
    kinds = ["flip", "set", "truncate", "extend", "insert", "delete", "splice", "graft"]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(kinds))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[at:]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=40))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == "splice":  # a chunk of the file copied over another place
            size = draw(st.integers(1, 64))
            source = draw(st.integers(0, max(0, len(data) - 1)))
            data[at : at + size] = data[source : source + size]
        else:  # graft: the head of this file onto the tail of the other compression's file
            other = snapshot_bytes("zstd" if original == snapshot_bytes("none") else "none")
            data = bytearray(data[:at] + other[draw(st.integers(0, len(other))) :])
    return bytes(data)


@fuzz(400)
@given(mutated_snapshots())
def test_snapshot_mutated_files(workdir: Path, data: bytes) -> None:
    check_snapshot(workdir, data, mutated=True)


# metadata behind a valid checksum: the reader's JSON and field checks, not the checksum
_PLACEHOLDER = b"sha256:" + b"0" * 64
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(EDGE_INTS)
    | st.floats(allow_nan=False)
    | text_no_surrogates(8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(text_no_surrogates(6), inner, max_size=3)
    ),
    max_leaves=8,
)
SPEC_KEYS = {
    b"ldpipe.offsets": ["topic", "partition", "next_offset"],
    b"ldpipe.windows": [
        "use_case", "mechanism", "params", "epoch", "window_start", "window_end", "k", "m", "n",
    ],
}  # fmt: skip


def rewrite(data: bytes, metadata: dict[bytes, bytes], batches: list[Any]) -> bytes:
    """An Arrow IPC file of ``batches`` with ``metadata`` and a correct ldpipe checksum."""
    reader = pa.ipc.open_file(pa.py_buffer(data))
    schema = reader.schema.remove_metadata().with_metadata(
        {**metadata, b"ldpipe.checksum": _PLACEHOLDER}
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    raw = sink.getvalue().to_pybytes()
    assert raw.count(_PLACEHOLDER) == 2  # schema message and footer (schemas/snapshot.md)
    digest = hashlib.sha256(raw).hexdigest().encode()
    return raw.replace(_PLACEHOLDER, b"sha256:" + digest)


@st.composite
def remetadata_snapshots(draw: st.DrawFn) -> tuple[bytes, dict[bytes, bytes]]:
    data = snapshot_bytes(draw(st.sampled_from(["none", "zstd"])))
    reader = pa.ipc.open_file(pa.py_buffer(data))
    metadata = {k: v for k, v in reader.schema.metadata.items() if k != b"ldpipe.checksum"}
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    original_keys = set(SPEC_KEYS)  # still the writer's JSON
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["field", "field", "value", "bytes", "delete", "batches"]))
        key = draw(st.sampled_from(sorted(SPEC_KEYS if action == "field" else metadata)))
        if action == "field":  # one field of one entry of a JSON list
            entries = json.loads(metadata[key]) if key in original_keys else None
            if isinstance(entries, list) and entries and isinstance(entries[0], dict):
                entry = entries[draw(st.integers(0, len(entries) - 1))]
                name = draw(st.sampled_from(SPEC_KEYS[key]))
                if draw(st.booleans()):
                    entry[name] = draw(json_values)
                else:
                    entry.pop(name, None)
                metadata[key] = json.dumps(entries).encode()
        elif action == "value":
            metadata[key] = json.dumps(draw(json_values)).encode()
            original_keys.discard(key)
        elif action == "bytes":
            metadata[key] = draw(st.binary(max_size=20) | st.sampled_from([b"-1", b"1e400", b""]))
            original_keys.discard(key)
        elif action == "delete" and key in metadata:
            del metadata[key]
            original_keys.discard(key)
        elif action == "batches" and batches:
            batches = draw(st.permutations(batches))[: draw(st.integers(0, len(batches)))]
    return rewrite(data, metadata, batches), metadata


def known_snapshot_bug(metadata: dict[bytes, bytes], exc: BaseException) -> str | None:
    if isinstance(exc, OverflowError):
        try:
            windows = json.loads(metadata.get(b"ldpipe.windows", b"[]"))
            created = json.loads(metadata.get(b"ldpipe.created_at", b"0"))
        except ValueError:
            return None
        if isinstance(created, int) and abs(created) >= 2**1024:
            return "test_snapshot_huge_created_at_is_a_snapshot_error"
        if isinstance(windows, list) and any(
            isinstance(w, dict) and isinstance(w.get("m"), int) and w["m"] >= 2**63 for w in windows
        ):
            return "test_snapshot_huge_m_is_a_snapshot_error"
    return None


@fuzz(200)
@given(remetadata_snapshots())
def test_snapshot_metadata_mutations_behind_a_valid_checksum(
    workdir: Path, case: tuple[bytes, dict[bytes, bytes]]
) -> None:
    data, metadata = case
    check_snapshot(
        workdir, data, tolerate=lambda exc: known_snapshot_bug(metadata, exc) is not None
    )


def test_snapshot_rewrite_helper_keeps_a_valid_file(workdir: Path) -> None:
    data = snapshot_bytes("zstd")
    reader = pa.ipc.open_file(pa.py_buffer(data))
    metadata = {k: v for k, v in reader.schema.metadata.items() if k != b"ldpipe.checksum"}
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    path = fresh(workdir, ".arrow")
    path.write_bytes(rewrite(data, metadata, batches))
    snap = read_snapshot(path)
    assert snap.sequence == 7 and len(snap.windows) == 2 and snap.seen.tolist() == list(range(5))


# ==== contribution-ledger entries ===============================================================
entries = st.lists(
    st.tuples(
        st.binary(min_size=8, max_size=8) | st.binary().map(token_digest),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**64 - 1),
    ),
    max_size=20,
)


@fuzz(300)
@given(st.binary(max_size=200))
def test_decode_entries_only_value_error(data: bytes) -> None:
    try:
        decoded = decode_entries(data)
    except ValueError as exc:
        assert type(exc) is ValueError and len(data) % 20 != 0
        return
    assert len(decoded) == len(data) // 20
    assert encode_entries(decoded) == b"".join(
        struct.pack("<8sIQ", *entry) for entry in sorted(decoded)
    )
    if decoded == sorted(decoded):
        assert encode_entries(decoded) == data


@fuzz(150)
@given(entries)
def test_entries_round_trip(items: list[tuple[bytes, int, int]]) -> None:
    data = encode_entries(items)
    assert len(data) == 20 * len(items)
    assert decode_entries(data) == sorted(items)
    assert decode_entries(bytearray(data)) == decode_entries(memoryview(data)) == sorted(items)


# ==== dataset specs =============================================================================
def is_file_spec(spec: str) -> bool:
    kind, sep, _ = spec.partition(":")
    return bool(sep) and kind == "file"


def zipf_too_big(spec: str) -> bool:
    """zipf allocates d floats: d in the billions takes gigabytes (known bug, see below)."""
    try:
        kind, fields = parse_spec(spec)
        return kind == "zipf" and int(fields["d"]) > 100_000
    except ValueError:
        return False


def check_spec(spec: str) -> None:
    try:
        kind, fields = parse_spec(spec)
    except DatasetError as exc:
        assert type(exc) is DatasetError
    else:
        assert kind in ("zipf", "file")
        assert set(fields) == ({"d", "a"} if kind == "zipf" else {"path"})
    if is_file_spec(spec) or zipf_too_big(spec):
        return  # never read a file this test did not write
    try:
        population = load_population(spec, n=10, seed=0)
    except DatasetError as exc:
        assert type(exc) is DatasetError
        return
    assert population.n == 10 and len(population.items) == len(population.counts)
    assert (population.counts >= 0).all()


@fuzz(300)
@given(text_no_surrogates(40))
def test_dataset_arbitrary_specs(spec: str) -> None:
    check_spec(spec)


NUMBER_TEXT = st.one_of(
    st.integers(-10, 10**6).map(str),
    st.floats().map(repr),
    st.sampled_from(["", " 5 ", "1_0", "0x10", "²", "٣", "nan", "inf", "-inf", "1e3", "9" * 30]),
    text_no_surrogates(4),
)


@st.composite
def zipf_specs(draw: st.DrawFn) -> str:
    fields = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["d", "a", " d ", "x", ""]),
                st.sampled_from(["=", "==", ""]),
                NUMBER_TEXT,
            ),
            max_size=4,
        )
    )
    return "zipf:" + ",".join(k + eq + v for k, eq, v in fields)


@fuzz(200)
@given(zipf_specs())
def test_dataset_zipf_specs(spec: str) -> None:
    check_spec(spec)


def known_dataset_bug(content: bytes) -> str | None:
    """Which known bug (tests below) a dataset file triggers, replaying how ``_file`` reads it."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return "test_dataset_file_not_utf8_is_a_dataset_error"
    tally: dict[str, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        item, comma, count_text = line.rpartition(",")
        if comma and count_text.strip().isdigit():
            try:
                count = int(count_text)
            except ValueError:  # '²' is a digit to isdigit, not to int
                return "test_dataset_file_bad_counts_are_a_dataset_error"
        else:
            item, count = line, 1
        if not item:
            return None
        tally[item] = tally.get(item, 0) + count
    if not tally:
        return None
    total = sum(tally.values())
    if max(tally.values()) >= 2**63 or total >= 2**63 or total == 0:
        return "test_dataset_file_bad_counts_are_a_dataset_error"
    return None


dataset_lines = st.lists(
    st.tuples(
        st.sampled_from(["apple", "b", "", " ", "with,comma", "é"]) | text_no_surrogates(6),
        st.sampled_from(["", ","]),
        st.sampled_from(["0", "1", "7", " 3", "²", "9" * 20, "9" * 5000, "x"])
        | st.integers(0, 2**64).map(str),
    ),
    max_size=6,
).map(lambda rows: "\n".join(i + c + n for i, c, n in rows).encode())


@fuzz(200)
@given(st.binary(max_size=80) | dataset_lines)
def test_dataset_files(workdir: Path, content: bytes) -> None:
    path = fresh(workdir, ".txt")
    path.write_bytes(content)
    try:
        population = load_population(f"file:{path}", n=10, seed=0)
    except DatasetError as exc:
        assert type(exc) is DatasetError
        return
    except Exception:
        if known_dataset_bug(content) is None:
            raise
        return
    assert population.n == 10 and len(set(population.items)) == len(population.items)


# ==== -X key=value ==============================================================================
@fuzz(200)
@given(st.lists(text_no_surrogates(20) | st.sampled_from(["=", "a=", "=b", " k = v", "a=b=c"])))
def test_parse_extra_only_value_error(items: list[str]) -> None:
    try:
        extra = parse_extra(items)
    except ValueError as exc:
        assert type(exc) is ValueError
        assert any(
            not item.partition("=")[1] or not item.partition("=")[0].strip() for item in items
        )
        return
    expected: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition("=")
        expected[key.strip()] = value
    assert extra == expected


# ==== the aggregator's decode path ==============================================================
USE_CASE, EPOCH = "fuzz", 3
KEY_PAIR = KeyPair(41, X25519PrivateKey.from_private_bytes(hashlib.sha256(b"ldpipe-fuzz").digest()))
MECHANISM = build_mechanism("cms", epsilon=4.0, k=16, m=16)
CODEC = PayloadCodec.for_mechanism(MECHANISM)
CLIENT = DeviceClient(USE_CASE, EPOCH, KEY_PAIR.public, MECHANISM)
REASONS = {  # decode_batch's rejections are (position, layer, reason)
    "envelope": {str(r) for r in EnvelopeRejection},
    "payload": {str(r) for r in PayloadRejection},
}


@cache
def valid_envelopes() -> tuple[bytes, ...]:
    rng = np.random.default_rng(5)
    return tuple(CLIENT.reports([f"item-{i % 7}" for i in range(24)], rng))


@st.composite
def batch_values(draw: st.DrawFn) -> list[bytes | None]:
    values: list[bytes | None] = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["valid", "valid", "none", "bytes", "mutated", "sealed"]))
        if kind == "valid":
            values.append(draw(st.sampled_from(valid_envelopes())))
        elif kind == "none":
            values.append(None)
        elif kind == "bytes":
            values.append(draw(st.binary(max_size=120)))
        elif kind == "mutated":
            data = bytearray(draw(st.sampled_from(valid_envelopes())))
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= draw(st.integers(1, 255))
            values.append(bytes(data[: draw(st.integers(0, len(data)))]))
        else:  # a correct envelope around a random payload, maybe of another use case or epoch
            header = EnvelopeHeader(
                draw(st.sampled_from([USE_CASE, "other"])),
                draw(st.sampled_from([EPOCH, EPOCH + 1])),
                KEY_PAIR.key_id,
            )
            payload = draw(
                st.binary(max_size=2 * CODEC.record_length)
                | st.sampled_from(valid_payloads()).map(bytes)
            )
            values.append(seal(header, payload, KEY_PAIR.public))
    return values


@cache
def valid_payloads() -> tuple[bytes, ...]:
    return tuple(CODEC.encode(MECHANISM.randomize(["a", "b", "c"], np.random.default_rng(2))))


def expected_report(value: bytes | None) -> tuple[int, list[int]] | None:
    """What decoding one value alone gives: (row, values) of its report, or None if refused."""
    try:
        _header, payload = open_envelope(
            value, KeyRing([KEY_PAIR]), use_case=USE_CASE, epochs={EPOCH}
        )  # type: ignore[arg-type]
        report = CODEC.decode(payload)
    except (PayloadError, ValueError):
        return None
    return int(report.rows[0]), report.values[0].tolist()


@fuzz(150)
@given(batch_values())
def test_decode_batch_never_raises_and_partitions(values: list[bytes | None]) -> None:
    batch = decode_batch(values, KeyRing([KEY_PAIR]), CODEC, use_case=USE_CASE, epochs={EPOCH})
    accepted = batch.positions.tolist()
    rejected = [position for position, _layer, _reason in batch.rejections]
    assert sorted(accepted + rejected) == list(range(len(values)))
    assert accepted == sorted(accepted) and rejected == sorted(rejected)
    for _position, layer, reason in batch.rejections:
        assert reason in REASONS[layer]
    assert len(batch.reports) == len(accepted)
    valid = set(valid_envelopes())
    assert {i for i, v in enumerate(values) if v in valid} <= set(accepted)
    for j, i in enumerate(accepted):  # each accepted report is the one its envelope carries
        want = expected_report(values[i])
        assert want == (int(batch.reports.rows[j]), batch.reports.values[j].tolist())
    for i in rejected:
        assert expected_report(values[i]) is None


# ==== bugs the fuzzers found: fixed ones are regression tests, open ones strict xfails ====
# Each test states the behaviour the acceptance criterion asks for.
def _config(mechanism: str, extra: str = "", epsilon: str = "4.0", name: str = "emoji") -> str:
    return (
        f'[[use_case]]\nname = {toml_string(name)}\nmechanism = "{mechanism}"\n'
        f"epsilon = {epsilon}\n{extra}"
    )


@pytest.mark.parametrize("mechanism", ["rrcms", "gcms", "ocms"])
def test_config_huge_epsilon_is_a_config_error(mechanism: str) -> None:
    with pytest.raises(ConfigError, match="epsilon"):
        parse_config(_config(mechanism, epsilon="1000.0"))


@pytest.mark.parametrize("value", ["[]", '["a.json", "b.json"]', "7", "{}"])
def test_config_public_key_is_one_path(value: str) -> None:
    """Found by the structured fuzzer (`public_key = []` raised IndexError); fixed since."""
    with pytest.raises(ConfigError, match="public_key"):
        parse_config(_config("cms", f"public_key = {value}\n"))


def test_config_dictionary_file_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "words.txt").write_bytes(b"caf\xe9\nthe\n")
    with pytest.raises(ConfigError, match="dictionary"):
        parse_config(_config("oue", 'dictionary = "words.txt"\n'), base=tmp_path)


def test_config_ocms_tiny_epsilon_is_a_config_error_naming_epsilon() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ConfigError, match="epsilon"):
            parse_config(_config("ocms", "m = 8\n", epsilon="1e-300"))


def test_config_ocms_huge_m_is_refused_quickly() -> None:
    script = textwrap.dedent(
        """
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from ldpipe.schemas.config import parse_config
        from ldpipe.schemas.config_checks import ConfigError
        from ldpipe.schemas.config_tables import ShuffleConfig, SnapshotConfig
        try:
            parse_config(sys.argv[1])
        except ConfigError:
            sys.exit(0)
        """
    )
    text = _config("ocms", "m = 4294967296\n")
    done = subprocess.run(
        [sys.executable, "-c", script, text], cwd=ROOT, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()[-300:]


@pytest.mark.parametrize("name", ["a" * 52, "a" * 64, "Emoji", "-emoji", ""])
def test_config_name_longer_than_an_envelope_use_case_id_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="name"):
        parse_config(_config("cms", name=name))


def test_config_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ConfigError, match="name"):
        parse_config(_config("cms", name="emoji\n"))


@pytest.mark.parametrize(
    "table",
    [
        "[use_case.shuffle]\nmax_wait_seconds = nan\n",
        "[use_case.snapshot]\ninterval_seconds = nan\n",
    ],
)
def test_config_nan_durations_are_refused(table: str) -> None:
    with pytest.raises(ConfigError, match="must be > 0"):
        parse_config(_config("cms", table))


def _snapshot_with(metadata_change: Callable[[dict[bytes, bytes]], None]) -> bytes:
    data = snapshot_bytes("none")
    reader = pa.ipc.open_file(pa.py_buffer(data))
    metadata = {k: v for k, v in reader.schema.metadata.items() if k != b"ldpipe.checksum"}
    metadata_change(metadata)
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    return rewrite(data, metadata, batches)


@pytest.mark.parametrize("key", [b"ldpipe.windows", b"ldpipe.offsets", b"ldpipe.created_at"])
def test_snapshot_deep_json_is_a_snapshot_error(tmp_path: Path, key: bytes) -> None:
    path = tmp_path / "agg-0-000000000007.arrow"
    path.write_bytes(_snapshot_with(lambda md: md.__setitem__(key, b"[" * 100_000)))
    with pytest.raises(SnapshotError):
        read_snapshot(path, verify=False)


def test_snapshot_huge_m_is_a_snapshot_error(tmp_path: Path) -> None:
    def change(md: dict[bytes, bytes]) -> None:
        windows = json.loads(md[b"ldpipe.windows"])
        windows[0]["m"] = 2**63
        md[b"ldpipe.windows"] = json.dumps(windows).encode()

    path = tmp_path / "agg-0-000000000007.arrow"
    path.write_bytes(_snapshot_with(change))
    with pytest.raises(SnapshotError):
        read_snapshot(path)


def test_snapshot_huge_created_at_is_a_snapshot_error(tmp_path: Path) -> None:
    path = tmp_path / "agg-0-000000000007.arrow"
    path.write_bytes(
        _snapshot_with(lambda md: md.__setitem__(b"ldpipe.created_at", b"1" + b"0" * 400))
    )
    with pytest.raises(SnapshotError):
        read_snapshot(path)


def test_dataset_file_not_utf8_is_a_dataset_error(tmp_path: Path) -> None:
    path = tmp_path / "items.txt"
    path.write_bytes(b"caf\xe9\n")
    with pytest.raises(DatasetError):
        load_population(f"file:{path}", n=10, seed=0)


@pytest.mark.parametrize(
    "content",
    ["x," + "9" * 5000 + "\n", "x,99999999999999999999\n",
     "a,9223372036854775807\nb,9223372036854775807\n", "x,0\n"],
    ids=["4301-digits", "above-int64", "sum-wraps", "zero-total"],
)  # fmt: skip
def test_dataset_file_bad_counts_are_a_dataset_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "items.txt"
    path.write_text(content, encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(DatasetError):
            load_population(f"file:{path}", n=10, seed=0)


def test_dataset_zipf_huge_d_is_a_dataset_error() -> None:
    with pytest.raises(DatasetError):
        load_population("zipf:d=100000000000000000000,a=1", n=10, seed=0)
