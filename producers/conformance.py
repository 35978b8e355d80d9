"""Statistical conformance of a device randomizer (``schemas/randomizers.md``; issue 20, part 4).

The harness starts a client under test (any program, any language), sends it requests as JSON
lines on its stdin and reads JSON lines from its stdout (the protocol is in
``docs/conformance.md``)::

    -> {"config": {"mechanism": "cms", "epsilon": 4.0, "parameters": {...}, "hash_seed": "..."},
        "item": "caf\\u00e9", "count": 20000}
    <- {"payloads": ["0101...", ...]}            (count payloads, hex, schemas/payloads.md)
    <- {"error": "one line"}                     (the client refuses the request)

Every payload is decoded with the reference decoder (``PayloadCodec``: an invalid payload fails
the run), and each output distribution is tested against the exact one the spec gives:
the row uniform over ``[0, k)`` (chi-square), the true cell's bit / inclusion / sign / value a
Binomial with its exact probability (exact two-sided binomial test), the other cells uniform and at
their exact rate (binomial and chi-square), and where a report has many bits, the number of other
ones per report (chi-square against its binomial law, which catches dependent bits).

Every check gets ``alpha / number_of_checks`` (Bonferroni), so a conforming client fails a run with
probability at most ``alpha`` (default 1e-6), up to the chi-square approximation (bins are merged
until each expects at least 5). The harness draws nothing at random: its cases are fixed.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import numpy.typing as npt
from scipy import stats

from ldpipe.schemas.errors import LdpipeError
from ldpipe.schemas.hashing import HashFamily, item_key
from ldpipe.schemas.mechanisms import (
    GeneralizedCountMeanSketch,
    Mechanism,
    OptimizedUnaryEncoding,
    SketchMechanism,
    build_mechanism,
)
from ldpipe.schemas.mechanisms.cms import unpack_bits
from ldpipe.schemas.mechanisms.hadamard import hadamard_entries
from ldpipe.schemas.payloads import PayloadCodec

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_COUNT",
    "Case",
    "Check",
    "ConformanceError",
    "ConformanceResult",
    "default_cases",
    "device_config",
    "evaluate",
    "run_conformance",
]

DEFAULT_ALPHA = 1e-6  # family-wise: P[a conforming client fails a run] <= this (Bonferroni)
DEFAULT_COUNT = 20_000  # reports per case: detects epsilon off by 10% at epsilon 4 (docs)
_MIN_EXPECTED = 5.0  # chi-square bins are merged until each expects at least this many
_BIG_SEED = (1 << 63) + 20_201  # above 2^53: the seed travels as a decimal string
_OUE_DICTIONARY = ("alpha", "beta", "gamma", "delta", "café", "naïve", "日本", "😀",
                   "epsilon", "zeta", "eta", "theta")  # fmt: skip


class ConformanceError(LdpipeError):
    """The client could not be run or broke the line protocol (one line: what and the fix)."""


@dataclass(frozen=True)
class Case:
    """One parameter set and item: the client is asked for ``count`` reports of ``item``."""

    name: str
    mechanism: str
    epsilon: float
    parameters: dict[str, Any]
    item: str
    count: int = DEFAULT_COUNT


@dataclass(frozen=True)
class Check:
    """One statistical test: its p-value against the per-check level."""

    case: str
    name: str
    statistic: float
    p_value: float
    level: float
    detail: str

    @property
    def passed(self) -> bool:
        return self.p_value >= self.level


@dataclass(frozen=True)
class ConformanceResult:
    alpha: float
    checks: tuple[Check, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if not check.passed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "alpha": self.alpha,
            "checks": [
                {
                    "case": c.case,
                    "check": c.name,
                    "statistic": c.statistic,
                    "p_value": c.p_value,
                    "level": c.level,
                    "passed": c.passed,
                    "detail": c.detail,
                }
                for c in self.checks
            ],
        }


def default_cases(count: int = DEFAULT_COUNT) -> tuple[Case, ...]:
    """The fixed cases: every mechanism at epsilon 4 on a small sketch, a seed above 2^53, and
    items given in a non-NFC form (``"cafe\\u0301"`` must hash as ``"café"``)."""
    sketch = {"k": 16, "m": 64}
    gcms = GeneralizedCountMeanSketch(epsilon=4.0, seed=_BIG_SEED, **sketch)
    ocms = build_mechanism("ocms", epsilon=4.0, seed=_BIG_SEED, target_frequency=0.05, **sketch)
    assert isinstance(ocms, GeneralizedCountMeanSketch)
    item, other = "cafe\u0301", "\U0001f600 smile"
    return (
        Case("cms", "cms", 4.0, dict(sketch), item, count),
        Case("cms-m12", "cms", 2.0, {"k": 4, "m": 12}, other, count),
        Case("hcms", "hcms", 4.0, dict(sketch), item, count),
        Case("gcms", "gcms", 4.0, {**sketch, "p": gcms.inclusion, "s": gcms.size}, item, count),
        Case("ocms", "ocms", 4.0, {**sketch, "p": ocms.inclusion, "s": ocms.size}, other, count),
        Case("rrcms", "rrcms", 4.0, {"k": 16, "m": 20}, item, count),
        Case("oue", "oue", 4.0, {"dictionary": list(_OUE_DICTIONARY)}, "nai\u0308ve", count),
    )


def device_config(case: Case) -> dict[str, Any]:
    """The part of the gateway's device configuration a randomizer reads
    (``infra/gateway/device_config.py``): the hash seed is a decimal string."""
    parameters = dict(case.parameters)
    seed = None if case.mechanism == "oue" else str(_BIG_SEED)
    return {
        "mechanism": case.mechanism,
        "epsilon": case.epsilon,
        "parameters": parameters,
        "hash_seed": seed,
    }


def _reference(case: Case) -> Mechanism:
    options = dict(case.parameters)
    if case.mechanism != "oue":
        options["seed"] = _BIG_SEED
    if case.mechanism == "ocms":  # p and s given: the randomizer is GCMS Alg. 1 with them
        options.pop("target_frequency", None)
    return build_mechanism(case.mechanism, epsilon=case.epsilon, **options)


# ---- the tests ---------------------------------------------------------------------------------
def _chi_square(observed: npt.NDArray[Any], expected: npt.NDArray[Any]) -> tuple[float, float, int]:
    """Pearson's statistic, p-value and degrees of freedom, bins merged (in order) until each
    expects at least ``_MIN_EXPECTED``."""
    obs_bins: list[float] = []
    exp_bins: list[float] = []
    acc_o = acc_e = 0.0
    for o, e in zip(observed.tolist(), expected.tolist(), strict=True):
        acc_o += o
        acc_e += e
        if acc_e >= _MIN_EXPECTED:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 or acc_o > 0:
        if exp_bins:
            obs_bins[-1] += acc_o
            exp_bins[-1] += acc_e
        else:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
    o_arr, e_arr = np.array(obs_bins), np.array(exp_bins)
    dof = len(o_arr) - 1
    if dof < 1:
        return 0.0, 1.0, 0
    stat = float(np.sum((o_arr - e_arr) ** 2 / e_arr))
    return stat, float(stats.chi2.sf(stat, dof)), dof


def _binomial(successes: int, trials: int, p: float) -> tuple[float, float]:
    """Observed rate and the exact two-sided binomial p-value."""
    if trials == 0:
        return 0.0, 1.0
    result = stats.binomtest(int(successes), int(trials), p)
    return successes / trials, float(result.pvalue)


class _Collector:
    def __init__(self, case: str) -> None:
        self.case = case
        self.raw: list[tuple[str, float, float, str]] = []

    def binomial(self, name: str, successes: int, trials: int, p: float) -> None:
        rate, pv = _binomial(successes, trials, p)
        self.raw.append((name, rate, pv, f"{successes}/{trials} = {rate:.6g}, exact {p:.6g}"))

    def chi_square(self, name: str, observed: npt.NDArray[Any], expected: npt.NDArray[Any]) -> None:
        stat, pv, dof = _chi_square(observed, expected)
        self.raw.append((name, stat, pv, f"chi-square {stat:.4g} on {dof} degrees of freedom"))

    def scaled_chi_square(self, name: str, counts: npt.NDArray[Any], scale: float) -> None:
        """``sum (x_i - mean)^2 / scale`` against chi-square(len - 1): bins whose covariance is
        ``scale * (I - J/len)`` (subset draws, whose bins are negatively correlated)."""
        dof = len(counts) - 1
        stat = float(np.sum((counts - counts.mean()) ** 2) / scale) if scale > 0 else 0.0
        pv = float(stats.chi2.sf(stat, dof)) if scale > 0 else 1.0
        self.raw.append((name, stat, pv, f"chi-square {stat:.4g} on {dof} degrees of freedom"))


def _rows(col: _Collector, rows: npt.NDArray[np.int64], k: int) -> None:
    if k > 1:
        n = rows.size
        col.chi_square("row uniform over k", np.bincount(rows, minlength=k), np.full(k, n / k))


def _bit_checks(
    col: _Collector, bits: npt.NDArray[np.bool_], cells: npt.NDArray[np.int64], p: float, q: float
) -> None:
    """CMS / OUE: the true bit Bernoulli(p), every other Bernoulli(q), independently."""
    n, m = bits.shape
    at = np.arange(n)
    true_bits = bits[at, cells]
    col.binomial("true bit is 1", int(true_bits.sum()), n, p)
    others = bits.copy()
    others[at, cells] = False
    other_ones = others.sum(axis=1)
    col.binomial("other bits are 1", int(other_ones.sum()), n * (m - 1), q)
    # per column: each other bit of column c is Bernoulli(q); the numbers of trials differ
    trials = n - np.bincount(cells, minlength=m)
    ones = others.sum(axis=0)
    keep = trials > 0
    z2 = (ones[keep] - trials[keep] * q) ** 2 / (trials[keep] * q * (1 - q))
    stat = float(z2.sum())
    dof = int(keep.sum())
    col.raw.append(
        ("each other column at rate q", stat, float(stats.chi2.sf(stat, dof)),
         f"chi-square {stat:.4g} on {dof} degrees of freedom")
    )  # fmt: skip
    # independence: other ones per report ~ Binomial(m - 1, q)
    expected = stats.binom.pmf(np.arange(m), m - 1, q) * n
    col.chi_square("other ones per report binomial", np.bincount(other_ones, minlength=m), expected)


def evaluate(case: Case, payloads: Sequence[bytes]) -> list[tuple[str, float, float, str]]:
    """The (check, statistic, p-value, detail) of ``case``'s payloads, before Bonferroni.

    Raises ``ConformanceError`` if a payload is invalid or their number is wrong.
    """
    mech = _reference(case)
    if len(payloads) != case.count:
        raise ConformanceError(
            f"case {case.name}: the client sent {len(payloads)} payloads for count {case.count}"
        )
    codec = PayloadCodec.for_mechanism(mech)
    batch = codec.decode_batch(payloads)
    if batch.rejected:
        position, reason = batch.rejected[0]
        raise ConformanceError(
            f"case {case.name}: payload {position} ({payloads[position].hex()}) is invalid: "
            f"{reason} (schemas/payloads.md); {len(batch.rejected)} of {len(payloads)} invalid"
        )
    reports = batch.reports
    rows, values = reports.rows.astype(np.int64), reports.values
    col = _Collector(case.name)
    n = len(rows)
    if isinstance(mech, OptimizedUnaryEncoding):
        cells = np.full(n, int(mech.encode([case.item])[0]), dtype=np.int64)
        _bit_checks(col, unpack_bits(values, mech.m), cells, mech.p, mech.q)
        return col.raw
    assert isinstance(mech, SketchMechanism)
    k, m = mech.k, mech.m
    _rows(col, rows, k)
    family = HashFamily(mech.seed, k, m)
    cells = family.hash_rows(rows, np.full(n, item_key(case.item), dtype=np.uint64))
    name = mech.name
    if name == "cms":
        p = float(mech.params()["p"])
        _bit_checks(col, unpack_bits(values, m), cells, p, 1.0 - p)
    elif name == "hcms":
        cols, signs = values[:, 0].astype(np.int64), values[:, 1].astype(np.int64)
        col.chi_square("Hadamard coordinate uniform over m", np.bincount(cols, minlength=m),
                       np.full(m, n / m))  # fmt: skip
        kept = int(np.sum(signs == hadamard_entries(cols, cells)))
        col.binomial("sign kept", kept, n, float(mech.params()["p"]))
    elif name == "rrcms":
        vals = values[:, 0].astype(np.int64)
        truth = vals == cells
        col.binomial("true value kept", int(truth.sum()), n, float(mech.params()["p"]))
        # a lie is uniform over the other m - 1 values: its offset (v - cell - 1) mod m is
        # uniform over [0, m - 1)
        offsets = (vals[~truth] - cells[~truth] - 1) % m
        lies = int((~truth).sum())
        observed = np.bincount(offsets, minlength=m - 1)[: m - 1]
        col.chi_square(
            "a changed value uniform over the others", observed, np.full(m - 1, lies / (m - 1))
        )
    else:  # gcms, ocms
        assert isinstance(mech, GeneralizedCountMeanSketch)
        indices = values.astype(np.int64)
        hit = (indices == cells[:, None]).any(axis=1)
        col.binomial("true index included", int(hit.sum()), n, mech.inclusion)
        # every other index: its offset (x - cell - 1) mod m over [0, m - 1); per report a
        # uniform subset of size t (s - 1 with the true index, s without)
        others = indices[indices != cells[:, None]].reshape(-1)
        owner = np.repeat(cells, indices.shape[1])[(indices != cells[:, None]).reshape(-1)]
        offsets = (others - owner - 1) % m
        counts = np.bincount(offsets, minlength=m - 1)[: m - 1].astype(np.float64)
        big_m, s = m - 1, mech.size
        t = np.where(hit, s - 1, s).astype(np.float64)
        scale = float(np.sum(t * (big_m - t)) / (big_m * (big_m - 1)))
        col.scaled_chi_square("other indices uniform over the others", counts, scale)
    return col.raw


# ---- running a client ----------------------------------------------------------------------------
def _exchange(proc: subprocess.Popen[str], request: dict[str, Any], case: str) -> list[bytes]:
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None
    try:
        stdin.write(json.dumps(request, ensure_ascii=False) + "\n")
        stdin.flush()
    except (BrokenPipeError, OSError):
        raise ConformanceError(f"case {case}: the client closed its stdin (did it exit?)") from None
    line = stdout.readline()
    if not line:
        raise ConformanceError(
            f"case {case}: the client exited or closed stdout without answering; run it by hand "
            f"with the request from docs/conformance.md to see why"
        )
    try:
        answer = json.loads(line)
    except ValueError:
        raise ConformanceError(
            f"case {case}: the client's answer is not one JSON line: {line[:80]!r}"
        ) from None
    if not isinstance(answer, dict):
        raise ConformanceError(f"case {case}: the client's answer is not a JSON object")
    if "error" in answer:
        raise ConformanceError(f"case {case}: the client refused: {answer['error']}")
    payloads = answer.get("payloads")
    if not isinstance(payloads, list) or not all(isinstance(p, str) for p in payloads):
        raise ConformanceError(
            f'case {case}: the answer needs "payloads", a list of hex strings (docs/conformance.md)'
        )
    try:
        return [bytes.fromhex(p) for p in payloads]
    except ValueError:
        raise ConformanceError(f"case {case}: a payload is not hex") from None


def run_conformance(
    client: str | Sequence[str],
    *,
    cases: Sequence[Case] | None = None,
    alpha: float = DEFAULT_ALPHA,
    log: IO[str] | None = None,
) -> ConformanceResult:
    """Run ``client`` (a shell-style command line or an argv) through ``cases`` (default:
    ``default_cases()``) and test every output distribution at family-wise level ``alpha``."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    cases = tuple(default_cases() if cases is None else cases)
    argv = shlex.split(client) if isinstance(client, str) else list(client)
    if not argv:
        raise ConformanceError(
            "the client command is empty; pass the program that speaks the protocol, e.g. "
            "'python -m ldpipe.producers.conformance_client'"
        )
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8"
        )
    except OSError as exc:
        raise ConformanceError(f"cannot start the client {argv[0]!r}: {exc.strerror}") from None
    raw: list[tuple[str, tuple[str, float, float, str]]] = []
    try:
        for case in cases:
            request = {"config": device_config(case), "item": case.item, "count": case.count}
            payloads = _exchange(proc, request, case.name)
            found = evaluate(case, payloads)
            raw.extend((case.name, item) for item in found)
            if log is not None:
                log.write(f"{case.name}: {len(payloads)} payloads, {len(found)} checks\n")
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    level = alpha / max(1, len(raw))
    checks = tuple(
        Check(case, name, stat, pv, level, detail) for case, (name, stat, pv, detail) in raw
    )
    return ConformanceResult(alpha, checks)
