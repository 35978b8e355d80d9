"""Populations of simulated devices, from a dataset spec.

* ``zipf:d=<items>,a=<exponent>``: N draws (one per device) from ``P(rank r) ~ r^-a`` over d
  items named ``zipf-000001`` ... (rank 1 is the most frequent), drawn once from the seed.
* ``file:<path>``: one item per line (one device each), or ``item,count`` lines. With ``n``
  given and different from the file's total, N devices are drawn from the file's distribution.

>>> pop = load_population("zipf:d=1000,a=2", n=5000, seed=1)
>>> pop.n, len(pop.items)
(5000, 1000)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = [
    "DatasetError",
    "Population",
    "dictionary_population",
    "load_population",
    "parse_spec",
]


_MAX_ITEMS = 50_000_000  # a population's domain must fit in memory several times over
_MAX_COUNT = 2**53  # counts beyond this cannot be simulated (and sum safely in int64)


class DatasetError(ValueError):
    """A dataset spec or file that cannot be read; the message says what to fix."""


@dataclass(frozen=True, eq=False)
class Population:
    """Distinct items (the domain) and how many devices hold each."""

    items: tuple[str, ...]
    counts: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        if len(self.items) != len(self.counts):
            raise DatasetError("population items and counts differ in length")

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def device_items(self) -> npt.NDArray[np.int64]:
        """Index into ``items`` of every device's item (length n)."""
        return np.repeat(np.arange(len(self.items), dtype=np.int64), self.counts)

    def top(self, count: int) -> npt.NDArray[np.int64]:
        """Indices of the ``count`` most frequent items (ties broken by position)."""
        order = np.argsort(-self.counts, kind="stable")
        return order[:count]

    def sum_sq(self) -> float:
        return float(np.sum(self.counts.astype(np.float64) ** 2))


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("zipf", "file"):
        raise DatasetError(
            f"dataset spec {spec!r} not understood; use 'zipf:d=<items>,a=<exponent>' "
            f"or 'file:<path>'"
        )
    if kind == "file":
        return kind, {"path": rest}
    fields: dict[str, str] = {}
    for part in filter(None, rest.split(",")):
        key, eq, value = part.partition("=")
        if not eq:
            raise DatasetError(f"zipf spec field {part!r} needs key=value, e.g. d=1000")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - {"d", "a"}
    if unknown or not {"d", "a"} <= set(fields):
        raise DatasetError(f"zipf spec needs exactly d=<items> and a=<exponent>, got {rest!r}")
    return kind, fields


def _zipf(fields: dict[str, str], n: int | None, rng: np.random.Generator) -> Population:
    try:
        d, a = int(fields["d"]), float(fields["a"])
    except ValueError as exc:
        raise DatasetError(f"zipf spec values must be numbers: {exc}") from None
    if not 1 <= d <= _MAX_ITEMS or not np.isfinite(a) or a < 0:
        raise DatasetError(
            f"zipf needs 1 <= d <= {_MAX_ITEMS:,} and a finite a >= 0, got d={d}, a={a}"
        )
    if n is None or n < 1:
        raise DatasetError("a zipf dataset needs --n, the number of devices (>= 1)")
    weights = np.arange(1, d + 1, dtype=np.float64) ** -a
    counts = rng.multinomial(n, weights / weights.sum()).astype(np.int64)
    width = max(6, len(str(d)))
    return Population(tuple(f"zipf-{r:0{width}d}" for r in range(1, d + 1)), counts)


def _file(path_text: str, n: int | None, rng: np.random.Generator) -> Population:
    path = Path(path_text)
    if not path.is_file():
        raise DatasetError(f"dataset file {path} does not exist; give an existing file:<path>")
    tally: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"dataset file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
            f"save it as UTF-8"
        ) from None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        item, comma, count_text = line.rpartition(",")
        count_text = count_text.strip()
        if comma and count_text.isascii() and count_text.isdigit():
            if len(count_text) > 16 or int(count_text) > _MAX_COUNT:
                raise DatasetError(f"{path}:{number}: count {count_text[:20]} is above 2^53")
            count = int(count_text)
        else:
            item, count = line, 1
        if not item:
            raise DatasetError(f"{path}:{number}: empty item; each line is 'item' or 'item,count'")
        tally[item] = tally.get(item, 0) + count
    if not tally:
        raise DatasetError(f"dataset file {path} has no items")
    items = tuple(tally)
    total = sum(tally.values())
    if total == 0:
        raise DatasetError(f"dataset file {path} has only zero counts; give at least one device")
    if total > _MAX_COUNT:
        raise DatasetError(f"dataset file {path}: the counts sum to more than 2^53")
    counts = np.fromiter(tally.values(), dtype=np.int64)
    if n is not None and n != total:
        if n < 1:
            raise DatasetError(f"--n must be >= 1, got {n}")
        counts = rng.multinomial(n, counts / total).astype(np.int64)
    return Population(items, counts)


def load_population(spec: str, *, n: int | None, seed: int) -> Population:
    """The population a spec describes, drawn reproducibly from ``seed``."""
    kind, fields = parse_spec(spec)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xDA7A]))
    if kind == "zipf":
        return _zipf(fields, n, rng)
    return _file(fields["path"], n, rng)


def dictionary_population(items: tuple[str, ...], exponent: float, n: int, seed: int) -> Population:
    """N devices with Zipf(exponent) popularity over a dictionary, in a seeded random order
    (popularity is not alphabetical)."""
    if n < 1:
        raise DatasetError(f"the number of devices must be >= 1, got {n}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD1C7]))
    weights = np.arange(1, len(items) + 1, dtype=np.float64) ** -exponent
    counts = np.zeros(len(items), dtype=np.int64)
    counts[rng.permutation(len(items))] = rng.multinomial(n, weights / weights.sum())
    return Population(tuple(items), counts)
