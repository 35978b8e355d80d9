"""A use case's device configuration, read from the gateway's JSON alone.

The document ``GET /v1/use-cases/{name}/config`` answers (``docs/gateway.md``, "The device
configuration") holds everything a device needs: the parameter epoch and its mechanism, the
hash seed (a decimal string: a 64-bit integer a JSON reader may not hold exactly), the
analyzer's and the shuffler's public keys in preference order, the token issuer, the token
period and the time precision of the outer header. A device never sees the pipeline's TOML;
``DeviceConfiguration.from_json`` builds the randomizer and the nested sealing
(``ldpipe.producers.client.DeviceClient``) from this document.

>>> import base64, json
>>> from ldpipe.schemas.keys import KeyPair
>>> a, s = KeyPair.generate(key_id=1), KeyPair.generate(key_id=11, role="shuffler")
>>> key = lambda p: {"key_id": p.key_id, "kem": "DHKEM(X25519, HKDF-SHA256)",
...                  "public_key": base64.b64encode(p.public.raw).decode()}
>>> doc = {"use_case": "emoji", "epoch": 1, "mechanism": "cms", "epsilon": 4.0,
...        "parameters": {"k": 16, "m": 64}, "hash_seed": str(2**63 + 5),
...        "analyzer_keys": [key(a)], "shuffler_keys": [key(s)],
...        "token_issuer": {"name": "issuer.test", "directory_url": "http://i/d"},
...        "origin_name": "gateway.test", "period_seconds": 86400, "contribution_limit": 1,
...        "time_precision_seconds": 3600,
...        "upload": {"path": "/v1/use-cases/emoji/reports", "max_reports_per_request": 100,
...                   "max_body_bytes": 1048576}}
>>> config = DeviceConfiguration.from_json(json.dumps(doc).encode(), etag='"x"')
>>> config.client.mechanism.seed == 2**63 + 5, config.shuffler_key.key_id
(True, 11)
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ldpipe.producers.client import DeviceClient
from ldpipe.producers.device.errors import DeviceError
from ldpipe.producers.device.makers import (
    DiscoveryReports,
    ReportMaker,
    SfpFragmentReports,
    SfpWordReports,
)
from ldpipe.schemas.discovery.item import ItemRules
from ldpipe.schemas.discovery.layers import DiscoveryConfig
from ldpipe.schemas.discovery.sfp_words import SfpParams
from ldpipe.schemas.discovery.tags import TagKey
from ldpipe.schemas.keys import KEM_NAME, PublicKey
from ldpipe.schemas.mechanisms import build_mechanism

__all__ = ["DeviceConfiguration"]

_DECIMAL = re.compile(r"-?[0-9]{1,40}")


def _fail(what: str) -> DeviceError:
    return DeviceError(
        "config",
        f"the gateway's device configuration {what}; is the URL an ldpipe gateway of a "
        f"compatible version?",
    )


def _integer(value: Any, name: str) -> int:
    """An integer field, which a gateway writes as a decimal string when it is beyond 2^53."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _fail(f"has {name} = {value!r}, not an integer")


def _first_key(entries: Any, role: str) -> PublicKey:
    """The first key of a preference-ordered list this device can use (X25519 HPKE)."""
    if not isinstance(entries, list) or not entries:
        raise _fail(f"lists no {role} key")
    for entry in entries:
        if not isinstance(entry, Mapping) or entry.get("kem") != KEM_NAME:
            continue
        try:
            raw = base64.b64decode(str(entry["public_key"]), validate=True)
            return PublicKey(_integer(entry["key_id"], "key_id"), raw, role=role)  # type: ignore[arg-type]
        except (KeyError, ValueError, binascii.Error):
            continue
    raise _fail(f"lists no {role} key of {KEM_NAME} that this device can read")


@dataclass(frozen=True)
class DeviceConfiguration:
    """One use case's configuration as a device uses it, and its ``DeviceClient``."""

    use_case: str
    epoch: int
    mechanism: str
    epsilon: float
    parameters: Mapping[str, Any]
    analyzer_key: PublicKey
    shuffler_key: PublicKey
    issuer_name: str
    issuer_directory_url: str
    origin_name: str
    period_seconds: int
    contribution_limit: int
    time_precision_seconds: int
    upload_path: str
    max_reports_per_request: int
    max_body_bytes: int
    etag: str | None = None
    sfp: Mapping[str, Any] | None = None  # an SFP use case's "sfp" member (role, params)
    discovery: Mapping[str, Any] | None = None  # a discovery use case's "discovery" member
    tag_key: TagKey | None = field(default=None, repr=False, compare=False)
    maker: ReportMaker = field(init=False, repr=False, compare=False)
    _client: DeviceClient | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        client: DeviceClient | None = None
        try:
            if self.discovery is not None:
                maker: ReportMaker = self._discovery_maker(self.discovery)
            else:
                mechanism = build_mechanism(
                    self.mechanism, epsilon=float(self.epsilon), **dict(self.parameters)
                )
                client = DeviceClient(
                    self.use_case,
                    self.epoch,
                    self.analyzer_key,
                    mechanism,
                    self.shuffler_key,
                    self.time_precision_seconds,
                )
                maker = client if self.sfp is None else self._sfp_maker(self.sfp)
        except (ValueError, TypeError, ArithmeticError, KeyError) as exc:
            raise _fail(f"of {self.use_case!r} does not build a randomizer ({exc})") from None
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "maker", maker)

    @property
    def kind(self) -> str:
        """``frequency``, ``sfp_word``, ``sfp_fragments`` or ``discovery``."""
        if self.discovery is not None:
            return "discovery"
        if self.sfp is not None:
            return "sfp_fragments" if self.sfp.get("role") == "fragments" else "sfp_word"
        return "frequency"

    @property
    def client(self) -> DeviceClient:
        """The randomizer and sealing of a frequency or SFP use case (for SFP, the document's
        sketch: the word oracle, or the stacked fragments sketch)."""
        if self._client is None:
            raise DeviceError(
                "config", f"{self.use_case!r} is a discovery use case: it has no randomizer"
            )
        return self._client

    def _sfp_maker(self, sfp: Mapping[str, Any]) -> ReportMaker:
        settings: dict[str, Any] = {
            k: _integer(v, k) if k.endswith("_seed") else v for k, v in dict(sfp["params"]).items()
        }
        params = SfpParams(**settings)
        maker = SfpFragmentReports if sfp.get("role") == "fragments" else SfpWordReports
        return maker.create(
            params,
            self.use_case,
            self.epoch,
            self.analyzer_key,
            self.shuffler_key,
            self.time_precision_seconds,
        )

    def _discovery_maker(self, discovery: Mapping[str, Any]) -> ReportMaker:
        if self.tag_key is None:
            raise DeviceError(
                "config",
                f"{self.use_case!r} is a discovery use case: its reports are tagged with the "
                f"use case's tag key, which no gateway serves; give the device the tag key "
                f"it was provisioned with (GatewayDevice(..., tag_key=...))",
            )
        rules = dict(discovery["item_rules"])
        config = DiscoveryConfig(
            str(discovery["use_case"]),
            epoch=self.epoch,
            rules=ItemRules(
                max_bytes=_integer(rules["max_bytes"], "max_bytes"),
                mode=rules["mode"],
                lowercase=bool(rules["lowercase"]),
            ),
        )
        return DiscoveryReports.create(
            config,
            server_key=self.analyzer_key,
            aux_key=_first_key(discovery["aux_keys"], "analyzer"),
            tag_key=self.tag_key,
            use_case=self.use_case,
            shuffler_key=self.shuffler_key,
            time_precision_seconds=self.time_precision_seconds,
        )

    def period(self, now: float) -> int:
        """The token period ``now`` falls in (``schemas/tokens.md``, "Challenge")."""
        return int(now // self.period_seconds)

    @classmethod
    def from_json(
        cls, body: bytes | str, etag: str | None = None, *, tag_key: TagKey | None = None
    ) -> DeviceConfiguration:
        """Read the gateway's document; ``DeviceError`` (reason ``config``) if it is not one.
        ``tag_key``: the tag key a device of a discovery use case was provisioned with (no
        gateway serves it, ``docs/discovery.md``, "The tag key")."""
        try:
            doc = json.loads(body)
        except ValueError:
            raise _fail("is not JSON") from None
        if not isinstance(doc, Mapping):
            raise _fail("is not a JSON object")
        try:
            parameters = {
                str(k): (int(v) if isinstance(v, str) and _DECIMAL.fullmatch(v) else v)
                for k, v in dict(doc.get("parameters") or {}).items()
            }
            if doc.get("hash_seed") is not None:
                parameters["seed"] = _integer(doc["hash_seed"], "hash_seed")
            issuer, upload = doc["token_issuer"], doc["upload"]
            discovery = doc.get("discovery")
            if discovery is not None:  # GCMS §5.1: no randomizer, the server's key inside
                discovery = dict(discovery)
                epoch, epsilon = _integer(discovery["epoch"], "epoch"), 0.0
                analyzer = _first_key(discovery["server_keys"], "analyzer")
            else:
                epoch, epsilon = _integer(doc["epoch"], "epoch"), float(doc["epsilon"])
                analyzer = _first_key(doc["analyzer_keys"], "analyzer")
            return cls(
                use_case=str(doc["use_case"]),
                epoch=epoch,
                mechanism=str(doc["mechanism"]),
                epsilon=epsilon,
                parameters=parameters,
                analyzer_key=analyzer,
                shuffler_key=_first_key(doc["shuffler_keys"], "shuffler"),
                issuer_name=str(issuer["name"]),
                issuer_directory_url=str(issuer["directory_url"]),
                origin_name=str(doc["origin_name"]),
                period_seconds=_integer(doc["period_seconds"], "period_seconds"),
                contribution_limit=_integer(doc["contribution_limit"], "contribution_limit"),
                time_precision_seconds=_integer(
                    doc["time_precision_seconds"], "time_precision_seconds"
                ),
                upload_path=str(upload["path"]),
                max_reports_per_request=_integer(
                    upload.get("max_reports_per_request", 100), "max_reports_per_request"
                ),
                max_body_bytes=_integer(upload.get("max_body_bytes", 1 << 20), "max_body_bytes"),
                etag=etag,
                sfp=None if doc.get("sfp") is None else dict(doc["sfp"]),
                discovery=discovery,
                tag_key=tag_key,
            )
        except KeyError as exc:
            raise _fail(f"has no {exc.args[0]!r}") from None
        except (TypeError, AttributeError, ValueError) as exc:
            raise _fail(f"is not in the expected shape ({exc})") from None
