"""Oblivious HTTP (RFC 9458): Appendix A's complete example byte for byte, RFC 9180's vectors for
the HPKE library under both suites, an independent HPKE implementation (cryptography's) sealing
requests the gateway opens, and every refusal with its reason."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from pyhpke import AEADId, CipherSuite, KDFId, KEMId, KEMKey, KEMKeyPair

from ldpipe.schemas.bhttp import (
    Request,
    Response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from ldpipe.schemas.keys import KeyPair
from ldpipe.schemas.ohttp import (
    AEAD_AES_128_GCM,
    AEAD_CHACHA20_POLY1305,
    KDF_HKDF_SHA256,
    GatewayKey,
    KeyConfig,
    OHTTPError,
    OHTTPRejection,
    SymmetricAlgorithm,
    _response_keys,
    decapsulate_request,
    encapsulate_request,
    encode_key_configs,
    parse_key_configs,
)

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "schemas" / "vectors" / "ohttp.json").read_text()
)
A = {
    k: bytes.fromhex(v) if isinstance(v, str) else v
    for k, v in VECTORS["rfc9458_appendix_a"].items()
}
AES = SymmetricAlgorithm(KDF_HKDF_SHA256, AEAD_AES_128_GCM)
CHACHA = SymmetricAlgorithm(KDF_HKDF_SHA256, AEAD_CHACHA20_POLY1305)


def _gateway() -> GatewayKey:
    return GatewayKey.from_private_bytes(A["key_id"], A["skR"])


def test_appendix_a_key_configuration() -> None:
    config = _gateway().config
    assert config.public_key == A["pkR"]
    assert config.to_bytes() == A["key_config"]
    assert KeyConfig.parse(A["key_config"]) == config
    listed = encode_key_configs([config, config])
    assert listed.hex() == "002d" + A["key_config"].hex() + "002d" + A["key_config"].hex()
    assert parse_key_configs(listed) == (config, config)


def test_appendix_a_request_byte_for_byte() -> None:
    config = KeyConfig.parse(A["key_config"])
    wire, client = encapsulate_request(
        config, A["request"], algorithm=AES, ephemeral_private_key=A["skE"]
    )
    assert wire == A["encapsulated_request"]
    assert client.enc == A["pkE"]
    assert client.secret == A["export_secret"]
    assert decode_request(A["request"]) == Request("GET", "https", "example.com", "/")


def test_appendix_a_gateway_opens_and_answers_byte_for_byte() -> None:
    request, server = decapsulate_request([_gateway()], A["encapsulated_request"])
    assert request == A["request"]
    assert server.secret == A["export_secret"]
    assert server.key_id == 1
    assert b"message/bhttp request\x00" + server.header == A["info"]
    key, nonce = _response_keys(server.secret, server.enc, A["response_nonce"], AEAD_AES_128_GCM)
    assert (key, nonce) == (A["aead_key"], A["aead_nonce"])
    answer = server.encapsulate_response(A["response"], nonce=A["response_nonce"])
    assert answer == A["encapsulated_response"]
    assert decode_response(A["response"]) == Response(200)


def test_appendix_a_client_opens_the_published_response() -> None:
    config = KeyConfig.parse(A["key_config"])
    _, client = encapsulate_request(
        config, A["request"], algorithm=AES, ephemeral_private_key=A["skE"]
    )
    assert client.decapsulate_response(A["encapsulated_response"]) == A["response"]


@pytest.mark.parametrize("vector", VECTORS["rfc9180"], ids=lambda v: v["section"])
def test_rfc_9180_vectors_pin_the_hpke_library(vector: dict[str, Any]) -> None:
    h = {
        k: bytes.fromhex(v) for k, v in vector.items() if k not in ("section", "aead_id", "exports")
    }
    aead = AEADId.AES128_GCM if vector["aead_id"] == 1 else AEADId.CHACHA20_POLY1305
    suite = CipherSuite.new(KEMId.DHKEM_X25519_HKDF_SHA256, KDFId.HKDF_SHA256, aead)
    ephemeral = X25519PrivateKey.from_private_bytes(h["skEm"])
    eks = KEMKeyPair(
        KEMKey.from_pyca_cryptography_key(ephemeral),
        KEMKey.from_pyca_cryptography_key(ephemeral.public_key()),
    )
    enc, sender = suite.create_sender_context(
        suite.kem.deserialize_public_key(h["pkRm"]), h["info"], eks=eks
    )
    assert enc == h["enc"]
    assert sender.seal(h["pt"], h["aad"]) == h["ct"]
    recipient = suite.create_recipient_context(
        enc, suite.kem.deserialize_private_key(h["skRm"]), h["info"]
    )
    assert recipient.open(h["ct"], h["aad"]) == h["pt"]
    for context, value in vector["exports"]:
        assert sender.export(bytes.fromhex(context), 32).hex() == value
        assert recipient.export(bytes.fromhex(context), 32).hex() == value


@pytest.mark.parametrize(
    ("algorithm", "aead"),
    [(AES, hpke.AEAD.AES_128_GCM), (CHACHA, hpke.AEAD.CHACHA20_POLY1305)],
    ids=["aes-128-gcm", "chacha20-poly1305"],
)
def test_an_independent_hpke_seals_requests_the_gateway_opens(
    algorithm: SymmetricAlgorithm, aead: hpke.AEAD
) -> None:
    # cryptography's HPKE (single-shot SealBase) builds the request from RFC 9458 §4.3's formula
    gateway = GatewayKey.generate(key_id=7)
    header = bytes([7]) + (0x20).to_bytes(2, "big") + (1).to_bytes(2, "big")
    header += algorithm.aead_id.to_bytes(2, "big")
    body = encode_request(Request("POST", "https", "gw", "/v1/x", content=b"reports"))
    suite = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, aead)
    sealed = suite.encrypt(
        body, gateway.private_key.public_key(), info=b"message/bhttp request\x00" + header
    )
    request, server = decapsulate_request({7: gateway}, header + sealed)
    assert decode_request(request).content == b"reports"
    assert server.aead_id == algorithm.aead_id


@pytest.mark.parametrize("algorithm", [AES, CHACHA], ids=["aes-128-gcm", "chacha20-poly1305"])
def test_round_trip_under_each_suite(algorithm: SymmetricAlgorithm) -> None:
    gateway = GatewayKey.generate()
    body = encode_request(Request("POST", "https", "gw", "/", content=bytes(range(256)) * 40))
    wire, client = encapsulate_request(gateway.config, body, algorithm=algorithm)
    request, server = decapsulate_request([gateway], wire)
    assert request == body
    answer = encode_response(Response(202, ((b"x", b"y"),), b"ok"))
    reply = server.encapsulate_response(answer)
    nonce_length = 16 if algorithm is AES else 32
    assert len(reply) == nonce_length + len(answer) + 16
    assert client.decapsulate_response(reply) == answer
    # a fresh ephemeral key and a fresh response nonce every time
    again, _ = encapsulate_request(gateway.config, body, algorithm=algorithm)
    assert again[7:39] != wire[7:39]
    assert server.encapsulate_response(answer)[:16] != reply[:16]


def _reason(call: Any) -> OHTTPRejection:
    with pytest.raises(OHTTPError) as caught:
        call()
    assert "\n" not in str(caught.value)
    return caught.value.reason


def test_refusals_name_their_reason() -> None:
    gateway = _gateway()
    good = A["encapsulated_request"]

    def open_(data: bytes, **kwargs: Any) -> Any:
        return lambda: decapsulate_request([gateway], data, **kwargs)

    assert _reason(open_(b"")) is OHTTPRejection.MALFORMED
    assert _reason(open_(good[:30])) is OHTTPRejection.MALFORMED
    assert _reason(open_(good[:60])) is OHTTPRejection.DECRYPTION_FAILED
    assert _reason(open_(good, max_length=50)) is OHTTPRejection.TOO_LARGE
    assert _reason(open_(b"\x02" + good[1:])) is OHTTPRejection.UNKNOWN_KEY
    for at, value in ((2, 0x10), (4, 2), (6, 2)):  # KEM P-256, KDF SHA-384, AEAD AES-256
        changed = bytearray(good)
        changed[at] = value
        assert _reason(open_(bytes(changed))) is OHTTPRejection.UNSUPPORTED_SUITE
    for at in (7, 20, 45, 60, len(good) - 1):
        changed = bytearray(good)
        changed[at] ^= 1
        assert _reason(open_(bytes(changed))) is OHTTPRejection.DECRYPTION_FAILED
    low_order = good[:7] + bytes(32) + good[39:]  # enc = the all-zero point: DH fails
    assert _reason(open_(low_order)) is OHTTPRejection.DECRYPTION_FAILED
    other = GatewayKey.generate(key_id=1)
    assert _reason(lambda: decapsulate_request([other], good)) is (OHTTPRejection.DECRYPTION_FAILED)


def test_response_refusals() -> None:
    gateway = GatewayKey.generate(key_id=3)
    wire, client = encapsulate_request(gateway.config, b"q")
    _, server = decapsulate_request([gateway], wire)
    reply = server.encapsulate_response(b"answer")
    for at in (0, 15, 16, len(reply) - 1):
        changed = bytearray(reply)
        changed[at] ^= 1
        assert _reason(lambda c=changed: client.decapsulate_response(bytes(c))) is (
            OHTTPRejection.DECRYPTION_FAILED
        )
    assert _reason(lambda: client.decapsulate_response(b"\x00")) is OHTTPRejection.MALFORMED
    _, client2 = encapsulate_request(gateway.config, b"q")
    assert _reason(lambda: client2.decapsulate_response(reply)) is (
        OHTTPRejection.DECRYPTION_FAILED
    )


def test_key_configuration_refusals() -> None:
    good = A["key_config"]
    assert _reason(lambda: KeyConfig.parse(good[:-1])) is OHTTPRejection.MALFORMED
    assert _reason(lambda: KeyConfig.parse(good + b"\x00")) is OHTTPRejection.MALFORMED
    assert _reason(lambda: KeyConfig.parse(good[:1] + b"\x12\x34" + good[3:])) is (
        OHTTPRejection.UNSUPPORTED_SUITE
    )
    odd = bytearray(good)
    odd[35:37] = (6).to_bytes(2, "big")
    assert _reason(lambda: KeyConfig.parse(bytes(odd))) is OHTTPRejection.MALFORMED
    assert _reason(lambda: parse_key_configs(bytes.fromhex("002e") + good)) is (
        OHTTPRejection.MALFORMED
    )
    assert _reason(lambda: parse_key_configs(bytes.fromhex("002d") + good + b"\x00")) is (
        OHTTPRejection.MALFORMED
    )
    assert _reason(lambda: parse_key_configs(b"")) is OHTTPRejection.MALFORMED
    only_unknown = KeyConfig(1, A["pkR"], (SymmetricAlgorithm(2, 2),))
    assert _reason(lambda: encapsulate_request(only_unknown, b"x")) is (
        OHTTPRejection.UNSUPPORTED_SUITE
    )
    assert _reason(lambda: encapsulate_request(only_unknown, b"x", algorithm=AES)) is (
        OHTTPRejection.UNSUPPORTED_SUITE
    )


def test_gateway_keys_come_from_ohttp_key_files(tmp_path: Path) -> None:
    from ldpipe.schemas.keys import KeyRing, save_key_pair

    pair = KeyPair.generate(role="ohttp", name="gateway")
    assert 0 <= pair.key_id <= 255
    save_key_pair(pair, tmp_path)
    (loaded,) = KeyRing.load(tmp_path, role="ohttp")
    key = GatewayKey.from_pair(loaded)
    assert key.config.public_key == pair.public.raw
    with pytest.raises(ValueError, match="one byte"):
        KeyPair.generate(key_id=256, role="ohttp")
    with pytest.raises(ValueError, match="ohttp"):
        GatewayKey.from_pair(KeyPair.generate(key_id=1, role="shuffler"))
    assert "private" not in repr(key)


def test_mutated_and_random_input_only_ever_raises_ohttp_error() -> None:
    rng = random.Random(9458)  # fixed seed: a failure reproduces
    keys = [_gateway()]
    good = A["encapsulated_request"]
    for i in range(2000):
        mutated = bytearray(good)
        for _ in range(1 + i % 3):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        for data in (rng.randbytes(rng.randrange(120)), bytes(mutated), good[: rng.randrange(80)]):
            with contextlib.suppress(OHTTPError):
                decapsulate_request(keys, data)
        with contextlib.suppress(OHTTPError):
            parse_key_configs(rng.randbytes(rng.randrange(60)))
