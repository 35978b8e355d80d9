"""The deployment identity of a sketch store (``infra/storage/identity.py``, ``schemas/store.md``,
"Deployment identity"): the compare rules, the vector, and the table that records, adopts,
merges and refuses (a real Delta table in a temporary directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ldpipe.infra.storage.identity import (
    ForeignStoreError,
    StoreIdentity,
    compare,
    key_mark,
    same_cluster,
)
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.schemas.errors import LdpipeError
from tests.aggregator_helpers import EMOJI, emoji
from tests.store_helpers import seal_windows

VECTORS = Path(__file__).parents[2] / "schemas" / "vectors" / "store-identity.json"
TOPIC = "ldp.emoji.shuffled"
A = StoreIdentity("emoji", TOPIC, "ldpipe-aaaaaaaaaaaa", ("1:1111111111111111",))


def _with(**changes: object) -> StoreIdentity:
    fields = {"use_case": A.use_case, "topic": A.topic, "cluster": A.cluster, "keys": A.keys}
    return StoreIdentity(**{**fields, **changes})  # type: ignore[arg-type]


def test_the_vector() -> None:
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))
    for case in vectors["key_marks"]:
        assert key_mark(case["key_id"], bytes.fromhex(case["public_key_hex"])) == case["mark"]
    for case in vectors["documents"]:
        fields = case["identity"]
        identity = StoreIdentity(
            fields["use_case"], fields["topic"], fields["cluster"], tuple(fields["keys"])
        )
        assert identity.to_json() == case["text"]
        assert StoreIdentity.from_json(case["text"], "vector") == identity


@pytest.mark.parametrize(
    ("mine", "differs"),
    [
        (_with(), None),
        (_with(keys=("1:1111111111111111", "2:2222222222222222")), None),  # a rotation
        (_with(keys=()), None),  # a keyring the aggregator cannot list: not compared
        (_with(cluster="ldpipe-bbbbbbbbbbbb"), None),  # a restarted embedded broker
        (_with(cluster=None), None),  # a broker that names no cluster
        (_with(use_case="words"), "use_case"),
        (_with(topic="ldp.emoji.other"), "topic"),
        (_with(keys=("1:9999999999999999",)), "keys"),  # same key id, other key material
        (_with(cluster="kafka-prod-b"), "cluster"),
    ],
)
def test_compare(mine: StoreIdentity, differs: str | None) -> None:
    assert compare(A, mine) == differs


def test_a_kafka_cluster_is_the_same_only_by_its_id() -> None:
    assert same_cluster("kafka-a", "kafka-a")
    assert not same_cluster("kafka-a", "kafka-b")
    assert not same_cluster("ldpipe-aaaaaaaaaaaa", "kafka-b")  # embedded, then a real cluster
    assert same_cluster("ldpipe-aaaaaaaaaaaa", "ldpipe-bbbbbbbbbbbb")


def test_an_unreadable_identity_is_one_line() -> None:
    with pytest.raises(LdpipeError) as err:
        StoreIdentity.from_json("{not json", "sketch store s/emoji")
    assert "\n" not in str(err.value) and "sketch store s/emoji" in str(err.value)
    assert StoreIdentity.from_configuration({}, "s") is None


def _commit(store: SketchStore, ends: dict[int, int]) -> int:
    bases = store.committed_offsets(TOPIC, sorted(ends))
    return store.commit([], {(TOPIC, p): (bases[p], e) for p, e in ends.items()}, writer="w")


def test_a_new_store_records_its_writers_identity_and_grows_its_keys(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    assert store.identity() is None
    store.bind(A)
    _commit(store, {0: 10})
    assert store.identity() == A
    version = store.version()
    _commit(store, {0: 20})  # the same identity: no metadata commit
    assert store.version() == (version or 0) + 1
    rotated = _with(keys=("1:1111111111111111", "2:2222222222222222"))
    again = SketchStore(tmp_path, "emoji")
    again.bind(rotated)
    _commit(again, {0: 30})
    assert again.identity() == rotated  # the union of the keys


def test_a_store_written_before_identities_adopts_its_next_writers(tmp_path: Path) -> None:
    uc = emoji(tmp_path, EMOJI + '[use_case.store]\nuri = "store"\n')
    old = seal_windows(uc, [], offsets={0: 5, 1: 7})  # as before this change: no identity
    assert old.identity() is None
    store = SketchStore(old.root, "emoji")
    store.bind(A)
    _commit(store, {0: 9})
    assert store.identity() == A
    assert store.committed_offsets(TOPIC, [0, 1]) == {0: 9, 1: 7}


def test_a_commit_to_another_deployments_store_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    first = SketchStore(tmp_path, "emoji")
    first.bind(A)
    _commit(first, {0: 10})
    version = first.version()
    files = sorted(p.name for p in (tmp_path / "emoji" / "_delta_log").iterdir())
    second = SketchStore(tmp_path, "emoji")
    second.bind(_with(keys=("1:9999999999999999",), cluster="ldpipe-cccccccccccc"))
    with pytest.raises(ForeignStoreError) as err:
        _commit(second, {0: 3})
    message = str(err.value)
    assert "\n" not in message and "nothing committed" in message
    assert "keys 1:1111111111111111" in message and "keys 1:9999999999999999" in message
    assert first.version() == version
    assert sorted(p.name for p in (tmp_path / "emoji" / "_delta_log").iterdir()) == files
    assert first.committed_offsets(TOPIC, [0]) == {0: 10}
    assert first.identity() == A
