"""``ldpipe discovery-shuffler``: the shuffler, unchanged, on a use case's discovery topics.

Same code and guarantees as ``ldpipe shuffler`` (metadata stripped, contribution limit, windows
of at least ``n_min``, CSPRNG permutation, exactly once); it runs as use case ``<uc>.discovery``
(``discovery/runtime.py``), so its consumer group, transactional id, contribution state and
window ledger (``ldp.<uc>.discovery.privacy-ledger``) are separate from the frequency shuffler's.
It marks every shuffled record with its window (``ldpipe.window``, ``schemas/headers.py``), which
is how the aux server tells windows apart when several discovery shufflers write its topic.
Discovery reports are encrypted, not randomized on the device: the shuffler claims no epsilon for
them (no epsilon gauges; its ledger records say ``mechanism = "none"`` with null epsilons). Their
privacy is the aux server's release (GCMS Thm 4), recorded in the use case's own ledger.
"""

from __future__ import annotations

import argparse
from typing import Any

from discovery.runtime import discovery_inner_check, discovery_shuffle_use_case
from infra.shuffler_cmd import add_shuffler_parser, run_shuffler

__all__ = ["add_parser", "run"]


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
