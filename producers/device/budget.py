"""The device's own privacy budget: per use case and period, in a small ledger it keeps itself.

Apple's rule (Learning with Privacy at Scale, §3): the device limits its own reports, whatever
its caller asks. Per use case, a period is the configuration's ``period_seconds`` (the token
period) and one report costs the configuration's ``epsilon`` (ε₀, local DP of one report).
Reports of one period compose basically (Dwork & Roth Thm 3.16): k reports cost k·ε₀. The
device's budget per period, B (default ε₀: one report per period), allows ⌊B/ε₀⌋ reports in a
period; what a ``send`` asks beyond that is **held** (kept in the ledger, sent first in a later
period, at most ``max_held`` per use case) or **dropped** (``over_budget``). The rules, for any
SDK: ``docs/privacy.md``, "On the device".

The ledger is spent *before* the reports leave (a crash after the write loses at most those
reports, never lets a period be spent twice) and refunded only for items that were never
randomized (no token left). A period ends at ``period_end``, stored in Unix seconds: a clock set
back does not reopen a spent period. Persisted as JSON (``path``), written atomically (a
temporary file, fsync, rename, fsync of the directory); without a path it lives in memory.

>>> ledger = BudgetLedger()
>>> ledger.allowance("emoji", now=100.0, epsilon=4.0, period_seconds=86400)
1
>>> ledger.spend("emoji", 1, now=100.0, epsilon=4.0, period_seconds=86400)
>>> ledger.allowance("emoji", now=200.0, epsilon=4.0, period_seconds=86400)
0
>>> ledger.allowance("emoji", now=86400.0, epsilon=4.0, period_seconds=86400)
1
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ldpipe.producers.device.errors import DeviceError

__all__ = ["FORMAT", "BudgetLedger", "UseCaseBudget"]

FORMAT = "ldpipe-device-budget/1"
_SLACK = 1e-9  # ⌊B/ε₀⌋ with B = k·ε₀ written in decimal


@dataclass
class UseCaseBudget:
    """One use case's entry: the period in force (``[period_start, period_end)``, Unix
    seconds), the ε spent in it and its reports, and the items held for a later period."""

    period_start: float = 0.0
    period_end: float = 0.0
    spent_epsilon: float = 0.0
    reports: int = 0
    held: list[str | bytes] = field(default_factory=list)


def _item_json(item: str | bytes) -> dict[str, str]:
    if isinstance(item, bytes):
        return {"b64": base64.b64encode(item).decode("ascii")}
    return {"text": item}


def _item(value: Any) -> str | bytes:
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    if isinstance(value, dict) and isinstance(value.get("b64"), str):
        return base64.b64decode(value["b64"], validate=True)
    raise ValueError(f"a held item {value!r}")


class BudgetLedger:
    """The device's budget ledger (all use cases of one device share one file).

    ``epsilon_per_period``: the budget B per use case and period (default: one report's ε₀ of
    the configuration, i.e. one report per period); ``over_budget``: ``"hold"`` (keep for the
    next period, at most ``max_held`` items per use case; more are dropped) or ``"drop"``."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        epsilon_per_period: float | None = None,
        over_budget: Literal["hold", "drop"] = "hold",
        max_held: int = 100,
    ) -> None:
        if over_budget not in ("hold", "drop"):
            raise ValueError(f'over_budget={over_budget!r}: give "hold" or "drop"')
        if epsilon_per_period is not None and not epsilon_per_period >= 0:
            raise ValueError(f"epsilon_per_period={epsilon_per_period!r}: give a number >= 0")
        if max_held < 0:
            raise ValueError(f"max_held={max_held!r}: give a number >= 0")
        self.path = Path(path) if path is not None else None
        self.epsilon_per_period = epsilon_per_period
        self.over_budget = over_budget
        self.max_held = max_held
        self._entries: dict[str, UseCaseBudget] = self._load()

    # ---- the rules -----------------------------------------------------------------------

    def entry(self, use_case: str, now: float, period_seconds: int) -> UseCaseBudget:
        """The use case's entry, rolled over to the period of ``now`` if the stored one ended
        (the held items carry over; the spent ε does not)."""
        e = self._entries.setdefault(use_case, UseCaseBudget())
        if now >= e.period_end:
            start = (now // period_seconds) * period_seconds
            e.period_start, e.period_end = float(start), float(start + period_seconds)
            e.spent_epsilon, e.reports = 0.0, 0
        return e

    def budget(self, epsilon: float) -> float:
        """B: the device's setting, or one report's ε₀."""
        return epsilon if self.epsilon_per_period is None else self.epsilon_per_period

    def allowance(self, use_case: str, *, now: float, epsilon: float, period_seconds: int) -> int:
        """Reports the use case may still send in the period of ``now``: ⌊(B − spent)/ε₀⌋."""
        e = self.entry(use_case, now, period_seconds)
        if epsilon <= 0:
            return 0  # a mechanism without a finite ε is not accounted; send nothing
        left = self.budget(epsilon) - e.spent_epsilon
        return max(0, math.floor(left / epsilon + _SLACK))

    def spend(
        self, use_case: str, reports: int, *, now: float, epsilon: float, period_seconds: int
    ) -> None:
        """Record ``reports`` reports of ε₀ each in the period of ``now``, and persist."""
        e = self.entry(use_case, now, period_seconds)
        e.spent_epsilon += reports * epsilon
        e.reports += reports
        self.save()

    def refund(self, use_case: str, reports: int, *, epsilon: float) -> None:
        """Give back the ε of ``reports`` reports that were never randomized."""
        e = self._entries.get(use_case)
        if e is None or reports <= 0:
            self.save()
            return
        e.spent_epsilon = max(0.0, e.spent_epsilon - reports * epsilon)
        e.reports = max(0, e.reports - reports)
        self.save()

    def take_held(self, use_case: str) -> list[str | bytes]:
        """The held items, oldest first, removed from the ledger (not yet saved)."""
        e = self._entries.get(use_case)
        if e is None:
            return []
        out, e.held = e.held, []
        return out

    def hold(self, use_case: str, items: Sequence[str | bytes], *, first: bool = False) -> int:
        """Keep ``items`` for a later period (oldest first; ``first``: before those already
        held), up to ``max_held`` in all; returns how many were kept (the rest are dropped).
        Saved by the next ``spend`` or ``refund``."""
        e = self._entries.setdefault(use_case, UseCaseBudget())
        room = max(0, self.max_held - len(e.held))
        kept = list(items[:room])
        e.held = kept + e.held if first else e.held + kept
        return len(kept)

    # ---- the file ------------------------------------------------------------------------

    def _corrupt(self, why: str) -> DeviceError:
        return DeviceError(
            "budget",
            f"the budget ledger {self.path} {why}; move it aside only if this device may "
            f"start its budget afresh, or give GatewayDevice another budget file",
        )

    def _load(self) -> dict[str, UseCaseBudget]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            raise self._corrupt(f"is not readable JSON ({exc.__class__.__name__})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise self._corrupt(f"is not an ldpipe device budget ledger ({FORMAT})")
        entries: dict[str, UseCaseBudget] = {}
        try:
            for name, raw in dict(doc["use_cases"]).items():
                entries[str(name)] = UseCaseBudget(
                    period_start=float(raw["period_start"]),
                    period_end=float(raw["period_end"]),
                    spent_epsilon=float(raw["spent_epsilon"]),
                    reports=int(raw["reports"]),
                    held=[_item(v) for v in raw.get("held", [])],
                )
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
            raise self._corrupt(f"has an entry this library cannot read ({exc})") from None
        return entries

    def save(self) -> None:
        """Write the ledger atomically: a temporary file in the same directory, fsync,
        rename over the ledger, fsync of the directory (POSIX ``rename(2)``)."""
        if self.path is None:
            return
        doc = {
            "format": FORMAT,
            "use_cases": {
                name: {
                    "period_start": e.period_start,
                    "period_end": e.period_end,
                    "spent_epsilon": e.spent_epsilon,
                    "reports": e.reports,
                    "held": [_item_json(i) for i in e.held],
                }
                for name, e in sorted(self._entries.items())
            },
        }
        body = json.dumps(doc, indent=1, ensure_ascii=False).encode("utf-8")
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
