"""Parameter epochs: which mechanism parameters a report was made with.

Every envelope names its epoch (``schemas/envelope.md``). Epoch ``use_case.epoch`` is the one in
the configuration; later epochs are published to the use case's compacted parameters topic
(``ldp.<uc>.params``, one record per epoch, keyed by the epoch number) by ``ldpipe adapt``
(GCMS paper §6.2: retune OCMS for the frequency regime that matters). Producers use the newest
epoch; aggregators keep one sketch per epoch and decode each report with its own epoch's codec.
An epoch's parameters never change once published, and never exceed the use case's epsilon.

>>> base = ParameterEpoch("emoji", 1, "cms", 4.0, {"k": 64, "m": 64})
>>> ParameterEpoch.from_json(base.to_json()) == base
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.mechanisms import Mechanism, build_mechanism
from ldpipe.schemas.mechanisms.registry import spec_of
from ldpipe.schemas.payloads import PayloadCodec

__all__ = ["EpochError", "EpochSet", "ParameterEpoch"]

_FIELDS = {"use_case", "epoch", "mechanism", "epsilon", "options", "published_at", "reason"}


class EpochError(LdpipeError, ValueError):
    """A parameter-epoch record that is malformed, inconsistent or over the privacy budget."""


@dataclass(frozen=True)
class ParameterEpoch:
    """One epoch's mechanism: name, epsilon and ``build_mechanism`` options."""

    use_case: str
    epoch: int
    mechanism: str
    epsilon: float
    options: Mapping[str, Any]
    published_at: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int):
            raise EpochError(f"epoch must be an integer, got {self.epoch!r}")
        if not 0 <= self.epoch < 2**32:
            raise EpochError(f"epoch must be in [0, 2^32), got {self.epoch}")
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon)):
            raise EpochError(f"epsilon must be a finite number, got {self.epsilon!r}")
        object.__setattr__(self, "options", dict(self.options))

    def same_parameters(self, other: ParameterEpoch) -> bool:
        return (self.mechanism, float(self.epsilon), dict(self.options)) == (
            other.mechanism,
            float(other.epsilon),
            dict(other.options),
        )

    def build(self, dictionary: Sequence[str] | None = None) -> Mechanism:
        options = dict(self.options)
        try:
            if spec_of(self.mechanism).needs_dictionary:
                options["dictionary"] = tuple(dictionary or ())
            return build_mechanism(self.mechanism, epsilon=float(self.epsilon), **options)
        except (ValueError, ArithmeticError, TypeError) as exc:
            raise EpochError(f"epoch {self.epoch} of {self.use_case}: {exc}") from exc

    def to_json(self) -> bytes:
        body = {
            "use_case": self.use_case,
            "epoch": self.epoch,
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "options": dict(self.options),
            "published_at": self.published_at,
            "reason": self.reason,
        }
        return json.dumps(body, sort_keys=True).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> ParameterEpoch:
        """Parse a parameters-topic record; only :class:`EpochError` escapes."""
        try:
            body = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise EpochError(f"parameter epoch record is not JSON: {exc}") from None
        if not isinstance(body, dict) or not {"use_case", "epoch", "mechanism", "epsilon"} <= set(
            body
        ):
            raise EpochError("parameter epoch record needs use_case, epoch, mechanism, epsilon")
        unknown = set(body) - _FIELDS
        if unknown:
            raise EpochError(f"parameter epoch record has unknown fields {sorted(unknown)}")
        options = body.get("options", {})
        if not isinstance(options, dict):
            raise EpochError("parameter epoch options must be an object")
        try:
            return cls(
                use_case=str(body["use_case"]),
                epoch=body["epoch"],
                mechanism=str(body["mechanism"]),
                epsilon=body["epsilon"],
                options=options,
                published_at=float(body.get("published_at", 0.0)),
                reason=str(body.get("reason", "")),
            )
        except (TypeError, ValueError, OverflowError) as exc:
            raise EpochError(f"bad parameter epoch record: {exc}") from None


@dataclass
class EpochSet:
    """The epochs a use case knows, each with its mechanism and payload codec."""

    use_case: str
    budget: float  # no epoch may give a larger epsilon
    dictionary: Sequence[str] | None = None
    epochs: dict[int, ParameterEpoch] = field(default_factory=dict)
    mechanisms: dict[int, Mechanism] = field(default_factory=dict)
    codecs: dict[int, PayloadCodec] = field(default_factory=dict)

    def add(self, record: ParameterEpoch, mechanism: Mechanism | None = None) -> bool:
        """Register an epoch (idempotent); False if it was known already with these parameters.

        Raises :class:`EpochError` for another use case's record, a known epoch whose
        parameters differ, or parameters whose epsilon exceeds the budget.
        """
        if record.use_case != self.use_case:
            raise EpochError(f"epoch record for {record.use_case!r}, not {self.use_case!r}")
        known = self.epochs.get(record.epoch)
        if known is not None:
            if not known.same_parameters(record):
                raise EpochError(
                    f"epoch {record.epoch} of {self.use_case} was published twice with different "
                    f"parameters; an epoch's parameters never change: publish a new epoch"
                )
            return False
        mech = mechanism or record.build(self.dictionary)
        if mech.effective_epsilon > self.budget + 1e-9:
            raise EpochError(
                f"epoch {record.epoch} gives epsilon {mech.effective_epsilon:.6g} above the use "
                f"case's budget {self.budget}"
            )
        self.epochs[record.epoch] = record
        self.mechanisms[record.epoch] = mech
        self.codecs[record.epoch] = PayloadCodec.for_mechanism(mech)
        return True

    def add_all(self, records: Iterable[ParameterEpoch]) -> list[str]:
        """Add every record it can; returns the problems of those it refused."""
        problems = []
        for record in records:
            try:
                self.add(record)
            except EpochError as exc:
                problems.append(str(exc))
        return problems

    @property
    def latest(self) -> int:
        return max(self.epochs)

    def __contains__(self, epoch: object) -> bool:
        return epoch in self.epochs
