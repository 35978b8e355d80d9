"""Keys bound to use cases and the aggregator's identity check (``aggregator/deployment.py``):
unit tests with real HPKE and a real Delta table, no broker (the real-broker tests are
``tests/integration/test_deployment_identity.py``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ldpipe.aggregator.checkpoints import Checkpoints
from ldpipe.aggregator.decoding import EpochDecoder
from ldpipe.aggregator.deployment import (
    FOREIGN_KEY,
    DeploymentCheck,
    cluster_id,
    foreign_key_ids,
    key_marks,
)
from ldpipe.aggregator.exceptions import AggregatorError
from ldpipe.aggregator.sealing import OpenSpans
from ldpipe.aggregator.windows import WindowedSketches
from ldpipe.infra.storage.identity import StoreIdentity, key_mark
from ldpipe.infra.storage.sketch_store import SketchStore
from ldpipe.producers.client import DeviceClient
from ldpipe.schemas.config import parse_config
from ldpipe.schemas.keys import KeyPair, KeyRing, save_key_pair
from tests.aggregator_helpers import NO_BROKER, emoji

TOPIC = "ldp.emoji.shuffled"


def _config(tmp_path: Path) -> tuple[KeyPair, KeyPair, str]:
    """Two use cases whose private keys share one directory (the old `ldpipe init` layout)."""
    mine, theirs = KeyPair.generate(1, name="emoji"), KeyPair.generate(2, name="words")
    paths = [save_key_pair(pair, tmp_path / "keys")[1] for pair in (mine, theirs)]
    text = "".join(
        f'[[use_case]]\nname = "{name}"\nmechanism = "cms"\nepsilon = 4.0\nk = 16\nm = 32\n'
        f'public_key = "{public}"\nprivate_keys = ["keys"]\n'
        for name, public in zip(("emoji", "words"), paths, strict=True)
    )
    return mine, theirs, text


def test_the_other_use_cases_keys_are_foreign(tmp_path: Path) -> None:
    _mine, _theirs, text = _config(tmp_path)
    config = parse_config(text, base=tmp_path)
    assert foreign_key_ids(config, config.use_case("emoji")) == {2: "words"}
    assert foreign_key_ids(config, config.use_case("words")) == {1: "emoji"}


def test_a_report_sealed_to_another_use_cases_key_is_foreign_key(tmp_path: Path) -> None:
    mine, theirs, text = _config(tmp_path)
    uc = parse_config(text, base=tmp_path).use_case("emoji")
    mechanism = uc.epoch_set().mechanisms[uc.epoch]
    rng = np.random.default_rng(7)
    good = DeviceClient("emoji", uc.epoch, mine.public, mechanism).reports(["a", "b"], rng)
    wrong = DeviceClient("emoji", uc.epoch, theirs.public, mechanism).reports(["c"] * 3, rng)
    keyring = KeyRing.load(tmp_path / "keys")  # holds both keys
    assert keyring.key_ids == (1, 2)
    decoder = EpochDecoder(uc, NO_BROKER, keyring, foreign={2: "words"})
    decoder.loaded = decoder.monotonic()  # no reload of the params topic (no broker)
    parts, rejections = decoder.decode([*good, *wrong])
    assert [(i, reason) for i, _layer, reason in rejections] == [
        (2, FOREIGN_KEY),
        (3, FOREIGN_KEY),
        (4, FOREIGN_KEY),
    ]
    assert sum(len(part.positions) for part in parts.values()) == 2
    # without the foreign list, the shared directory would open them: what the audit found
    parts, rejections = EpochDecoder(uc, NO_BROKER, keyring).decode(wrong)
    assert not rejections and sum(len(p.positions) for p in parts.values()) == 3


def test_key_marks_list_the_use_cases_own_keys(tmp_path: Path) -> None:
    mine, theirs, _text = _config(tmp_path)
    ring = KeyRing([mine, theirs])
    own = (key_mark(1, mine.public.raw),)
    assert key_marks(ring, {2: "words"}) == own
    assert key_marks({1: mine.private_key}) == own
    assert len(key_marks(ring)) == 2


def _consumer(cluster: str | None) -> SimpleNamespace:
    return SimpleNamespace(list_topics=lambda timeout: SimpleNamespace(cluster_id=cluster))


def test_the_check_refuses_another_deployments_store_naming_both(tmp_path: Path) -> None:
    store = SketchStore(tmp_path, "emoji")
    assert cluster_id(_consumer("kafka-a")) == "kafka-a"
    first = DeploymentCheck("emoji", TOPIC, ("1:1111111111111111",))
    assert first.check(store, _consumer("kafka-a")).cluster == "kafka-a"
    store.commit([], {(TOPIC, 0): (None, 10)}, writer="a")
    other = DeploymentCheck("emoji", TOPIC, ("1:1111111111111111",))
    with pytest.raises(AggregatorError) as err:
        other.check(SketchStore(tmp_path, "emoji"), _consumer("kafka-b"))
    line = str(err.value)
    assert "\n" not in line and "on cluster kafka-a" in line and "on cluster kafka-b" in line
    assert "a different Kafka cluster is a different deployment, not data loss" in line
    same = DeploymentCheck("emoji", TOPIC, ("1:1111111111111111", "2:2222222222222222"))
    assert same.check(SketchStore(tmp_path, "emoji"), _consumer("kafka-a")) is not None


def test_a_checkpoint_of_another_deployment_is_refused(tmp_path: Path) -> None:
    uc = emoji(tmp_path)
    epochs = uc.epoch_set()

    def checkpoints(identity: StoreIdentity) -> Checkpoints:
        made = Checkpoints(tmp_path / "ckpt", "emoji-a", TOPIC, "emoji", "p", 3, lambda _: None)
        made.identity = identity
        return made

    ours = StoreIdentity("emoji", TOPIC, "kafka-a", ("1:1111111111111111",))
    checkpoints(ours).write(
        positions={0: 5},
        bases={0: None},
        windows=WindowedSketches(epochs.mechanisms, 3600, 2),
        epochs=epochs,
        spans=OpenSpans(),
        latest={},
        created_at=0.0,
    )
    assert checkpoints(ours).restore([0], {0: None}, epochs) is not None
    theirs = StoreIdentity("emoji", TOPIC, "kafka-b", ("1:1111111111111111",))
    with pytest.raises(AggregatorError, match="belongs to use case emoji on cluster kafka-a"):
        checkpoints(theirs).restore([0], {0: None}, epochs)
