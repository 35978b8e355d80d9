"""The device configuration a gateway serves for a use case (``GET /v1/use-cases/{name}/config``).

Everything a device needs to randomize, seal and upload: the newest parameter epoch (the
configured one, or a later one ``ldpipe adapt`` published) and its mechanism, the
analyzer's and the shuffler's public keys (lists in preference order: a device walks each in
order and uses the first it can), the token issuer and the challenge's origin name, the period
tokens are issued for, and the time precision of the outer header. ``parameters`` are the
randomizer's, resolved (``randomizer_parameters``: k and m, p and s for gcms/ocms, the dictionary
for oue), so no device runs an optimizer or assumes a default. Every integer a JavaScript
number cannot hold exactly (``hash_seed`` always) is a decimal string. The body's SHA-256 is its
``ETag``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ldpipe.infra.gateway.rules import UseCaseRules
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.config_servers import GatewayConfig
from ldpipe.schemas.epochs import ParameterEpoch
from ldpipe.schemas.keys import KEM_NAME, PublicKey, load_public_key
from ldpipe.schemas.mechanisms import randomizer_parameters
from ldpipe.schemas.upload import MEDIA_TYPE

__all__ = ["DeviceConfig", "device_config", "discovery_device_config"]

_SAFE_INTEGER = (1 << 53) - 1  # Number.MAX_SAFE_INTEGER


@dataclass(frozen=True)
class DeviceConfig:
    body: bytes  # the JSON document
    etag: str  # a strong validator: the quoted hex SHA-256 of the body (RFC 9110 §8.8.3)

    def matches(self, if_none_match: str | None) -> bool:
        """Whether an ``If-None-Match`` header matches this document (RFC 9110 §13.1.2: weak
        comparison, ``*`` matches)."""
        if not if_none_match:
            return False
        for tag in if_none_match.split(","):
            tag = tag.strip()
            if tag == "*" or tag.removeprefix("W/") == self.etag:
                return True
        return False


def _number(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _SAFE_INTEGER:
        return str(value)
    return value


def _key(key: PublicKey) -> dict[str, Any]:
    return {
        "key_id": key.key_id,
        "kem": KEM_NAME,
        "public_key": base64.b64encode(key.raw).decode("ascii"),
    }


def _common(uc: UseCase, rules: UseCaseRules, gateway: GatewayConfig) -> dict[str, Any]:
    """The members every document has: keys of the shuffler, tokens, time, upload."""
    return {
        "shuffler_keys": [_key(k) for k in rules.shuffler_keys],
        "token_issuer": {
            "name": gateway.issuer_name,
            "directory_url": gateway.issuer_directory_url,
        },
        "origin_name": gateway.origin_name,
        "period_seconds": rules.period_seconds,
        "contribution_limit": uc.shuffle.contribution_limit,
        "time_precision_seconds": rules.time_precision_seconds,
        "report_expiry_seconds": rules.report_expiry_seconds,
        "max_clock_skew_seconds": rules.max_clock_skew_seconds,
        "upload": {
            "path": f"/v1/use-cases/{rules.name}/reports",
            "media_type": MEDIA_TYPE,
            "max_reports_per_request": gateway.max_reports_per_request,
            "max_body_bytes": gateway.max_body_bytes,
        },
    }


def _document(document: Mapping[str, Any]) -> DeviceConfig:
    body = json.dumps(document, separators=(",", ":")).encode("utf-8")
    return DeviceConfig(body, f'"{hashlib.sha256(body).hexdigest()}"')


def _sfp(uc: UseCase) -> dict[str, Any] | None:
    """``[use_case.sfp]`` as a device needs it (``docs/sfp.md``): which half this use case is,
    the other half's name, and every ``SfpParams`` setting (64-bit seeds as decimal strings).
    A fragments use case's ``parameters`` describe the stacked sketch (k = positions x k');
    a device randomizes with the fragment settings here and stacks the row itself."""
    if uc.sfp is None:
        return None
    return {
        "role": uc.sfp.role,
        "word_use_case": uc.sfp.word_use_case,
        "fragments_use_case": uc.sfp.fragments_use_case,
        "params": {k: _number(v) for k, v in sorted(uc.sfp_params.to_dict().items())},
    }


def device_config(
    uc: UseCase, rules: UseCaseRules, gateway: GatewayConfig, epoch: ParameterEpoch | None = None
) -> DeviceConfig:
    """The configuration document of ``uc`` as this gateway serves it, with the parameters of
    ``epoch`` (the newest published one; default: the configured epoch)."""
    epoch = epoch or uc.base_epoch()
    # resolved, so a device needs no optimizer and no defaults (schemas/randomizers.md)
    mechanism = uc.mechanism if epoch == uc.base_epoch() else epoch.build(uc.dictionary_items)
    seed = getattr(mechanism, "seed", None)  # the configured seed or the mechanism's default
    resolved = randomizer_parameters(mechanism)
    parameters = {k: _number(v) for k, v in sorted(resolved.items())}
    document: dict[str, Any] = {
        "use_case": uc.name,
        "epoch": epoch.epoch,
        "mechanism": epoch.mechanism,
        "epsilon": epoch.epsilon,
        "parameters": parameters,
        "hash_seed": None if seed is None else str(seed),
        "analyzer_keys": [_key(k) for k in rules.analyzer_keys],
        **_common(uc, rules, gateway),
    }
    sfp = _sfp(uc)
    if sfp is not None:
        document["sfp"] = sfp
    return _document(document)


def discovery_device_config(
    uc: UseCase, rules: UseCaseRules, gateway: GatewayConfig
) -> DeviceConfig:
    """The document of ``<uc>.discovery`` (``rules = UseCaseRules.discovery_of(uc)``): what a
    device needs to make GCMS §5.1's report (``schemas/discovery/client.py``): the server's key (the
    inner layer), the aux server's key (the outer payload), the discovery epoch and item rules.
    Never the tag key, nor its id: the key must stay out of the aux server's hands
    (``docs/discovery.md``, "The tag key") and this document is served to anyone, so a device
    is provisioned with the tag key (id and secret) another way, and the gateway reads no
    secret file."""
    d = uc.discovery
    assert d is not None and d.aux_public_key is not None  # UseCaseRules.discovery_of checked
    document: dict[str, Any] = {
        "use_case": rules.name,
        "mechanism": "discovery",
        "discovery": {
            "use_case": uc.name,
            "epoch": d.epoch,
            "item_rules": {"max_bytes": d.max_bytes, "mode": d.mode, "lowercase": d.lowercase},
            "server_keys": [_key(k) for k in rules.analyzer_keys],
            "aux_keys": [_key(load_public_key(d.aux_public_key))],
        },
        **_common(uc, rules, gateway),
    }
    return _document(document)
