"""A use case as the gateway checks its uploads: topic, shuffler key ids, time bounds, period.

Built once from the pipeline configuration (``UseCaseRules.of``). The time settings are those
of ``[use_case.shuffle]`` (``time_precision_seconds``, ``report_expiry_seconds``,
``max_clock_skew_seconds``), the shuffler's own: the gateway refuses early what the shuffler
would refuse later.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ldpipe.schemas.config import UseCase
from ldpipe.schemas.keys import PublicKey, load_public_key

__all__ = ["DISCOVERY_SUFFIX", "UseCaseRules", "discovery_use_case"]

#: the use case of a use case's discovery reports: ``<uc>.discovery`` (its outer header, its
#: URL at the gateway, its tokens at the issuer)
DISCOVERY_SUFFIX = ".discovery"


def discovery_use_case(name: str) -> str:
    """``<name>.discovery``, the use case discovery reports of ``name`` are sent to."""
    return name + DISCOVERY_SUFFIX


@dataclass(frozen=True)
class UseCaseRules:
    name: str
    topic: str
    analyzer_keys: tuple[PublicKey, ...]  # preference order: a device walks it in order
    shuffler_keys: tuple[PublicKey, ...]
    period_seconds: int
    time_precision_seconds: int
    report_expiry_seconds: int
    max_clock_skew_seconds: int

    @property
    def shuffler_key_ids(self) -> frozenset[int]:
        return frozenset(key.key_id for key in self.shuffler_keys)

    def period(self, unix_seconds: int) -> int:
        """The period index of a time: the token key of a report is for this period."""
        return unix_seconds // self.period_seconds

    @classmethod
    def of(cls, uc: UseCase) -> UseCaseRules:
        """The rules of a configured use case; its public key files are read here (one line
        if one cannot be). The gateway reads no private key file."""
        shuffle = uc.shuffle
        if not shuffle.nested or shuffle.public_key is None:
            raise ValueError(
                f"use_case.{uc.name}.shuffle: the gateway accepts nested envelopes only; set "
                f"layers = \"nested\" and public_key (ldpipe keys generate --role shuffler)"
            )
        if uc.public_key is None:
            raise ValueError(
                f"use_case.{uc.name}.public_key: missing; devices need the analyzer's key"
            )
        return cls(
            name=uc.name,
            topic=uc.topics.reports,
            analyzer_keys=(load_public_key(uc.public_key),),
            shuffler_keys=(load_public_key(shuffle.public_key),),
            period_seconds=shuffle.contribution_period_seconds,
            time_precision_seconds=shuffle.time_precision_seconds,
            report_expiry_seconds=shuffle.report_expiry_seconds,
            max_clock_skew_seconds=shuffle.max_clock_skew_seconds,
        )

    @classmethod
    def discovery_of(cls, uc: UseCase) -> UseCaseRules:
        """The rules of ``uc``'s discovery reports (GCMS §5.1), use case ``<uc>.discovery``:
        its discovery reports topic, the shuffle settings of ``uc`` (the discovery shuffler's),
        and as "analyzer" key the server's (``uc``'s public key; the aux server's is in the
        document, ``device_config.discovery_config``). Its tokens are ``<uc>.discovery``'s."""
        if uc.discovery is None:
            raise ValueError(f"use_case.{uc.name}: no [use_case.discovery] table")
        if uc.discovery.aux_public_key is None:
            raise ValueError(
                f"use_case.{uc.name}.discovery.aux_public_key: missing; devices seal their "
                f"discovery reports to the aux server's public key (ldpipe keys generate)"
            )
        rules = cls.of(uc)
        return replace(rules, name=discovery_use_case(uc.name), topic=uc.discovery.topics.reports)
