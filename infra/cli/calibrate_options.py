"""``--calibrate`` and ``--calibrate-fit``: the options ``ldpipe query`` and ``ldpipe simulate``
share (Calibrate §III, ``docs/calibrate.md``), defined and checked in one place."""

from __future__ import annotations

import argparse

from ldpipe.schemas.mechanisms.calibrate import FIT_METHODS, PRIOR_FAMILIES

__all__ = ["add_calibrate_args", "check_calibrate_args"]


def add_calibrate_args(p: argparse.ArgumentParser, calibrate_help: str) -> None:
    """``--calibrate FAMILY`` (``calibrate_help`` says what it adds to this command) and
    ``--calibrate-fit mv|ml``."""
    p.add_argument("--calibrate", choices=PRIOR_FAMILIES, help=calibrate_help)
    p.add_argument(
        "--calibrate-fit",
        choices=FIT_METHODS,
        help="how the prior is fitted: mean-variance (mv, default) or maximum likelihood (ml)",
    )


def check_calibrate_args(args: argparse.Namespace) -> None:
    """``ValueError`` (one line) for ``--calibrate-fit`` without ``--calibrate``."""
    if args.calibrate_fit is not None and args.calibrate is None:
        raise ValueError("--calibrate-fit needs --calibrate (the prior family: powerlaw, gaussian)")
