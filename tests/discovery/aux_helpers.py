"""Shared setup for the aux-server protocol tests: keys, the three parties, test-only randomness."""

from __future__ import annotations

from dataclasses import dataclass

from ldpipe.discovery.aux import AuxServer
from ldpipe.discovery.noise import RandomSource, SeededRandomSource
from ldpipe.discovery.server import DiscoveryServer
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.item import ItemRules
from ldpipe.schemas.discovery.layers import DiscoveryConfig
from ldpipe.schemas.discovery.privacy import ReleaseParameters
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.keys import KeyPair, KeyRing

__all__ = ["Parties", "ZeroNoise", "make_parties"]


class ZeroNoise:
    """Test hook: every byte 0xff, so every Laplace sample is exactly 0 (U = 1) and every uniform
    choice is ``(2^64 - 1) mod n``. Never used outside tests."""

    def random_bytes(self, n: int, /) -> bytes:
        return b"\xff" * n


@dataclass
class Parties:
    config: DiscoveryConfig
    server_pair: KeyPair
    aux_pair: KeyPair
    tag_key: TagKey
    client: DiscoveryClient
    aux: AuxServer
    server: DiscoveryServer


def make_parties(
    *,
    threshold: float = 5.5,
    laplace_scale: float = 1.0,
    randomness: RandomSource | None = None,
    rules: ItemRules | None = None,
    use_case: str = "words",
    epoch: int = 1,
) -> Parties:
    config = DiscoveryConfig(use_case, epoch=epoch, rules=rules or ItemRules())
    server_pair = KeyPair.generate(key_id=11, name="server")
    aux_pair = KeyPair.generate(key_id=22, name="aux")
    tag_key = TagKey(5, bytes(range(32)))
    client = DiscoveryClient(
        config, server_key=server_pair.public, aux_key=aux_pair.public, tag_key=tag_key
    )
    aux = AuxServer(
        config,
        KeyRing([aux_pair]),
        ReleaseParameters(threshold=threshold, laplace_scale=laplace_scale),
        randomness=SeededRandomSource(7) if randomness is None else randomness,
    )
    server = DiscoveryServer(config, KeyRing([server_pair]), [tag_key])
    return Parties(config, server_pair, aux_pair, tag_key, client, aux, server)
