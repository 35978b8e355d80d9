"""Write ``schemas/vectors/tokens.json``: vectors for ldpipe's Privacy Pass tokens (type 0x0002).

Every value is computed by the reference below, written from ``schemas/tokens.md`` and the RFCs it
cites (RFC 9577 §2.1 challenge, RFC 9578 §6 issuance, RFC 9474 §4 RSABSSA-SHA384-PSS-Deterministic,
RFC 8017 §9.1.1 EMSA-PSS); it never imports ``ldpipe.schemas.tokens``, and signs with the plain
private exponent (the library uses the Chinese remainder theorem), so the vectors check the
library independently. Randomness (nonce, salt, blind) is derived from fixed labels with SHA-256:
running this twice writes the same bytes. The issuer key is a fixed RSA-2048 test key (below).

    python tests/vectors/make_token_vectors.py            # rewrite the file
    python tests/vectors/make_token_vectors.py --check    # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

__all__ = ["CASES", "KEY_PEM", "build_vectors", "render"]

OUTPUT = Path(__file__).resolve().parents[2] / "schemas" / "vectors" / "tokens.json"
LABEL = b"ldpipe/token-redemption-context/v1\x00"

# A fixed RSA-2048 test key (e = 65537), PKCS #8; for vectors only, never for a deployment.
KEY_PEM = b"""-----BEGIN PRIVATE KEY-----
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDaCctktybWWPok
7XHMfKGnkR4km2yhP49kJjtL1izG5BIxzhJlc1FcgkhG+86uj2YW6L2ZMLjJxE97
hBxvtplwNOEuj3TpxzB8GtpzDukFXsvwjs05bqWinXsmm2LrP6Wqtvd0BuwXeQWz
P7BSPhN6LqBtNugb+uMSH7x3YMG2qVePY639T39qbqC/djRa/zXqfQLm+AXgkQm3
u9y+trdrzObSG6NooUuaoWA+85qv1w5n/ELiDvx4xYWS22pvANvGoMHjEBgBy6xO
d/GWFrgFQDqLLqOawdzxtyWu+qm7aRlORyLGBzqE856N3ZAQFxI+jzqLf4klijfh
5czShV3NAgMBAAECggEAGKNBsfRGNbNhNLoGAWrV43bw9ob/i+sAO3tcePHPJnxQ
GAOmrYMN3wuzuh2rGauHiDAteHl6cAY4Swc/JVp3VSgMh/Pa7K2+608nfxfgueQf
3GNuij5YBhuQdmjZkSakhDlfleNQW0ioHbylIm30SnqpUx4AtWSwsvQWGlE7InYj
wPrF50FVMMJNQj6Wnll8sop94fGkiM+v6ufntkbWO9xRFSRjkmY4FORWzhMXig7c
3wHng7DJotjcVoX4eRjFkn2nDqMMVBBuIRsKMQFyrl92c7ycfs7Luud7PBquJaBc
t8QSHNRk7sLZN3oTk37QNT0JUOewi+tkVE8/okusWwKBgQD43lpJhCOFHcDpf6Tl
GR+ts5xOAElOE9zVWlCftXHM/ySputFn5FPqufapjkuxnymlA+MV2LliJlqT4REo
1rvq6ua2uGB6k4fDtnSww12XJRqZFosxBM1UgBnAdLT0o8Uil3p6TGGTH/dO9XGn
bQR7APMI1kGya956tNzTZ9K3zwKBgQDgSUb2t1GJ6bDX/AQYlrgJFhUmer1/NkCd
kniT9BOnmI7VG/DCwfaPLcaI6BLLI/zNNpQwSFw+/HrFMOgScMQP6M2kfLJzaIkB
Ty/+DT5VTjWbiZXEf+PjAeXqiiWMtIxko4RuOuMS4Y/rv8kNhQBiG0HqZPSApRq/
lroOMPCbowKBgEPHgz2MgIQLs3OksQs4SXlsdoCD8XMTU8zDuTuWFjVns9uKJugt
tnEyTqylNZZdq+Dmax2TFgJWQcsOvDasLSfw6/8NvjEEJzC1a5iMzNuSXmkdS7GB
Bk8iSGEzJ+mNBO7D5LaUQOrqBNf7XwXjWhoKCyb3+5KVcFVpFs948lnfAoGBAMM2
xG9k67GQF35GOgJ03MX71HjjiCA7Rk5f+Fc+sATFwjw2z32UeVfxzcXHyOPK9PRg
tua3dKLV+r27baLvR5dZV/P9HQ1aRTVAiVMkj8aMBhjUzeh0MBObyVQ03a30T+Yg
dNnEo3QBo9Tb3tDHnKfHdb3gFPgLvJZZSKOlcSblAoGANfHr1SWY8U8YtOm0gvKD
F/EQJpuPQxUfbsKQJ8N/x08mvUxAo2l3hWfYR+kC8RP1E7FL11YrX5o0FnDlg1HK
h68AfkT4wBR5Bni6eaqHdzgzCuhv1blw+P65sYP7da47VZDk6PVyQw29an6uU6U6
h0bSQSijyXsymnE1cIPT1r8=
-----END PRIVATE KEY-----
"""

# (issuer_name, origin_info, use_case, period)
CASES: tuple[tuple[str, str, str, int], ...] = (
    ("issuer.example", "gateway.example", "emoji", 20_000),
    ("issuer.example", "gateway.example", "emoji", 20_001),
    ("ldpipe-issuer", "", "domains.discovery", 0),
    ("issuer.example", "gateway.example", "x", (1 << 64) - 1),
)


def _context(use_case: str, period: int) -> bytes:
    name = use_case.encode()
    return hashlib.sha256(LABEL + bytes([len(name)]) + name + period.to_bytes(8, "big")).digest()


def _challenge(issuer: str, context: bytes, origin: str) -> bytes:
    i, o = issuer.encode(), origin.encode()
    return (
        struct.pack(">HH", 2, len(i)) + i + bytes([len(context)]) + context
        + struct.pack(">H", len(o)) + o
    )


def _der_len(n: int) -> bytes:
    if n < 128:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def _tlv(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_len(len(body)) + body


def _uint(v: int) -> bytes:
    return _tlv(0x02, v.to_bytes(v.bit_length() // 8 + 1, "big"))


def _oid(dotted: str) -> bytes:
    parts = [int(p) for p in dotted.split(".")]
    out = bytearray([40 * parts[0] + parts[1]])
    for p in parts[2:]:
        chunk = [p & 0x7F]
        p >>= 7
        while p:
            chunk.append(0x80 | (p & 0x7F))
            p >>= 7
        out += bytes(reversed(chunk))
    return _tlv(0x06, bytes(out))


def _spki(n: int, e: int) -> bytes:
    """RFC 9578 §6.5: id-RSASSA-PSS with RSASSA-PSS-params (RFC 4055 §3.1) sha384/mgf1/48."""
    sha384 = _tlv(0x30, _oid("2.16.840.1.101.3.4.2.2"))
    params = _tlv(0x30, _tlv(0xA0, sha384)
                  + _tlv(0xA1, _tlv(0x30, _oid("1.2.840.113549.1.1.8") + sha384))
                  + _tlv(0xA2, _uint(48)))
    algorithm = _tlv(0x30, _oid("1.2.840.113549.1.1.10") + params)
    return _tlv(0x30, algorithm + _tlv(0x03, b"\x00" + _tlv(0x30, _uint(n) + _uint(e))))


def _mgf1(seed: bytes, length: int) -> bytes:
    blocks = range(length // 48 + 1)
    out = b"".join(hashlib.sha384(seed + c.to_bytes(4, "big")).digest() for c in blocks)
    return out[:length]


def _emsa_pss(message: bytes, salt: bytes, em_bits: int) -> bytes:
    em_len = (em_bits + 7) // 8
    h = hashlib.sha384(bytes(8) + hashlib.sha384(message).digest() + salt).digest()
    db = bytes(em_len - len(salt) - 48 - 2) + b"\x01" + salt
    masked = bytearray(x ^ y for x, y in zip(db, _mgf1(h, em_len - 49), strict=True))
    masked[0] &= 0xFF >> (8 * em_len - em_bits)
    return bytes(masked) + h + b"\xbc"


def _derive(label: str, index: int, length: int) -> bytes:
    out = b"".join(
        hashlib.sha256(f"ldpipe token vectors/{label}/{index}/{block}".encode()).digest()
        for block in range(length // 32 + 1)
    )
    return out[:length]


def _case(index: int, case: tuple[str, str, str, int], key: rsa.RSAPrivateKey) -> dict[str, Any]:
    issuer, origin, use_case, period = case
    numbers = key.private_numbers()
    n, e, d = numbers.public_numbers.n, numbers.public_numbers.e, numbers.d
    spki = _spki(n, e)
    key_id = hashlib.sha256(spki).digest()
    context = _context(use_case, period)
    challenge = _challenge(issuer, context, origin)
    nonce, salt = _derive("nonce", index, 32), _derive("salt", index, 48)
    blind = bytearray(_derive("blind", index, 256))
    blind[0] &= 0x7F  # below n (n has 2048 bits, its top bit is set)
    r = int.from_bytes(blind, "big")
    token_input = struct.pack(">H", 2) + nonce + hashlib.sha256(challenge).digest() + key_id
    m = int.from_bytes(_emsa_pss(token_input, salt, n.bit_length() - 1), "big")
    blinded = (m * pow(r, e, n)) % n
    blind_sig = pow(blinded, d, n)
    sig = (blind_sig * pow(r, -1, n)) % n
    authenticator = sig.to_bytes(256, "big")
    # an independent check of the whole computation: cryptography's RSASSA-PSS verification
    key.public_key().verify(
        authenticator, token_input,
        padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48), hashes.SHA384(),
    )
    return {
        "issuer_name": issuer,
        "origin_info": origin,
        "use_case": use_case,
        "period": period,
        "redemption_context": context.hex(),
        "token_challenge": challenge.hex(),
        "nonce": nonce.hex(),
        "salt": salt.hex(),
        "blind": bytes(blind).hex(),
        "token_request": (struct.pack(">HB", 2, key_id[-1]) + blinded.to_bytes(256, "big")).hex(),
        "token_response": blind_sig.to_bytes(256, "big").hex(),
        "token": (token_input + authenticator).hex(),
    }


def build_vectors() -> dict[str, Any]:
    key = serialization.load_pem_private_key(KEY_PEM, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    numbers = key.public_key().public_numbers()
    spki = _spki(numbers.n, numbers.e)
    cases = [_case(i, case, key) for i, case in enumerate(CASES)]
    return {
        "description": "ldpipe Privacy Pass tokens, type 0x0002 (schemas/tokens.md)",
        "generator": "tests/vectors/make_token_vectors.py",
        "issuer_private_key_pem": KEY_PEM.decode(),
        "issuer_public_key_spki": spki.hex(),
        "token_key_id": hashlib.sha256(spki).hexdigest(),
        "vectors": cases,
        "batches": _batches(cases),
    }


def _batches(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """schemas/tokens.md, "Batches": count u16 (big-endian) then the fixed-length items. The
    request batches every case's TokenRequest (one key: the test key); the response is a
    partial answer, the first two of them (the quota had two tokens left)."""
    requests = [bytes.fromhex(c["token_request"]) for c in cases]
    responses = [bytes.fromhex(c["token_response"]) for c in cases[:2]]
    return {
        "token_batch_request": (struct.pack(">H", len(requests)) + b"".join(requests)).hex(),
        "token_batch_response": (struct.pack(">H", len(responses)) + b"".join(responses)).hex(),
    }


def render(vectors: dict[str, Any]) -> str:
    """Deterministic text of the vectors file."""
    return json.dumps(vectors, indent=2, ensure_ascii=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write the JSON")
    args = parser.parse_args(argv)
    text = render(build_vectors())
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
