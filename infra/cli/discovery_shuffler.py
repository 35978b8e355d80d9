"""``ldpipe discovery-shuffler``: the shuffler, unchanged, on a use case's discovery topics.

Same code and guarantees as ``ldpipe shuffler`` (metadata stripped, contribution limit, windows
of at least ``n_min``, CSPRNG permutation, exactly once); it runs as use case ``<uc>.discovery``
(:func:`discovery_shuffle_use_case`), so its consumer group, transactional id, contribution state
and window ledger (``ldp.<uc>.discovery.privacy-ledger``) are separate from the frequency
shuffler's. It marks every shuffled record with its window (``ldpipe.window``,
``schemas/headers.py``), which is how the aux server tells windows apart when several discovery
shufflers write its topic. Discovery reports are encrypted, not randomized on the device: the
shuffler claims no epsilon for them (no epsilon gauges; its ledger records say ``mechanism =
"none"`` with null epsilons). Their privacy is the aux server's release (GCMS Thm 4), recorded in
the use case's own ledger.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from ldpipe.infra.cli.shuffler import add_shuffler_parser, run_shuffler
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.config_tables import Topics
from ldpipe.schemas.discovery.layers import ITEM_FIXED_LENGTH, OUTER_FIXED_LENGTH
from ldpipe.schemas.discovery_settings import discovery_config, discovery_settings
from ldpipe.schemas.envelope import ENC_LENGTH, ENVELOPE_VERSION, FIXED_HEADER_LENGTH, TAG_LENGTH
from ldpipe.shuffler.inner import InnerCheck

__all__ = ["add_parser", "discovery_inner_check", "discovery_shuffle_use_case", "run"]


def discovery_shuffle_use_case(use_case: UseCase) -> UseCase:
    """The use case the discovery shuffler runs as: the same shuffler code on the discovery
    topics, named ``<uc>.discovery`` so its consumer group, transactional id, contribution state
    and window ledger are its own."""
    t = discovery_settings(use_case).topics
    topics = Topics(
        reports=t.reports,
        shuffled=t.shuffled,
        dlq=t.dlq,
        shuffler_state=t.shuffler_state,
        params="",
        partitions=use_case.topics.partitions,
    )
    return dataclasses.replace(use_case, name=f"{use_case.name}.discovery", topics=topics)


def discovery_inner_check(use_case: UseCase) -> InnerCheck:
    """What the discovery shuffler checks of the ``E_aux`` envelopes it publishes: a v1
    envelope of ``<uc>.disc.aux`` and the discovery epoch, of the one length every report of
    the use case has (the item is padded to ``max_bytes``, ``schemas/discovery.md``)."""
    config = discovery_config(use_case)
    inner = FIXED_HEADER_LENGTH + len(config.inner_use_case) + ENC_LENGTH
    inner += ITEM_FIXED_LENGTH + config.rules.max_bytes + TAG_LENGTH
    return InnerCheck(
        config.outer_use_case, ENVELOPE_VERSION, {config.epoch: OUTER_FIXED_LENGTH + inner}
    )


def add_parser(sub: Any) -> None:
    add_shuffler_parser(
        sub, "discovery-shuffler", "the shuffler on the discovery reports of a use case", run
    )


def run(args: argparse.Namespace) -> int:
    return run_shuffler(
        args,
        discovery_shuffle_use_case,
        window_headers=True,
        local_dp=False,
        inner_of=discovery_inner_check,
    )
