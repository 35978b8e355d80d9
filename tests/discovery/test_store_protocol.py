"""The discoveries store's ``protocol`` field (``infra/storage/discovery_store.py``): "aux" or
"sfp".

Files written before SFP ran on the pipeline carry no ``protocol`` in their metadata; they are
aux-server releases and must keep reading as such. An unknown protocol is refused both ways.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from ldpipe.infra.storage.discovery_store import (
    PROTOCOLS,
    STORE_FORMAT,
    STORE_VERSION,
    DiscoveryStore,
    DiscoveryWindow,
    read_window,
    window_file_name,
)
from ldpipe.schemas.discovery.discovered import Discovery
from ldpipe.schemas.discovery.exceptions import DiscoveryStoreError
from ldpipe.schemas.discovery.tags import TAG_LENGTH

ZERO_TAG = bytes(TAG_LENGTH)


def _window(protocol: str, window_id: str = "w1") -> DiscoveryWindow:
    if protocol == "sfp":  # Apple Alg. 10: rounded word-sketch estimates, no tags, delta 0
        found = (Discovery("quokka", 712, 0, ZERO_TAG), Discovery("brunch", 498, 0, ZERO_TAG))
        return DiscoveryWindow(
            "newwords", window_id, 1.7e9, 243.2, 0.0, 8.0, 0.0, "local", found, protocol="sfp"
        )
    tagged = (Discovery("hello", 40, 5, bytes([7]) * TAG_LENGTH),)
    return DiscoveryWindow(
        "newwords", window_id, 1.7e9, 21.0, 1.0, 2.0, 1e-9, "replace-one", tagged, protocol=protocol
    )


def _write_raw(directory: Path, window_id: str, **meta: Any) -> Path:
    """A store file written by hand, with the metadata of the format before ``protocol``
    (``schemas/discovery.md``, "Discoveries store") plus ``meta``."""
    fields = {
        "format": STORE_FORMAT,
        "version": STORE_VERSION,
        "use_case": "newwords",
        "window_id": window_id,
        "released_at": 1.6e9,
        "threshold": 21.0,
        "laplace_scale": 1.0,
        "epsilon": 2.0,
        "delta": 1e-9,
        "neighbours": "replace-one",
        "items": 1,
        **meta,
    }
    schema = pa.schema(
        [
            pa.field("item", pa.string(), nullable=False),
            pa.field("noisy_count", pa.int64(), nullable=False),
            pa.field("tag_key_id", pa.uint32(), nullable=False),
            pa.field("tag", pa.binary(TAG_LENGTH), nullable=False),
        ],
        metadata={b"ldpipe.discoveries": json.dumps(fields).encode()},
    )
    table = pa.table(
        {
            "item": pa.array(["hello"], type=pa.string()),
            "noisy_count": pa.array([40], type=pa.int64()),
            "tag_key_id": pa.array([5], type=pa.uint32()),
            "tag": pa.array([bytes([7]) * TAG_LENGTH], type=pa.binary(TAG_LENGTH)),
        },
        schema=schema,
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / window_file_name("newwords", window_id)
    pq.write_table(table, path)
    return path


def test_protocols() -> None:
    assert PROTOCOLS == ("aux", "sfp")
    assert DiscoveryWindow("u", "w", 0.0, 0.0, 0.0, 1.0, 0.0, "local", ()).protocol == "aux"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_protocol_round_trips(tmp_path: Path, protocol: str) -> None:
    store = DiscoveryStore(tmp_path)
    window = _window(protocol)
    path = store.append(window)
    assert store.read("newwords", "w1") == window
    assert read_window(path).protocol == protocol
    assert [w.protocol for w in store.iter_windows("newwords")] == [protocol]


def test_both_protocols_share_a_store(tmp_path: Path) -> None:
    store = DiscoveryStore(tmp_path)
    store.append(_window("aux", "aux-1"))
    store.append(_window("sfp", "sfp:0-3600:100:100"))
    protocols = {w.window_id: w.protocol for w in store.iter_windows()}
    assert protocols == {"aux-1": "aux", "sfp:0-3600:100:100": "sfp"}


def test_a_file_without_protocol_reads_as_aux(tmp_path: Path) -> None:
    path = _write_raw(tmp_path, "0:0-1000")  # written before the field existed
    window = read_window(path)
    assert window.protocol == "aux"
    assert window.discoveries == (Discovery("hello", 40, 5, bytes([7]) * TAG_LENGTH),)
    assert (window.epsilon, window.delta, window.neighbours) == (2.0, 1e-9, "replace-one")
    store = DiscoveryStore(tmp_path)
    assert store.read("newwords", "0:0-1000") == window
    assert [(ref.window_id, ref.items) for ref in store.windows("newwords")] == [("0:0-1000", 1)]
    # the reader adds the default; the writer of today always records the field
    store.append(_window("aux", "w2"))
    meta = json.loads(pq.read_schema(store.windows()[-1].path).metadata[b"ldpipe.discoveries"])
    assert meta["protocol"] == "aux"


@pytest.mark.parametrize("protocol", ["gossip", "SFP", "", "aux "])
def test_an_unknown_protocol_is_refused_on_write(tmp_path: Path, protocol: str) -> None:
    store = DiscoveryStore(tmp_path)
    with pytest.raises(ValueError, match=r"protocol must be one of \('aux', 'sfp'\), got"):
        store.append(_window(protocol))
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("protocol", ["gossip", "SFP", "", 7, None, ["sfp"]])
def test_an_unknown_protocol_is_refused_on_read(tmp_path: Path, protocol: object) -> None:
    path = _write_raw(tmp_path, "w1", protocol=protocol)
    message = r"metadata field 'protocol' is not one of \('aux', 'sfp'\)"
    with pytest.raises(DiscoveryStoreError, match=message):
        read_window(path)
    with pytest.raises(DiscoveryStoreError, match=message):  # listing reads the metadata too
        DiscoveryStore(tmp_path).windows()
