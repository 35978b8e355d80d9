"""Privacy Pass issuance and redemption, type 0x0002 (RFC 9578 §6.1-§6.4).

The protocol's steps over the formats and the blind signature: the client's token request and
the state it keeps (§6.1), the issuer's response (§6.2), the client's token (§6.3), and the
verifier's check of a token against its challenge (§6.4). Split out of ``schemas/tokens.py``
(issue 24).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ldpipe.schemas.tokens.blind_rsa import Rng, blind, blind_sign, finalize
from ldpipe.schemas.tokens.formats import (
    NONCE_LENGTH,
    SALT_LENGTH,
    TOKEN_RESPONSE_LENGTH,
    Token,
    TokenChallenge,
    TokenError,
    TokenRequest,
    encode_token_input,
)
from ldpipe.schemas.tokens.rsa_keys import IssuerKeyPair, IssuerPublicKey

__all__ = [
    "TokenRequestState",
    "begin_token_request",
    "finalize_token",
    "issue_token_response",
    "verify_token",
]


# ---- issuance (RFC 9578 §6.1-§6.3) ------------------------------------------------------------


@dataclass(frozen=True)
class TokenRequestState:
    """What a client keeps between its request and the issuer's response (secret: ``inv``)."""

    key: IssuerPublicKey
    nonce: bytes
    challenge_digest: bytes
    inv: int = field(repr=False)

    def token_input(self) -> bytes:
        return encode_token_input(self.nonce, self.challenge_digest, self.key.key_id)


def begin_token_request(
    challenge: TokenChallenge, key: IssuerPublicKey, *, rng: Rng | None = None
) -> tuple[bytes, TokenRequestState]:
    """The client's token request (RFC 9578 §6.1) and the state ``finalize_token`` needs.

    Draws, from ``rng`` in this order: the 32-byte nonce, the 48-byte salt, the blind r.
    """
    draw = rng or os.urandom
    nonce = draw(NONCE_LENGTH)
    salt = draw(SALT_LENGTH)
    challenge_digest = challenge.digest()
    message = encode_token_input(nonce, challenge_digest, key.key_id)
    blinded, inv = blind(key, message, salt, draw)
    request = TokenRequest(key.truncated_key_id, blinded).to_bytes()
    return request, TokenRequestState(key, nonce, challenge_digest, inv)


def issue_token_response(key: IssuerKeyPair, request: bytes) -> bytes:
    """The issuer's token response to a token request (RFC 9578 §6.2): blind_sig, 256 bytes.

    ``TokenError``: "wrong_type", "malformed", "unknown_key" (the truncated key id is not this
    key's). The issuer learns nothing of the token: it sees only the blinded message.
    """
    parsed = TokenRequest.parse(request)
    if parsed.truncated_token_key_id != key.public.truncated_key_id:
        raise TokenError(
            "unknown_key",
            f"token request names key ..{parsed.truncated_token_key_id:02x}, "
            f"not this issuer's ..{key.public.truncated_key_id:02x}",
        )
    return blind_sign(key, parsed.blinded_msg)



def finalize_token(state: TokenRequestState, response: bytes) -> Token:
    """The token of an issuer's response (RFC 9578 §6.3); ``TokenError`` when it does not verify."""
    if len(response) != TOKEN_RESPONSE_LENGTH:
        raise TokenError(
            "malformed", f"a token response is {TOKEN_RESPONSE_LENGTH} bytes, not {len(response)}"
        )
    authenticator = finalize(state.key, state.token_input(), bytes(response), state.inv)
    return Token(state.nonce, state.challenge_digest, state.key.key_id, authenticator)


def verify_token(token: Token, key: IssuerPublicKey, challenge: TokenChallenge) -> None:
    """Check a token for a challenge (RFC 9578 §6.4); raises ``TokenError``, returns None if valid.

    Checked in order: "unknown_key" (token_key_id is not ``key``'s), "wrong_challenge"
    (challenge_digest is not SHA-256 of ``challenge``), "bad_signature" (RSASSA-PSS by
    ``cryptography``, an implementation independent of this module's blinding).
    """
    if token.token_key_id != key.key_id:
        raise TokenError("unknown_key", "token is signed by another issuer key")
    if token.challenge_digest != challenge.digest():
        raise TokenError("wrong_challenge", "token was issued for another challenge")
    if not key.verify(token.token_input(), token.authenticator):
        raise TokenError("bad_signature", "token authenticator does not verify")
