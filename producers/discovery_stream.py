"""The discovery reports of simulated devices (GCMS Alg. 5), as a load-generator stream.

A device of a use case with ``[use_case.discovery]`` sends, besides its frequency report, one
discovery report of the same item: the item sealed to the server (the use case's public key),
tagged with the tag key, sealed again to the aux server (``schemas/discovery/client.py``). Both go
out under the device's one client token, each to its own shuffler.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ldpipe.producers.loadgen import Stream
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.exceptions import DiscoveryError
from ldpipe.schemas.discovery_settings import discovery_config, load_tag_key
from ldpipe.schemas.keys import PublicKey, load_public_key

__all__ = ["discovery_stream"]


def discovery_stream(
    use_case: UseCase, server_key: PublicKey, shuffler_key: PublicKey | None = None
) -> Stream:
    """``(discovery reports topic, envelopes)``; an item the use case's rules refuse (empty
    after normalization, say) gives ``None``: that device sends no discovery report. With
    ``shuffler_key`` each report is sealed once more to the discovery shuffler."""
    settings = use_case.discovery
    if settings is None:
        raise ConfigError(f"use case {use_case.name!r} has no [use_case.discovery] table")
    if settings.aux_public_key is None:
        raise ConfigError(
            f"use_case.{use_case.name}.discovery.aux_public_key: missing; devices seal their "
            f"discovery reports to the aux server's public key (ldpipe keys generate)"
        )
    client = DiscoveryClient(
        discovery_config(use_case),
        server_key=server_key,
        aux_key=load_public_key(settings.aux_public_key),
        tag_key=load_tag_key(settings.tag_key),
        shuffler_key=shuffler_key,
        shuffler_use_case=f"{use_case.name}.discovery",
        time_precision_seconds=use_case.shuffle.time_precision_seconds,
    )

    def envelopes(items: Sequence[str], _rng: np.random.Generator) -> list[bytes | None]:
        # not randomized: discovery's privacy is the aux server's thresholded release
        return [r if not isinstance(r, DiscoveryError) else None for r in client.encode_many(items)]

    return settings.topics.reports, envelopes
