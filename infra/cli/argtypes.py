"""argparse types for numbers with a range: a bad value is one usage line (exit 2) naming it."""

from __future__ import annotations

import argparse

__all__ = ["non_negative_int", "port", "positive_float", "positive_int", "positive_seconds"]


def _number(text: str, kind: type[int] | type[float], what: str) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def port(text: str) -> int:
    value = int(_number(text, int, "a port number"))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(_number(text, int, "a whole number"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int, "a whole number"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(_number(text, float, "a number"))
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = float(_number(text, float, "a number of seconds"))
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


DAY = 86_400.0


def period_seconds(text: str) -> float:
    """0 (off) up to a day: a longer wait overflows the platform's timer (Event.wait(1e10)
    raises), and a period of more than a day is no progress report."""
    value = float(_number(text, float, "a number of seconds"))
    if not 0 <= value <= DAY:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"must be 0 (off) to {DAY:,.0f} seconds, got {text}")
    return value


def interval_seconds(text: str) -> float:
    """More than 0 up to a day: the wait between two runs of a loop (0 would spin)."""
    value = period_seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds (up to a day), got {text}")
    return value
