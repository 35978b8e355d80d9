"""Privacy Pass tokens, type 0x0002: publicly verifiable blind RSA (RFC 9578 §6).

A device proves that an issuer's attester vouched for it without the issuer learning which token
it gave out: the device blinds the token's input, the issuer signs the blinded message, the device
unblinds the signature (RFC 9474, RSABSSA-SHA384-PSS-Deterministic: EMSA-PSS with SHA-384, MGF1
SHA-384, a 48-byte salt, no message randomizer). Whoever holds the issuer's public key, the
gateway, checks the token. The flow and every byte are specified in ``schemas/tokens.md`` with
vectors in ``schemas/vectors/tokens.json``.

One issuer key per (use case, period): the issuer never sees the challenge, so the key is what
binds a token to its use case and period; the challenge's ``redemption_context`` names them too.

This package is the public surface (``ldpipe.schemas.tokens``, named by ``schemas/tokens.md``);
its modules hold, by what they do: ``formats.py`` (lengths, challenge, token, token request,
batches), ``rsa_keys.py`` (the issuer's RSA keys, RFC 9578 §6.5), ``blind_rsa.py`` (RFC 9474 §4)
and ``issuance.py`` (RFC 9578 §6.1-§6.4).

>>> import random
>>> key = IssuerKeyPair.generate()
>>> challenge = TokenChallenge("issuer.example", redemption_context("emoji", 20_000), "gateway")
>>> request, state = begin_token_request(challenge, key.public, rng=random.Random(7).randbytes)
>>> len(request), request[:3].hex() == f"0002{key.public.truncated_key_id:02x}"
(259, True)
>>> token = finalize_token(state, issue_token_response(key, request))
>>> len(token.to_bytes()) == TOKEN_LENGTH
True
>>> verify_token(Token.parse(token.to_bytes()), key.public, challenge)
"""

from __future__ import annotations

from ldpipe.schemas.tokens.blind_rsa import Rng, blind, blind_sign, emsa_pss_encode, finalize
from ldpipe.schemas.tokens.formats import (
    BLINDED_MESSAGE_LENGTH,
    MODULUS_BITS,
    NONCE_LENGTH,
    SALT_LENGTH,
    TOKEN_INPUT_LENGTH,
    TOKEN_LENGTH,
    TOKEN_REQUEST_LENGTH,
    TOKEN_RESPONSE_LENGTH,
    TOKEN_TYPE,
    Token,
    TokenChallenge,
    TokenError,
    TokenErrorReason,
    TokenRequest,
    decode_batch,
    encode_batch,
    redemption_context,
)
from ldpipe.schemas.tokens.issuance import (
    TokenRequestState,
    begin_token_request,
    finalize_token,
    issue_token_response,
    verify_token,
)
from ldpipe.schemas.tokens.rsa_keys import IssuerKeyPair, IssuerPublicKey

__all__ = [
    "BLINDED_MESSAGE_LENGTH",
    "MODULUS_BITS",
    "NONCE_LENGTH",
    "SALT_LENGTH",
    "TOKEN_INPUT_LENGTH",
    "TOKEN_LENGTH",
    "TOKEN_REQUEST_LENGTH",
    "TOKEN_RESPONSE_LENGTH",
    "TOKEN_TYPE",
    "IssuerKeyPair",
    "IssuerPublicKey",
    "Rng",
    "Token",
    "TokenChallenge",
    "TokenError",
    "TokenErrorReason",
    "TokenRequest",
    "TokenRequestState",
    "begin_token_request",
    "blind",
    "blind_sign",
    "decode_batch",
    "emsa_pss_encode",
    "encode_batch",
    "finalize",
    "finalize_token",
    "issue_token_response",
    "redemption_context",
    "verify_token",
]
