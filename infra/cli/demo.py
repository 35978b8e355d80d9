"""``ldpipe demo``: the whole pipeline on this machine, end to end, in a minute or two.

It starts the embedded broker, generates a key pair in a temporary directory, creates the
topics, starts a shuffler, two aggregators and the front door (``ldpipe issuer`` and ``ldpipe
gateway``) as real processes, has simulated devices report their favourite emoji (Zipf over the
emoji names in Unicode's main blocks) through the front door over HTTP with the Python device
library — a Privacy Pass token per report, the population sharing a few attested identities
(``demo_front_door.py``) — shows what the gateway refuses (a forged token, a batch cut short, a
replay) and, as an attacker who can write the reports topic, publishes a few malformed reports
straight to Kafka, which the shuffler dead-letters. It waits until the sketch store holds every
accepted report, queries the top items and prints each estimate with its 95% interval beside
the true count, and a line of the front door's counters. It stops everything it started.

Discovery (GCMS §6.2) runs beside it: a few devices hold planted words that are not emoji names
(``PLANTED``), every device also sends a discovery report for its item through the gateway
(use case ``<name>.discovery``, a token of its own quota, the tag key the demo provisioned), and
the discovery shuffler, aux server and server record the words that pass the threshold. The
demo prints the discovered words outside the dictionary with their noisy counts from the aux
releases, their estimates from the frequency sketch and their true counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from confluent_kafka import Producer

from ldpipe.aggregator.query import query_use_case
from ldpipe.infra.cli.demo_env import demo_broker, progress
from ldpipe.infra.cli.demo_front_door import (
    IDENTITIES,
    PROBE_REPORTS,
    REPLAY_PROBE,
    front_door_counts,
    identity_quota,
    probe_front_door,
)
from ldpipe.infra.cli.demo_windows import (
    COUNT_ONLY_DEADLINE_SECONDS,
    WindowPlan,
    fill_last_windows,
)
from ldpipe.infra.cli.pipeline import LocalPipeline, PipelineError, PipelineSettings
from ldpipe.infra.cli.produce_gateway import GatewayRun, provisioned_identities, send_devices
from ldpipe.infra.gateway.rules import discovery_use_case
from ldpipe.infra.runtime.dead_letters import count_dead_letters, read_dead_letters
from ldpipe.infra.runtime.kafka import produce
from ldpipe.infra.runtime.ledger_io import read_ledger
from ldpipe.infra.storage.discovery_store import open_discovery_store
from ldpipe.producers.client import DeviceClient
from ldpipe.producers.datasets import Population, dictionary_population
from ldpipe.producers.loadgen import Stream
from ldpipe.schemas.config import UseCase
from ldpipe.schemas.discovery.client import DiscoveryClient
from ldpipe.schemas.discovery.exceptions import DiscoveryRejection
from ldpipe.schemas.discovery.item import normalize_item
from ldpipe.schemas.discovery_settings import (
    discovery_config,
    release_parameters,
)
from ldpipe.schemas.privacy.ledger import WindowRecord

__all__ = ["add_parser", "run"]

#: the demo's devices by default: each report costs a token (~1 ms of the issuer's CPU, as
#: much again on the device), so 20,000 keep the demo to a minute or two on 2 cores; the SFP
#: demo, whose devices publish straight to Kafka, keeps 50,000 (its puzzle needs them)
DEVICES = 20_000
SFP_DEVICES = 50_000
WINDOWS = 5  # the demo's devices fill this many shuffle windows (the last topped up)
#: how long a wait may see nothing move before the demo gives up (a slow machine that keeps
#: moving is waited for however long it takes)
STALL_SECONDS = 300.0
#: identities upload at once (threads): the issuer signs for one while another seals
SENDERS = 3
# words outside the emoji dictionary and the share of devices holding each. A discovery window
# holds ~n/5 reports, so a word is in it ~share*n/5 times: with the default n = 20,000 that is
# 120, 80 and 60 (binomial sd <= 11; 50,000 devices: 300, 200, 150) against the threshold
# T = 21 of (epsilon, delta) = (2, 1e-9) with Laplace noise b = 1, so each word passes in
# every window with near certainty (the smallest misses with probability < 1e-6 at n = 20,000)
PLANTED = {"bubble tea": 0.03, "pickleball": 0.02, "rizz": 0.015}
_PROBE_ITEM = "GRINNING FACE"  # the probes' reports (two of them are counted)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run the whole pipeline locally (broker, shuffler, aggregators, query)"
    )
    p.add_argument("--mechanism", default="cms", help="cms, hcms, gcms, ocms or rrcms")
    p.add_argument("--epsilon", type=float, default=4.0)
    p.add_argument(
        "--n",
        type=int,
        help=f"simulated devices (default {DEVICES:,}; {SFP_DEVICES:,} with --protocol sfp)",
    )
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--keep", help="keep the work directory here instead of a temporary one")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--protocol",
        choices=["aux", "sfp"],
        default="aux",
        help="how new items are discovered: the aux-server protocol beside an emoji use case "
        "(default), or Apple's SFP on a word use case",
    )
    p.set_defaults(run=run)


def _bad_reports(client: DeviceClient) -> list[tuple[str, bytes]]:
    """Malformed reports a hostile or broken device might send, one of each kind, and an
    out-of-date device's report without the shuffler layer (``single_layer``)."""
    good = client.report("GRINNING FACE")
    tampered = bytearray(good)
    tampered[-5] ^= 0x01
    bare = dataclasses.replace(client, shuffler_key=None).report("GRINNING FACE")
    return [
        ("random bytes", os.urandom(60)),
        ("truncated envelope", good[: len(good) // 2]),
        ("tampered ciphertext", bytes(tampered)),
        ("unsupported version", good[:3] + b"\x09" + good[4:]),
        ("empty message", b""),
        ("single-layer envelope", bare),
    ]


def run(args: argparse.Namespace) -> int:
    if args.n is None:
        args.n = SFP_DEVICES if args.protocol == "sfp" else DEVICES
    if args.n < 1000:
        raise ValueError(f"--n must be at least 1000 devices, got {args.n}")
    if args.protocol == "sfp":
        from ldpipe.infra.cli.demo_sfp import run_sfp

        return run_sfp(args)
    started = time.perf_counter()
    say = progress(args)
    options: dict[str, Any] = {"k": 1024, "m": 1024} if args.mechanism != "rrcms" else {"k": 16384}
    # count-only windows (demo_windows.py): each releases at exactly plan.max_reports, and
    # more devices fill the last one, so no report is held back below n_min at any speed
    # (the probes' two reports the shuffler admits count too: without them, two reports past
    # the last window would wait for a whole window of top-up devices)
    plan = WindowPlan.split(args.n + PROBE_REPORTS, WINDOWS)
    # N tokens per identity and period: the population, the devices that top up the last
    # window (fewer than a window) and the probes
    quota = identity_quota(args.n, plan.max_reports)
    with demo_broker(args, say) as (workdir, broker):
        settings = PipelineSettings(
            mechanism=args.mechanism,
            epsilon=args.epsilon,
            mechanism_options=options,
            n_min=plan.n_min,
            max_reports=plan.max_reports,
            max_wait_seconds=COUNT_ONLY_DEADLINE_SECONDS,
            # oue answers only for its dictionary: nothing to discover
            discovery=args.mechanism != "oue",
            front_door=True,
            contribution_limit=quota,
        )
        pipe = LocalPipeline(workdir, broker.bootstrap_servers, settings)
        pipe.create_topics()
        shuffler = pipe.shuffler_key_pair
        say(
            f"keys      {workdir / 'keys'} (HPKE X25519, key id {pipe.key_pair.key_id}); "
            f"the shuffler's in {workdir / 'shuffler-keys'} (key id "
            f"{shuffler.key_id if shuffler else '-'}): devices seal every report to both"
        )
        pipe.start_shuffler()
        for i in range(2):
            pipe.start_aggregator(i)
        say("services  shuffler + 2 aggregators started")
        if pipe.use_case.discovery is not None:
            pipe.start_discovery()
            params = release_parameters(pipe.use_case)
            say(
                f"services  discovery shuffler + aux server + server started "
                f"(threshold T={params.threshold:.1f}, Laplace b={params.laplace_scale:g})"
            )
        pipe.start_issuer()
        pipe.start_gateway()
        say(
            f"front door issuer {pipe.issuer_url} + gateway {pipe.gateway_url} started: "
            f"{IDENTITIES} attested identities, {quota:,} tokens each per period "
            f"(contribution_limit)"
        )
        say(f"windows   {plan.describe()}")
        try:
            return _drive(args, pipe, plan, started, say)
        finally:
            pipe.stop_all()


def _drive(
    args: argparse.Namespace,
    pipe: LocalPipeline,
    plan: WindowPlan,
    started: float,
    say: Callable[[str], None],
) -> int:
    with provisioned_identities(pipe.config.issuer.database, IDENTITIES, "demo") as credentials:
        return _drive_devices(args, pipe, plan, started, say, credentials)


def _drive_devices(
    args: argparse.Namespace,
    pipe: LocalPipeline,
    plan: WindowPlan,
    started: float,
    say: Callable[[str], None],
    credentials: list[str],
) -> int:
    uc = pipe.use_case
    assert uc.dictionary_items is not None
    discovering = uc.discovery is not None
    planted = _planted(uc, args.n) if discovering else {}
    population = _population(uc.dictionary_items, planted, args.n, args.seed)
    client = pipe.device_client()
    discovery: DiscoveryClient | None = pipe.discovery_client() if discovering else None
    say(
        f"devices   {args.n:,} report their favourite of {len(uc.dictionary_items):,} emoji "
        f"({uc.mechanism.name}, epsilon={uc.mechanism.effective_epsilon:.3g} per report) "
        f"through the gateway over HTTP, a token each, sharing {len(credentials)} identities"
    )
    if planted:
        say(
            "discovery "
            + ", ".join(f"{n:,} hold {word!r}" for word, n in planted.items())
            + f"; every device also sends a discovery report through the gateway "
            f"({discovery_use_case(uc.name)}, a token each)"
        )
    # what a hostile or broken device gets from the gateway, and an attacker who can write
    # the reports topic: sent first, so each is read in a window the devices' reports fill;
    # the records they leave on the reports topic lie between these offsets
    before = pipe.end_offsets()
    probed = probe_front_door(pipe.gateway_url, uc.name, credentials[0], _PROBE_ITEM)
    for probe in probed:
        say(f"gateway   {probe.line()}")
    bad = _send_bad(pipe, _bad_reports(client))
    after = pipe.end_offsets()
    topic = uc.topics.reports
    hostile = [f"{topic}:{p}:{o}" for p, end in after.items() for o in range(before.get(p, 0), end)]
    say(
        f"attacker  {len(bad)} malformed reports published straight to {uc.topics.reports} "
        f"(whoever can write the topic; the shuffler dead-letters them)"
    )
    produce_started = time.perf_counter()
    devices = population.device_items()
    np.random.default_rng(np.random.SeedSequence([args.seed, 0x6A7E])).shuffle(devices)
    device_items = [population.items[i] for i in devices]
    sent = _send(pipe, credentials, device_items, say)
    discovery_topic = uc.discovery.topics.reports if uc.discovery is not None else ""
    discovery_sent = _send_discovery(pipe, credentials, device_items, say) if discovering else 0
    reports_topic = uc.topics.reports
    say(
        f"produced  {sent.accepted:,} reports"
        + (f" and {discovery_sent:,} discovery reports" if discovering else "")
        + f" through the gateway in {time.perf_counter() - produce_started:.1f} s"
    )
    # what the shuffler admits into windows: the devices' reports, the probes' new reports
    # and any malformed one it cannot tell from a good one (the aggregators refuse those later)
    admitted = sent.accepted + len(hostile) - _refused_by_shuffler(pipe, hostile)
    missing = {reports_topic: plan.missing(admitted)}
    if discovering:
        missing[discovery_topic] = plan.missing(discovery_sent)

    def through_gateway(extra: Population) -> int:
        items = [extra.items[i] for i in extra.device_items()]
        return _send(pipe, credentials, items, say).accepted

    def discovery_through_gateway(extra: Population) -> int:
        items = [extra.items[i] for i in extra.device_items()]
        return _send_discovery(pipe, credentials, items, say)

    topped = fill_last_windows(
        pipe.kafka,
        [(reports_topic, client.reports), *_streams(discovery, uc)],
        population,
        missing,
        seed=args.seed,
        senders={reports_topic: through_gateway, discovery_topic: discovery_through_gateway},
    )
    if topped.devices:
        say(f"top-up    {topped.describe(plan)}")
    produced = sent.accepted + PROBE_REPORTS + topped.by_topic.get(reports_topic, 0)
    truth = {population.items[i]: int(c) for i, c in enumerate(population.counts) if c}
    truth[_PROBE_ITEM] = truth.get(_PROBE_ITEM, 0) + PROBE_REPORTS
    for item, count in topped.true_counts.get(reports_topic, {}).items():
        truth[item] = truth.get(item, 0) + count
    pipe.wait_for_count(
        lambda: pipe.aggregated() + count_dead_letters(pipe.kafka, uc.topics.dlq).count(),
        produced - PROBE_REPORTS + len(hostile),
        "the aggregators to seal every report",
        stall=STALL_SECONDS,
    )
    metrics_url = f"http://127.0.0.1:{pipe.gateway_metrics_port}/metrics"
    front = front_door_counts(metrics_url, pipe.issuer_url, uc.name)
    front_discovery = (
        front_door_counts(metrics_url, pipe.issuer_url, discovery_use_case(uc.name))
        if discovering
        else None
    )
    dead = count_dead_letters(pipe.kafka, uc.topics.dlq)
    # the top emoji: the dictionary only (the discovered words have their own section)
    query = query_use_case(uc, top=args.top, discovered=False)
    discovered: list[dict[str, Any]] = []
    if discovering:
        discovery_reports = discovery_sent
        _wait_for_discovery(pipe, discovery_reports + topped.by_topic.get(discovery_topic, 0))
        discovered = _discovered(uc, truth)
    items: list[dict[str, Any]] = [
        {
            "item": row.item,
            "true_count": truth.get(row.item, 0),
            "estimate": row.estimate,
            "std_error": row.std_error,
            "ci95": [row.low, row.high],
        }
        for row in query.items
    ]
    seconds = time.perf_counter() - started
    summary = {
        "mechanism": uc.mechanism.name,
        "epsilon": uc.mechanism.effective_epsilon,
        "params": uc.mechanism.params(),
        "reports_produced": produced,
        "top_up_devices": topped.by_topic.get(uc.topics.reports, 0),
        "malformed_produced": len(bad),
        # copies of an upload the stateless gateway took again: the shuffler refuses each
        "replays_produced": sum(p.accepted for p in probed if p.what.startswith(REPLAY_PROBE)),
        "reports_aggregated": pipe.aggregated(),
        "reports_rejected": dead.count(),
        "front_door": {
            "gateway": pipe.gateway_url,
            "identities": len(credentials),
            "tokens_per_identity": uc.shuffle.contribution_limit,
            **front.as_json(),
            "probes": [probe.as_json() for probe in probed],
            # the discovery reports' use case <name>.discovery: its own tokens and counters
            "discovery": front_discovery.as_json() if front_discovery is not None else None,
        },
        "rejections": {f"{s}:{r}": n for (s, r), n in sorted(dead.by_reason.items())},
        "windows": query.windows,
        "writers": query.writers,
        "items": items,
        "discovered": discovered,
        "seconds": seconds,
    }
    if args.json:
        json.dump(summary, sys.stdout)
        print()
        return 0
    print(
        f"\nTop {args.top} emoji estimated from {query.reports:,} randomized reports "
        f"(95% interval) against the truth:"
    )
    for row in items:
        lo, hi = row["ci95"]
        print(
            f"  {row['item'][:34]:<34} {row['estimate']:>8.0f} ± {1.96 * row['std_error']:>5.0f}"
            f"   [{lo:>7.0f}, {hi:>7.0f}]   true {row['true_count']:>6}"
        )
    inside = sum(r["ci95"][0] <= r["true_count"] <= r["ci95"][1] for r in items)
    print(f"\n{inside} of {len(items)} intervals hold the true count.")
    if discovering:
        print(
            "\nDiscovered (not in the dictionary): noisy count released by the aux server, "
            "estimate ± 95% from the frequency sketch, true count:"
        )
        for row in discovered:
            print(
                f"  {row['item'][:34]:<34} noisy {row['reported_count']:>6}   "
                f"{row['estimate']:>8.0f} ± {1.96 * row['std_error']:>5.0f}"
                f"   true {row['true_count']:>6}"
            )
        if not discovered:
            print("  (none passed the threshold; more devices per word would)")
    refusals = ", ".join(f"{r} {n}" for r, n in sorted(front.refused.items())) or "none"
    print(
        f"front door {front.accepted:,} reports accepted by the gateway, "
        f"{front.tokens_issued:,} tokens issued to {len(credentials)} identities; reports "
        f"refused: {refusals}; batches refused whole: {front.bad_requests}"
        + (
            f"; discovery reports ({discovery_use_case(uc.name)}): "
            f"{front_discovery.accepted:,} accepted, {front_discovery.tokens_issued:,} tokens"
            if front_discovery is not None
            else ""
        )
    )
    print(
        f"pipeline  {produced:,} produced, {summary['reports_aggregated']:,} aggregated, "
        f"{dead.count()} rejected to {uc.topics.dlq}: "
        + ", ".join(f"{r} ({n})" for (_, r), n in sorted(dead.by_reason.items()))
    )
    print(
        f"store     {uc.store.uri} ({len(query.writers)} writers)"
        + ("" if args.keep else " — temporary, removed on exit; --keep DIR keeps them")
    )
    print("metrics   start services with --metrics-port; `ldpipe query --serve` exports estimates")
    if args.keep:  # the files outlive the in-memory broker: what can still be read from them
        config = pipe.config_path
        print(f"again     ldpipe query --config {config} --top 20")
        if uc.discovery is not None:
            print(f"          ldpipe discoveries --config {config}")
    print(f"done in {seconds:.1f} s")
    return 0


def _planted(use_case: UseCase, n: int) -> dict[str, int]:
    """Planted words (normalized with the use case's item rules) -> devices holding each."""
    rules = discovery_config(use_case).rules
    dictionary = set(use_case.dictionary_items or ())
    planted = {normalize_item(word, rules): round(share * n) for word, share in PLANTED.items()}
    assert not set(planted) & dictionary, "planted words must be outside the dictionary"
    return {word: count for word, count in planted.items() if count}


def _population(
    dictionary: tuple[str, ...], planted: dict[str, int], n: int, seed: int
) -> Population:
    """Zipf(1.1) over the emoji for the devices that hold no planted word."""
    rest = dictionary_population(dictionary, 1.1, n - sum(planted.values()), seed)
    counts = np.concatenate([rest.counts, np.array(list(planted.values()), dtype=np.int64)])
    return Population(rest.items + tuple(planted), counts)


def _streams(discovery: DiscoveryClient | None, use_case: UseCase) -> list[Stream]:
    """With discovery, the discovery stream ``fill_last_windows`` tops up (through the
    gateway, :func:`_send_discovery`; none for an item the rules refuse)."""
    if discovery is None or use_case.discovery is None:
        return []
    encode = discovery.encode_many

    def discovery_reports(items: Sequence[str], _rng: object) -> list[bytes | None]:
        return [r if isinstance(r, bytes) else None for r in encode(items)]

    return [(use_case.discovery.topics.reports, discovery_reports)]


def _send(
    pipe: LocalPipeline, credentials: list[str], items: list[str], say: Callable[[str], None]
) -> GatewayRun:
    """One report per item through issuer and gateway (``ldpipe produce --gateway``'s
    ``send_devices``); every one must be accepted (the quota covers the demo)."""
    run = send_devices(
        pipe.gateway_url,
        pipe.use_case.name,
        items,
        credentials,
        workers=SENDERS,
        on_progress=lambda run: say(f"sending   {run.devices:,} of {len(items):,}: {run.line()}"),
    )
    if run.accepted != len(items):
        raise PipelineError(
            f"the front door did not take every report: {run.line()}; the logs of the issuer "
            f"and the gateway are in {pipe.workdir}"
        )
    return run


#: the reasons a discovery item is refused on the device, before any token is spent
_ITEM_REASONS = frozenset(reason.value for reason in DiscoveryRejection)


def _send_discovery(
    pipe: LocalPipeline, credentials: list[str], items: list[str], say: Callable[[str], None]
) -> int:
    """One discovery report per item through issuer and gateway (use case
    ``<name>.discovery``, the demo's tag key); every item the rules take must be accepted.
    The number accepted."""
    name = discovery_use_case(pipe.use_case.name)
    run = send_devices(
        pipe.gateway_url,
        name,
        items,
        credentials,
        workers=SENDERS,
        on_progress=lambda run: say(f"sending   {run.devices:,} of {len(items):,}: {run.line()}"),
        tag_key=pipe.tag_key,
    )
    item_refusals = sum(n for reason, n in run.refused.items() if reason in _ITEM_REASONS)
    if run.accepted + item_refusals != len(items):
        raise PipelineError(
            f"the front door did not take every discovery report: {run.line()}; the logs of "
            f"the issuer and the gateway are in {pipe.workdir}"
        )
    return run.accepted


def _send_bad(pipe: LocalPipeline, bad: list[tuple[str, bytes]]) -> list[str]:
    """Publish the malformed reports before the devices' (so every one of them is read in a
    window the devices' reports fill); their positions, as dead letters name their source."""
    producer = Producer(pipe.kafka.producer_config())
    topic = pipe.use_case.topics.reports
    where: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            where.append(f"{msg.topic()}:{msg.partition()}:{msg.offset()}")

    for i, (_, value) in enumerate(bad):
        produce(producer, topic, value=value, key=f"bad-{i}".encode(), on_delivery=on_delivery)
    producer.flush(30)
    if len(where) != len(bad):
        raise PipelineError(f"the broker refused {len(bad) - len(where)} malformed reports")
    return where


def _refused_by_shuffler(pipe: LocalPipeline, sources: list[str]) -> int:
    """How many of the reports at ``sources`` the shuffler refused (dead-lettered), once it has
    committed past every one of them."""
    at = [(int(p), int(o)) for p, o in (s.rsplit(":", 2)[1:] for s in sources)]
    committed: dict[int, int] = {}

    def passed() -> bool:
        committed.update(pipe.shuffler_committed())
        return all(committed.get(p, 0) > o for p, o in at)

    pipe.wait_until(
        passed,
        STALL_SECONDS,
        "the shuffler to read the malformed reports",
        poll=0.5,
        progress=lambda: sum(committed.values()),
    )
    wanted = set(sources)
    letters = read_dead_letters(pipe.kafka, pipe.use_case.topics.dlq)
    return len({d.source for d in letters if d.stage == "shuffler" and d.source in wanted})


def _wait_for_discovery(pipe: LocalPipeline, reports: int) -> None:
    """Until the discovery shuffler has released every discovery report in its windows and the
    store holds a recorded window for each of them."""
    uc = pipe.use_case
    shuffled: list[WindowRecord] = []

    def released() -> int:
        ledger = read_ledger(pipe.kafka, f"{uc.name}.discovery", timeout=10)
        shuffled[:] = [r for r in ledger if isinstance(r, WindowRecord)]
        return sum(r.n for r in shuffled)

    pipe.wait_for_count(
        released, reports, "the discovery shuffler's windows", stall=STALL_SECONDS, poll=1.0
    )
    store = open_discovery_store(uc)
    pipe.wait_for_count(
        lambda: len(store.windows(uc.name)),
        len(shuffled),
        "the discovery store",
        stall=STALL_SECONDS,
    )


def _discovered(use_case: UseCase, truth: dict[str, int]) -> list[dict[str, Any]]:
    """Discovered items outside the dictionary (nor a dictionary item cut to the item rules):
    noisy counts summed over the windows that released them, frequency-sketch estimates."""
    rules = discovery_config(use_case).rules
    dictionary = set(use_case.dictionary_items or ())
    dictionary |= {normalize_item(item, rules) for item in dictionary}
    store = open_discovery_store(use_case)
    noisy: dict[str, int] = {}
    for window in store.iter_windows(use_case.name):
        for found in window.discoveries:
            if found.item not in dictionary:
                noisy[found.item] = noisy.get(found.item, 0) + found.noisy_count
    if not noisy:
        return []
    rows = {row.item: row for row in query_use_case(use_case, items=list(noisy)).items}
    out = [
        {
            "item": item,
            "true_count": truth.get(item, 0),
            "reported_count": count,
            "estimate": rows[item].estimate,
            "std_error": rows[item].std_error,
        }
        for item, count in noisy.items()
    ]
    return sorted(out, key=lambda row: -row["estimate"])
