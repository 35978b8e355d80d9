"""Shuffle windows a demo always finishes: released by count, the last one filled by more devices.

A shuffler releases a window when it holds ``max_reports``, or at its deadline once it holds
``n_min``, and never with fewer than ``n_min`` (``shuffler/window.py``): a remainder below
``n_min`` waits for more devices. A deployment has them; a demo has a fixed population. With
a deadline, where windows are cut depends on how fast the machine is (a busy machine cuts them
early), so the last one can hold fewer than ``n_min`` and is never released, and the demo waits
for it forever.

The demos therefore make their windows count-only: the deadline is a day, so every window is
released when it holds exactly ``max_reports``, wherever the machine's load puts the reports.
Once every report is sent and the demo knows how many its shuffler admits, more simulated
devices, drawn from the same population, report until the last window is full: what a
deployment waits for, done at once. Every window then holds ``max_reports >= n_min`` reports;
the privacy rule is never relaxed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ldpipe.infra.cli.pipeline import PipelineError
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.datasets import Population
from ldpipe.producers.loadgen import Stream, produce_population

__all__ = ["COUNT_ONLY_DEADLINE_SECONDS", "Sender", "TopUp", "WindowPlan", "fill_last_windows"]

#: sends one report per device of a population some other way than Kafka (the front door);
#: returns the reports accepted
Sender = Callable[[Population], int]

#: the demos' window deadline: longer than any demo, so only the count releases a window
COUNT_ONLY_DEADLINE_SECONDS = 86_400.0


@dataclass(frozen=True)
class WindowPlan:
    """Count-only windows of ``max_reports`` reports each (at least ``n_min``)."""

    n_min: int
    max_reports: int

    @classmethod
    def split(cls, reports: int, windows: int, n_min: int = 1000) -> WindowPlan:
        """``reports`` in ``windows`` windows of equal size (the last filled up to it)."""
        if reports < 1 or windows < 1:
            raise ValueError(f"cannot split {reports} reports into {windows} windows")
        max_reports = math.ceil(reports / windows)
        return cls(min(n_min, max_reports), max_reports)

    def missing(self, admitted: int) -> int:
        """Reports the last window lacks once the shuffler has admitted ``admitted``."""
        return -admitted % self.max_reports

    def describe(self) -> str:
        return (
            f"released at exactly {self.max_reports:,} reports each (n_min {self.n_min:,}; "
            f"no deadline in the demo, so the machine's speed never cuts a window short)"
        )


@dataclass(frozen=True)
class TopUp:
    """What the devices that filled the last windows sent."""

    by_topic: dict[str, int]  # reports delivered to each topic
    true_counts: dict[str, dict[str, int]]  # per topic: item -> devices drawn holding it

    @property
    def devices(self) -> int:
        return max(self.by_topic.values(), default=0)

    def describe(self, plan: WindowPlan) -> str:
        """One line: who reported, to fill which windows, and why."""
        sent = ", ".join(f"{n:,} to {topic}" for topic, n in self.by_topic.items() if n)
        who = "device reports" if self.devices == 1 else "devices report"
        return (
            f"{self.devices:,} more {who} ({sent}) so the last window holds "
            f"{plan.max_reports:,}: a deployment would wait for them"
        )


def fill_last_windows(
    kafka: KafkaSettings,
    streams: Sequence[Stream],
    population: Population,
    missing: Mapping[str, int],
    *,
    seed: int,
    rounds: int = 20,
    senders: Mapping[str, Sender] | None = None,
) -> TopUp:
    """Have more devices of ``population`` send ``missing[topic]`` reports to each stream's
    topic (a stream may send no report for some items, as discovery does for an item its
    rules refuse: more devices are drawn until the count is reached). A topic in ``senders``
    is reached through its sender instead of Kafka (the demo's front door): it sends one
    report per device of the population it is given and returns how many were accepted."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x70B0]))
    shares = population.counts / population.counts.sum()
    by_topic: dict[str, int] = {}
    truth: dict[str, dict[str, int]] = {}
    for stream in streams:
        topic = stream[0]
        need = missing.get(topic, 0)
        sent, counts = 0, np.zeros(len(population.items), dtype=np.int64)
        for _ in range(rounds):
            if sent >= need:
                break
            extra = Population(population.items, rng.multinomial(need - sent, shares))
            if senders is not None and topic in senders:
                sent += senders[topic](extra)
                counts += extra.counts
                continue
            result = produce_population(
                [stream], kafka, extra, seed=int(rng.integers(2**31)), progress=False
            )
            if result.failed:
                raise PipelineError(
                    f"the broker refused {result.failed} of the reports topping up {topic}; "
                    f"is it still running?"
                )
            sent += result.by_topic.get(topic, 0)
            counts += extra.counts
        if sent != need:
            raise PipelineError(
                f"{need} more reports to {topic} were needed and {sent} were sent: too few of "
                f"the population's items send a report of this kind"
            )
        by_topic[topic] = sent
        truth[topic] = {population.items[i]: int(c) for i, c in enumerate(counts) if c}
    return TopUp(by_topic, truth)
