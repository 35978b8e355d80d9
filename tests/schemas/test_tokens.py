"""Privacy Pass tokens (schemas/tokens/) against the RFCs' test vectors and its own spec.

* RFC 9474 Appendix A's RSABSSA-SHA384-PSS-Deterministic vector: EMSA-PSS encoding, blinding,
  blind signature and finalization reproduce it byte for byte (4096-bit key); the other three
  variants' vectors check what they share (blind signature, unblinding);
  source: tests/schemas/data/rfc9474_vectors.json (the RFC's appendix as JSON, from
  github.com/cloudflare/blindrsa-ts test/testdata/test_vectors_rfc9474.json; commit in the file);
* RFC 9578 Appendix A.2's five token type 0x0002 vectors: public key encoding and token_key_id,
  challenge, token request, token response and token, all byte for byte;
  source: tests/schemas/data/rfc9578_a2_vectors.json (the RFC's appendix as JSON, from
  github.com/cloudflare/privacypass-ts test/test_data/pub_verif_rfc9578.go.json; commit in
  the file);
* ldpipe's own vectors (schemas/vectors/tokens.json) and their generator's --check;
* every refusal with its reason; hypothesis: parsers raise only ``TokenError``.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.tokens import (
    NONCE_LENGTH,
    TOKEN_LENGTH,
    TOKEN_REQUEST_LENGTH,
    TOKEN_RESPONSE_LENGTH,
    TOKEN_TYPE,
    IssuerKeyPair,
    IssuerPublicKey,
    Token,
    TokenChallenge,
    TokenError,
    TokenRequest,
    begin_token_request,
    blind,
    blind_sign,
    decode_batch,
    emsa_pss_encode,
    encode_batch,
    finalize,
    finalize_token,
    issue_token_response,
    redemption_context,
    rsa_keys,
    verify_token,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
VECTORS = ROOT / "schemas" / "vectors" / "tokens.json"
GENERATOR = ROOT / "tests" / "vectors" / "make_token_vectors.py"


def _hex(value: str) -> bytes:
    return bytes.fromhex(value.removeprefix("0x"))


def _int(value: str) -> int:
    return int(value, 16)


def _replay(*chunks: bytes) -> Any:
    """An rng that returns the given byte strings in order (each call asks for one of them)."""
    queue = list(chunks)

    def draw(n: int) -> bytes:
        chunk = queue.pop(0)
        assert len(chunk) == n, f"asked {n} bytes, the vector has {len(chunk)}"
        return chunk

    return draw


@cache
def rfc9474() -> list[dict[str, str]]:
    return list(json.loads((DATA / "rfc9474_vectors.json").read_text())["vectors"])


@cache
def rfc9578() -> list[dict[str, str]]:
    return list(json.loads((DATA / "rfc9578_a2_vectors.json").read_text())["vectors"])


@cache
def key_of_9578(index: int) -> IssuerKeyPair:
    return IssuerKeyPair.from_pem(_hex(rfc9578()[index]["skS"]))


@cache
def fixed_key() -> IssuerKeyPair:
    return key_of_9578(0)


@cache
def other_key() -> IssuerKeyPair:
    return IssuerKeyPair.generate()


# ---- RFC 9474 Appendix A ----------------------------------------------------------------------


def test_rfc9474_deterministic_vector_byte_for_byte() -> None:
    (v,) = [v for v in rfc9474() if v["name"] == "RSABSSA-SHA384-PSS-Deterministic"]
    key = IssuerKeyPair.from_primes(_int(v["p"]), _int(v["q"]), _int(v["e"]))
    assert key.public.n == _int(v["n"])
    assert v["msg_prefix"] == "" and _hex(v["input_msg"]) == _hex(v["msg"])
    message, salt = _hex(v["msg"]), _hex(v["salt"])
    encoded = emsa_pss_encode(message, key.public.n.bit_length() - 1, salt)
    assert encoded == _hex(v["encoded_msg"])
    r = pow(_int(v["inv"]), -1, key.public.n)
    blinded, inv = blind(key.public, message, salt, _replay(r.to_bytes(512, "big")))
    assert inv == _int(v["inv"])
    assert blinded == _hex(v["blinded_msg"])
    blind_sig = blind_sign(key, blinded)
    assert blind_sig == _hex(v["blind_sig"])
    assert finalize(key.public, message, blind_sig, inv) == _hex(v["sig"])


@pytest.mark.parametrize("name", [
    "RSABSSA-SHA384-PSS-Randomized",
    "RSABSSA-SHA384-PSSZERO-Randomized",
    "RSABSSA-SHA384-PSSZERO-Deterministic",
])
def test_rfc9474_other_variants_share_blind_sign(name: str) -> None:
    """The raw RSA private operation and the unblinding are the same in every variant."""
    (v,) = [v for v in rfc9474() if v["name"] == name]
    key = IssuerKeyPair.from_primes(_int(v["p"]), _int(v["q"]), _int(v["e"]))
    blind_sig = blind_sign(key, _hex(v["blinded_msg"]))
    assert blind_sig == _hex(v["blind_sig"])
    s = (int.from_bytes(blind_sig, "big") * _int(v["inv"])) % key.public.n
    assert s.to_bytes(512, "big") == _hex(v["sig"])


# ---- RFC 9578 Appendix A.2 --------------------------------------------------------------------


@pytest.mark.parametrize("index", range(5))
def test_rfc9578_vector_byte_for_byte(index: int) -> None:
    v = rfc9578()[index]
    key = key_of_9578(index)
    assert key.public.spki == _hex(v["pkS"])
    loaded = IssuerPublicKey.from_spki(_hex(v["pkS"]))
    assert loaded == key.public
    challenge = TokenChallenge.from_bytes(_hex(v["token_challenge"]))
    assert challenge.to_bytes() == _hex(v["token_challenge"])
    request, state = begin_token_request(
        challenge, loaded, rng=_replay(_hex(v["nonce"]), _hex(v["salt"]), _hex(v["blind"]))
    )
    assert request == _hex(v["token_request"])
    response = issue_token_response(key, request)
    assert response == _hex(v["token_response"])
    token = finalize_token(state, response)
    assert token.to_bytes() == _hex(v["token"])
    parsed = Token.parse(_hex(v["token"]))
    assert parsed == token and parsed.token_key_id == loaded.key_id
    verify_token(parsed, loaded, challenge)


# ---- round trips and refusals -----------------------------------------------------------------


def _issue(
    key: IssuerKeyPair, challenge: TokenChallenge, seed: int = 1
) -> Token:
    request, state = begin_token_request(challenge, key.public, rng=random.Random(seed).randbytes)
    return finalize_token(state, issue_token_response(key, request))


CHALLENGE = TokenChallenge("issuer.example", redemption_context("emoji", 20_000), "gateway")


def test_round_trip_and_layout() -> None:
    key = fixed_key()
    token = _issue(key, CHALLENGE)
    data = token.to_bytes()
    assert len(data) == TOKEN_LENGTH == 354 and data[:2] == TOKEN_TYPE.to_bytes(2, "big")
    assert data[2:34] == token.nonce and len(token.nonce) == NONCE_LENGTH
    assert data[34:66] == CHALLENGE.digest() and data[66:98] == key.public.key_id
    verify_token(Token.parse(data), key.public, CHALLENGE)


def test_os_randomness_by_default_gives_distinct_unlinkable_requests() -> None:
    key = fixed_key()
    (r1, s1), (r2, s2) = (begin_token_request(CHALLENGE, key.public) for _ in range(2))
    assert r1 != r2 and s1.nonce != s2.nonce
    t1 = finalize_token(s1, issue_token_response(key, r1))
    # the issuer saw r1; the token's bytes appear nowhere in what it saw
    assert t1.authenticator not in r1 and t1.nonce not in r1


def test_refusals_name_their_reason() -> None:
    key, other = fixed_key(), other_key()
    token = _issue(key, CHALLENGE)
    with pytest.raises(TokenError) as caught:
        verify_token(token, other.public, CHALLENGE)
    assert caught.value.reason == "unknown_key"
    wrong = TokenChallenge("issuer.example", redemption_context("emoji", 20_001), "gateway")
    with pytest.raises(TokenError) as caught:
        verify_token(token, key.public, wrong)
    assert caught.value.reason == "wrong_challenge"
    forged = Token(token.nonce, token.challenge_digest, token.token_key_id,
                   bytes(255) + b"\x01")
    with pytest.raises(TokenError) as caught:
        verify_token(forged, key.public, CHALLENGE)
    assert caught.value.reason == "bad_signature"
    swapped = Token(bytes(32), token.challenge_digest, token.token_key_id, token.authenticator)
    with pytest.raises(TokenError) as caught:
        verify_token(swapped, key.public, CHALLENGE)
    assert caught.value.reason == "bad_signature"
    with pytest.raises(TokenError) as caught:
        Token.parse(token.to_bytes()[:-1])
    assert caught.value.reason == "malformed"
    with pytest.raises(TokenError) as caught:
        Token.parse(b"\x00\x01" + token.to_bytes()[2:])
    assert caught.value.reason == "wrong_type"
    assert isinstance(caught.value, LdpipeError) and isinstance(caught.value, ValueError)
    again = pickle.loads(pickle.dumps(caught.value))
    assert again.reason == "wrong_type" and str(again) == str(caught.value)


def test_issuer_refuses_bad_requests() -> None:
    key = fixed_key()
    request, _ = begin_token_request(CHALLENGE, key.public, rng=random.Random(3).randbytes)
    for bad, reason in (
        (request[:-1], "malformed"),
        (request + b"\x00", "malformed"),
        (b"", "malformed"),
        (b"\x00\x01" + request[2:], "wrong_type"),
        (request[:2] + bytes([request[2] ^ 1]) + request[3:], "unknown_key"),
        (request[:3] + b"\xff" * 256, "malformed"),  # blinded message >= n
    ):
        with pytest.raises(TokenError) as caught:
            issue_token_response(key, bad)
        assert caught.value.reason == reason, bad[:4].hex()


def test_client_refuses_a_bad_response() -> None:
    key = fixed_key()
    request, state = begin_token_request(CHALLENGE, key.public, rng=random.Random(4).randbytes)
    response = issue_token_response(key, request)
    with pytest.raises(TokenError) as caught:
        finalize_token(state, response[:-1])
    assert caught.value.reason == "malformed"
    with pytest.raises(TokenError) as caught:
        finalize_token(state, bytes([response[0] ^ 1]) + response[1:])
    assert caught.value.reason == "bad_signature"
    other = other_key()  # the same request signed by another key does not verify
    blinded = int.from_bytes(TokenRequest.parse(request).blinded_msg, "big") % other.public.n
    other_response = blind_sign(other, blinded.to_bytes(256, "big"))
    with pytest.raises(TokenError) as caught:
        finalize_token(state, other_response)
    assert caught.value.reason in ("bad_signature", "malformed")


def test_blind_sign_checks_its_result() -> None:
    key = IssuerKeyPair.from_pem(fixed_key().to_pem())
    key._dp ^= 2  # a fault in the CRT computation
    request, _ = begin_token_request(CHALLENGE, key.public, rng=random.Random(5).randbytes)
    with pytest.raises(RuntimeError, match="signing failure"):
        issue_token_response(key, request)


def test_spki_is_rfc9578_and_loads_only_that() -> None:
    key = fixed_key()
    spki = key.public.spki
    assert IssuerPublicKey.from_spki(spki).key_id == key.public.key_id
    assert key.public.truncated_key_id == key.public.key_id[-1]
    # cryptography reads the same key from the RSASSA-PSS SubjectPublicKeyInfo
    loaded = serialization.load_der_public_key(spki)
    assert isinstance(loaded, rsa.RSAPublicKey)
    assert loaded.public_numbers().n == key.public.n
    plain = key._key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for bad in (plain, spki[:-1], spki + b"\x00", b"", b"\x30\x00"):
        with pytest.raises(TokenError) as caught:
            IssuerPublicKey.from_spki(bad)
        assert caught.value.reason == "malformed"


def test_key_files(tmp_path: Path) -> None:
    key = fixed_key()
    path = tmp_path / "k.pem"
    key.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert IssuerKeyPair.load(path).public == key.public
    with pytest.raises(FileExistsError):
        other_key().save(path)
    assert IssuerKeyPair.load(path).public == key.public
    assert [p.name for p in tmp_path.iterdir()] == ["k.pem"]


def test_challenge_encoding_and_redemption_context() -> None:
    context = redemption_context("emoji", 20_000)
    assert len(context) == 32 and context != redemption_context("emoji", 20_001)
    assert context != redemption_context("emojj", 20_000)
    data = CHALLENGE.to_bytes()
    assert data[:2] == b"\x00\x02" and TokenChallenge.from_bytes(data) == CHALLENGE
    for bad in (data[:-1], data + b"\x00", b"\x00\x01" + data[2:], b""):
        with pytest.raises(TokenError):
            TokenChallenge.from_bytes(bad)
    with pytest.raises(ValueError):
        TokenChallenge("i", b"short", "o")
    with pytest.raises(ValueError):
        redemption_context("", 1)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_parsers_raise_only_token_error(data: bytes) -> None:
    key = fixed_key()
    for parse in (Token.parse, TokenRequest.parse, TokenChallenge.from_bytes,
                  IssuerPublicKey.from_spki, lambda d: issue_token_response(key, d)):
        with contextlib.suppress(TokenError):
            parse(data)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, TOKEN_REQUEST_LENGTH - 1), st.integers(1, 255))
def test_every_request_byte_matters(position: int, flip: int) -> None:
    key = fixed_key()
    request, state = begin_token_request(CHALLENGE, key.public, rng=random.Random(9).randbytes)
    mutated = bytearray(request)
    mutated[position] ^= flip
    try:
        response = issue_token_response(key, bytes(mutated))
    except TokenError:
        return
    with pytest.raises(TokenError):
        finalize_token(state, response)


# ---- ldpipe's vectors -------------------------------------------------------------------------


def _vectors() -> Iterator[dict[str, Any]]:
    yield from json.loads(VECTORS.read_text())["vectors"]


def test_ldpipe_vectors_reproduce() -> None:
    document = json.loads(VECTORS.read_text())
    key = IssuerKeyPair.from_pem(document["issuer_private_key_pem"].encode())
    public = IssuerPublicKey.from_spki(_hex(document["issuer_public_key_spki"]))
    assert public == key.public and public.key_id == _hex(document["token_key_id"])
    count = 0
    for v in _vectors():
        count += 1
        context = redemption_context(v["use_case"], v["period"])
        assert context == _hex(v["redemption_context"])
        challenge = TokenChallenge(v["issuer_name"], context, v["origin_info"])
        assert challenge.to_bytes() == _hex(v["token_challenge"])
        request, state = begin_token_request(
            challenge, public, rng=_replay(_hex(v["nonce"]), _hex(v["salt"]), _hex(v["blind"]))
        )
        assert request == _hex(v["token_request"])
        assert issue_token_response(key, request) == _hex(v["token_response"])
        token = finalize_token(state, _hex(v["token_response"]))
        assert token.to_bytes() == _hex(v["token"])
        verify_token(token, public, challenge)
    assert count >= 3


def test_batch_vectors_are_what_encode_batch_writes() -> None:
    """schemas/tokens.md, "Batches": the vectors' batches (also read by the TypeScript SDK's
    tests) are ``encode_batch`` of the cases' requests and of a partial answer's responses."""
    document = json.loads(VECTORS.read_text())
    requests = [_hex(v["token_request"]) for v in _vectors()]
    responses = [_hex(v["token_response"]) for v in _vectors()][:2]
    batches = document["batches"]
    assert encode_batch(requests) == _hex(batches["token_batch_request"])
    assert encode_batch(responses) == _hex(batches["token_batch_response"])
    request_batch = _hex(batches["token_batch_request"])
    assert decode_batch(request_batch, TOKEN_REQUEST_LENGTH, 64) == requests
    response_batch = _hex(batches["token_batch_response"])
    assert decode_batch(response_batch, TOKEN_RESPONSE_LENGTH, len(requests)) == responses


def test_vector_generator_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---- the private operation: GMP (gmpy2) and its Python-integer fallback ------------------------


@pytest.fixture(params=["gmpy2", "python"])
def crt_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test that asks runs twice: with gmpy2 (installed: a dependency) and without it."""
    assert rsa_keys.gmpy2 is not None, "gmpy2 is a dependency: pip install -e ."
    if request.param == "python":
        monkeypatch.setattr(rsa_keys, "gmpy2", None)
    return str(request.param)


def test_both_backends_reproduce_the_rfc_vectors_and_check_faults(crt_backend: str) -> None:
    test_rfc9474_deterministic_vector_byte_for_byte()
    for name in ("RSABSSA-SHA384-PSS-Randomized", "RSABSSA-SHA384-PSSZERO-Randomized",
                 "RSABSSA-SHA384-PSSZERO-Deterministic"):  # fmt: skip
        test_rfc9474_other_variants_share_blind_sign(name)
    for index in range(5):
        test_rfc9578_vector_byte_for_byte(index)
    test_blind_sign_checks_its_result()
    test_ldpipe_vectors_reproduce()


def test_gmpy2_and_python_integers_give_the_same_signatures() -> None:
    key = fixed_key()
    rng = random.Random(19890)
    for _ in range(50):
        m = rng.randrange(0, key.public.n)
        assert rsa_keys._crt_gmpy2(key, m) == rsa_keys._crt_python(key, m)
        assert type(rsa_keys._crt_gmpy2(key, m)) is int
        assert key.private_op(m) == rsa_keys._crt_python(key, m)


def test_without_gmpy2_tokens_are_issued_with_python_integers() -> None:
    """A platform where gmpy2 cannot be imported: the module loads and signs without it."""
    script = (
        "import sys; sys.modules['gmpy2'] = None\n"  # makes `import gmpy2` raise ImportError
        "from ldpipe.schemas import tokens as t\n"
        "from ldpipe.schemas.tokens import rsa_keys\n"
        "assert rsa_keys.gmpy2 is None\n"
        "key = t.IssuerKeyPair.generate()\n"
        "c = t.TokenChallenge('i.example', t.redemption_context('emoji', 1), 'gw')\n"
        "request, state = t.begin_token_request(c, key.public)\n"
        "token = t.finalize_token(state, t.issue_token_response(key, request))\n"
        "t.verify_token(token, key.public, c)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
