"""The Python device randomizer behind the conformance line protocol (``docs/conformance.md``).

``python -m ldpipe.producers.conformance_client`` reads one JSON request per line on stdin
(``config``: the device configuration's mechanism, epsilon, parameters and hash seed; ``item``;
``count``) and answers each with one line ``{"payloads": [hex, ...]}``: ``count`` independent
randomized reports of the item, made exactly as a device makes them, one at a time
(``DeviceClient.payload``: the mechanism's ``perturb_one`` with the OS CSPRNG, then
``PayloadCodec.encode_single``), unsealed; ``--batch`` makes them with the batch randomizer
instead (``Mechanism.randomize``, what ``ldpipe simulate`` and ``ldpipe produce`` use). A
request it cannot serve gets ``{"error": "one line"}``. ``--epsilon-scale`` and ``--biased-row``
make it deliberately wrong, for testing that the harness catches a wrong client; ``--seed``
fixes its generator for reproducible tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np

from ldpipe.schemas.mechanisms import Reports, build_mechanism, secure_rng
from ldpipe.schemas.mechanisms.single import numpy_bytes, os_bytes
from ldpipe.schemas.payloads import PayloadCodec

__all__ = ["answer", "main", "serve"]

_DECIMAL = re.compile(r"[0-9]{1,20}")
_MAX_COUNT = 10_000_000


def _parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """The mechanism options of a device configuration; decimal strings are integers."""
    raw = config.get("parameters") or {}
    if not isinstance(raw, Mapping):
        raise ValueError('"parameters" must be a JSON object')
    options = {
        str(key): int(value) if isinstance(value, str) and _DECIMAL.fullmatch(value) else value
        for key, value in raw.items()
    }
    seed = config.get("hash_seed")
    if seed is not None:
        if not isinstance(seed, str) or not _DECIMAL.fullmatch(seed):
            raise ValueError(f'"hash_seed" must be a decimal string, got {seed!r}')
        options["seed"] = int(seed)
    return options


def answer(
    request: Mapping[str, Any],
    rng: np.random.Generator | None = None,
    *,
    epsilon_scale: float = 1.0,
    biased_row: bool = False,
    batch: bool = False,
) -> dict[str, Any]:
    """The reply to one request: ``{"payloads": [...]}`` or ``{"error": ...}``; the reports are
    made one at a time as a device makes them, or with the batch randomizer (``batch``, and
    always for the wrong-on-purpose ``biased_row``). ``rng``: a seeded generator for tests
    (default: the OS CSPRNG)."""
    try:
        config = request["config"]
        item = request["item"]
        count = request["count"]
        if not isinstance(config, Mapping) or not isinstance(item, str):
            raise ValueError('"config" must be an object and "item" a string')
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_COUNT:
            raise ValueError(f'"count" must be an integer in [1, {_MAX_COUNT}], got {count!r}')
        mechanism = build_mechanism(
            str(config["mechanism"]),
            epsilon=float(config["epsilon"]) * epsilon_scale,
            **_parameters(config),
        )
        codec = PayloadCodec.for_mechanism(mechanism)
        if batch or biased_row:
            rng = rng if rng is not None else secure_rng()
            reports = mechanism.randomize([item] * count, rng)
            if biased_row and mechanism.k > 1:
                reports = _bias_rows(mechanism.randomize([item] * count, rng), reports, rng)
            payloads = codec.encode(reports)
        else:
            random_bytes = os_bytes if rng is None else numpy_bytes(rng)
            code = mechanism.encode_one(item)
            payloads = [
                codec.encode_single(*mechanism.perturb_one(code, random_bytes))
                for _ in range(count)
            ]
    except KeyError as exc:
        return {"error": f"the request lacks {exc}; it needs config, item and count"}
    except (ValueError, TypeError) as exc:
        return {"error": str(exc).splitlines()[0]}
    return {"payloads": [p.hex() for p in payloads]}


def _bias_rows(spare: Reports, reports: Reports, rng: np.random.Generator) -> Reports:
    """WRONG ON PURPOSE: about ``n/k`` reports replaced by row-0 reports of ``spare``, so row 0
    is chosen about twice as often; each report is still correct given its row."""
    extra = spare.take(np.flatnonzero(spare.rows == 0))
    where = rng.choice(len(reports), size=len(extra), replace=False)
    rows, values = reports.rows.copy(), reports.values.copy()
    rows[where], values[where] = extra.rows, extra.values
    return Reports(rows, values)


def serve(
    stdin: IO[str],
    stdout: IO[str],
    *,
    epsilon_scale: float = 1.0,
    biased_row: bool = False,
    seed: int | None = None,
    batch: bool = False,
) -> None:
    """Answer every request line of ``stdin`` on ``stdout`` until end of input, drawing from the
    OS CSPRNG (as a device does) unless ``seed`` fixes a generator (reproducible tests)."""
    rng = None if seed is None else np.random.default_rng(seed)
    for line in stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError:
            reply: dict[str, Any] = {"error": "the request is not one JSON line"}
        else:
            if isinstance(request, Mapping):
                reply = answer(
                    request, rng, epsilon_scale=epsilon_scale, biased_row=biased_row, batch=batch
                )
            else:
                reply = {"error": "the request is not a JSON object"}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ldpipe.producers.conformance_client",
        description="The Python device randomizer speaking the conformance line protocol.",
    )
    parser.add_argument(
        "--epsilon-scale",
        type=float,
        default=1.0,
        help="WRONG ON PURPOSE when not 1: randomize at epsilon times this",
    )
    parser.add_argument(
        "--biased-row",
        action="store_true",
        help="WRONG ON PURPOSE: row 0 chosen about twice as often as the others",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="a fixed generator seed, for reproducible tests (default: the OS CSPRNG)",
    )
    parser.add_argument(
        "--batch",
        action="store_true",
        help="make the reports with the batch randomizer (ldpipe simulate's), not one at a time",
    )
    args = parser.parse_args(argv)
    serve(
        sys.stdin,
        sys.stdout,
        epsilon_scale=args.epsilon_scale,
        biased_row=args.biased_row,
        seed=args.seed,
        batch=args.batch,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
