"""Issue 19's Crashes acceptance: kill -9 of the gateway, of the issuer and of the shuffler
while devices upload through the front door.

Real services, each its own process on the embedded broker: ``ldpipe issuer``, ``ldpipe
gateway``, the shuffler and an aggregator (``LocalPipeline``). The load is the Python device
library (``GatewayDevice``): one thread per attested identity, each sending small batches until
the issuer says its quota (N = ``contribution_limit``) is spent. Once a third of the expected
reports is in, the victim is killed with SIGKILL and started again on the same port (the gateway
a second time at a crash point, ``gateway.after_ack``: Kafka acknowledged a batch and the device
was never told); the devices go on (their retries carry them over the gap: a request whose
answer was lost is sent again, byte for byte).

Every answer the devices get is recorded: the reports of a 200 answer that it does not refuse
are *accepted*. At the end:

* the sketch store holds exactly the accepted reports, bit for bit the sketch recomputed offline
  from them (``offline_sketch``): none lost, none counted twice, including the copies a gateway
  produced before it died and the device's retry produced again;
* after the restart, bodies answered 200 *before* the kill are sent once more (a device that
  lost an answer): the gateway takes them, the restarted shuffler refuses them, by the report
  ids and nonces it remembers;
* no identity got more than N reports in, and each is refused a further token: the issuer's
  quota survives its kill.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from ldpipe.infra.cli.pipeline import LocalPipeline
from ldpipe.infra.runtime.kafka import KafkaSettings, read_to_end
from ldpipe.producers.device import DeviceError, GatewayDevice, RetryPolicy
from ldpipe.schemas.upload import MEDIA_TYPE, UploadAnswer, decode_batch
from tests.gateway_helpers import wait_for
from tests.integration.pipeline_helpers import (
    assert_same_sketch,
    live_sketch,
    make_pipeline,
    offline_sketch,
    wait_dead,
)
from tests.issuer_helpers import add_credential

N = 24  # tokens per identity per period (contribution_limit)
IDENTITIES = 6
PER_SEND = 3  # items per send: many small requests, so a kill lands among them
VICTIMS = ("gateway", "issuer", "shuffler")
# the brief's fixed range, 19730-19749: (issuer, gateway) ports per victim
PORTS = {"gateway": (19730, 19731), "issuer": (19732, 19733), "shuffler": (19734, 19735)}
CRASH_AT = "gateway.after_ack:2"  # the 2nd batch Kafka acknowledged, before its answer
# generous enough to carry a device over a restart (a few seconds), full jitter
RETRY = RetryPolicy(attempts=60, base_delay=0.05, max_delay=0.5)


@dataclass
class Ledger:
    """What the devices were told: the envelopes of reports answered 200 and not refused, the
    bodies of those answers, and attempts that got no answer at all."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    accepted: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    attempts: int = 0
    answers: int = 0
    token_attempts: int = 0  # token requests to the issuer, and their answers
    token_answers: int = 0
    refusals: list[str] = field(default_factory=list)  # their details, for the failure message

    def request(self, request: httpx.Request) -> None:
        with self.lock:
            self.attempts += request.url.path.endswith("/reports")
            self.token_attempts += request.url.path.endswith("/token-request")

    def response(self, response: httpx.Response) -> None:
        if response.request.url.path.endswith("/token-request"):
            with self.lock:
                self.token_answers += 1
        if not response.request.url.path.endswith("/reports"):
            return
        response.read()
        with self.lock:
            self.answers += 1
        if response.status_code != 200:
            return
        answer = UploadAnswer.from_json(response.content)
        reports = decode_batch(response.request.content)
        refused = {r.index for r in answer.refused}
        with self.lock:
            now = time.time()
            self.refusals.extend(f"{now:.2f} {r.reason}: {r.detail}" for r in answer.refused)
        taken = [r.envelope for i, r in enumerate(reports) if i not in refused]
        assert len(taken) == answer.accepted, (answer, len(reports))
        with self.lock:
            self.accepted.extend(taken)
            self.bodies.append(response.request.content)

    def count(self) -> int:
        with self.lock:
            return len(self.accepted)


@dataclass
class Outcome:
    """One identity's tally over all its sends."""

    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    undelivered: int = 0
    held: int = 0
    issuer_errors: int = 0
    failure: BaseException | None = None


@dataclass
class Door:
    pipe: LocalPipeline
    issuer: str
    gateway: str


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _start(pipe: LocalPipeline, name: str, door: Door, crash_at: str | None = None) -> None:
    env = {"LDPIPE_CRASH_AT": crash_at} if crash_at else None
    if name == "issuer":
        pipe.start("issuer", ["issuer", "--progress", "0"])
        url = door.issuer
    elif name == "gateway":
        pipe.start("gateway", ["gateway", "--progress", "0"], env=env)
        if crash_at:  # it may reach its crash point before it reports ready
            return
        url = door.gateway
    else:
        pipe.start_shuffler()
        return
    pipe.wait_until(lambda: _ready(url), 60, f"the {name}'s /readyz")


@contextmanager
def front_door(tmp: Path, broker: KafkaSettings, victim: str) -> Iterator[Door]:
    """The issuer and the gateway as ``ldpipe`` processes on fixed ports (a restarted one
    comes back where devices look for it), a shuffler and one aggregator."""
    issuer_port, gateway_port = PORTS[victim]
    pipe = make_pipeline(
        tmp, broker.bootstrap_servers, n_min=1, max_reports=400, max_wait_seconds=0.5,
        contribution_limit=N,
    )  # fmt: skip
    issuer = f"http://127.0.0.1:{issuer_port}"
    gateway = f"http://127.0.0.1:{gateway_port}"
    with pipe.config_path.open("a", encoding="utf-8") as config:
        config.write(
            f'\n[issuer]\nname = "issuer.test"\nport = {issuer_port}\n'
            f'\n[gateway]\norigin_name = "gateway.test"\nport = {gateway_port}\n'
            f'issuer_directory_url = "{issuer}/.well-known/private-token-issuer-directory"\n'
        )
    door = Door(pipe, issuer, gateway)
    try:
        _start(pipe, "issuer", door)
        _start(pipe, "gateway", door)
        pipe.start_shuffler()
        pipe.start_aggregator()
        yield door
    finally:
        pipe.stop_all()


@dataclass
class Gate:
    """Holds the devices at ``mark`` accepted reports until :meth:`open`: the kill lands while
    uploads go on (past a third) and some are certainly left for after it (the last third),
    however fast the machine lets the devices go."""

    mark: int
    opened: threading.Event = field(default_factory=threading.Event)

    def pass_(self, count: int) -> None:
        if count >= self.mark:
            self.opened.wait(120)

    def open(self) -> None:
        self.opened.set()


def _device_loop(
    door: Door,
    use_case: str,
    secret: str,
    ledger: Ledger,
    outcome: Outcome,
    items: list[str],
    gate: Gate,
) -> None:
    """Send ``PER_SEND`` items at a time until the issuer gives no more tokens this period;
    past the gate's mark, only once the kill has happened (``gate``)."""
    http = httpx.Client(
        timeout=30, event_hooks={"request": [ledger.request], "response": [ledger.response]}
    )
    deadline = time.monotonic() + 120
    try:
        with GatewayDevice(door.gateway, use_case, secret, http=http, retry=RETRY) as device:
            i = 0
            while time.monotonic() < deadline:
                gate.pass_(ledger.count())
                batch = [items[(i + j) % len(items)] for j in range(PER_SEND)]
                try:
                    result = device.send(batch)
                except DeviceError as exc:  # the issuer was down longer than the retries
                    if exc.reason != "issuer":
                        raise
                    outcome.issuer_errors += 1
                    wait_for(lambda: _ready(door.issuer), 30)
                    continue
                i += PER_SEND
                outcome.accepted += result.accepted
                outcome.refused.update(result.refused)
                outcome.undelivered += result.undelivered
                if result.held:
                    outcome.held += result.held
                    return
            raise AssertionError(f"the device did not spend its quota in time: {outcome}")
    except BaseException as exc:  # surfaced by the test
        outcome.failure = exc
    finally:
        http.close()


def _quota_spent(door: Door, use_case: str, secret: str) -> bool:
    """Whether the issuer refuses this identity another token of the period (a new device
    with the same credential: nothing the old one remembered)."""
    with GatewayDevice(door.gateway, use_case, secret, retry=RETRY) as device:
        config = device.configuration()
        period = config.period(time.time())
        return not device.wallet().take(1, period, config.issuer_name, config.origin_name)


@pytest.mark.slow
@pytest.mark.parametrize("victim", VICTIMS)
def test_kill_nine_during_uploads_loses_and_doubles_nothing(
    victim: str, broker: KafkaSettings, tmp_path: Path
) -> None:
    started = time.monotonic()
    ledger = Ledger()
    with front_door(tmp_path, broker, victim) as door:
        pipe, uc = door.pipe, door.pipe.use_case
        assert uc.dictionary_items is not None
        items = list(uc.dictionary_items[:40])
        secrets = [add_credential(pipe.config_path, f"phone-{k}") for k in range(IDENTITIES)]
        outcomes = [Outcome() for _ in secrets]
        expected = IDENTITIES * N
        gate = Gate(2 * expected // 3)
        threads = [
            threading.Thread(
                target=_device_loop,
                args=(door, uc.name, secret, ledger, outcome, items[k::IDENTITIES] + items, gate),
                daemon=True,
            )
            for k, (secret, outcome) in enumerate(zip(secrets, outcomes, strict=True))
        ]
        for thread in threads:
            thread.start()

        pipe.wait_until(lambda: ledger.count() >= expected // 3, 90, "a third of the reports")
        before = list(ledger.bodies)
        attempts, answers = ledger.attempts, ledger.answers
        kill_time = time.time()
        pipe.kill(victim, signal.SIGKILL)  # while the devices upload
        assert pipe.processes[victim].returncode == -signal.SIGKILL
        at_kill = ledger.count()
        gate.open()  # the last third goes after the kill
        if victim == "gateway":  # and once more where it hurts: acknowledged, not answered
            _start(pipe, victim, door, crash_at=CRASH_AT)
            assert wait_dead(pipe, victim, timeout=60), f"the gateway never reached {CRASH_AT}"
        _start(pipe, victim, door)

        for thread in threads:
            thread.join(150 - (time.monotonic() - started))
        assert not any(t.is_alive() for t in threads), "a device is still sending"
        failures = [o.failure for o in outcomes if o.failure is not None]
        assert not failures, failures
        assert ledger.count() > at_kill  # uploads went on after the restart

        # devices that lost an answer before the kill send those bodies again
        resent = before[:5]
        for body in resent:
            again = httpx.post(
                door.gateway + f"/v1/use-cases/{uc.name}/reports", content=body,
                headers={"content-type": MEDIA_TYPE}, timeout=30,
            )  # fmt: skip
            assert again.status_code == 200, again.text

        accepted = list(ledger.accepted)
        assert len(set(accepted)) == len(accepted)  # one 200 per report
        for k, outcome in enumerate(outcomes):
            assert outcome.undelivered == 0, outcome  # the retries carried every report over
            assert outcome.refused == Counter(), (outcome, kill_time, ledger.refusals)
            assert 0 < outcome.accepted <= N, outcome  # the quota, across the kill
            assert _quota_spent(door, uc.name, secrets[k]), f"phone-{k} got a token more"
        assert sum(o.accepted for o in outcomes) == len(accepted)

        pipe.wait_for_count(pipe.aggregated, len(accepted), "the sketch", stall=60)
        pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 60, "the shuffler")
        # every copy (resent bodies, reports a dying gateway produced and a retry produced
        # again) is refused by the shuffler and dead-lettered, never released
        on_topic = read_to_end(pipe.kafka, uc.topics.reports, f"t-crash-{victim}-reports")
        copies = len(on_topic) - len(accepted)
        resent_reports = sum(len(decode_batch(b)) for b in resent)
        assert copies >= resent_reports, copies
        if victim == "gateway":  # the batch a dying gateway left on Kafka, and its retry
            assert copies > resent_reports, copies

        dead = read_to_end(pipe.kafka, uc.topics.dlq, f"t-crash-{victim}-dlq")
        reasons = Counter((dict(m.headers() or []).get("ldpipe.reason") or b"").decode()
                          for m in dead)  # fmt: skip
        assert set(reasons) <= {"replayed_report_id", "replayed_key"}, reasons
        resent_envelopes = {r.envelope for b in resent for r in decode_batch(b)}
        assert resent_envelopes <= {m.value() for m in dead}  # each refused, never released
        assert pipe.aggregated() == len(accepted)  # nothing more arrives
    print(
        f"{victim}: {len(accepted)} accepted, {copies} copies refused, "
        f"{attempts - answers} unanswered attempts before the kill, "
        f"{ledger.attempts - ledger.answers} in all, "
        f"{ledger.token_attempts - ledger.token_answers} token requests unanswered, "
        f"issuer errors {sum(o.issuer_errors for o in outcomes)}, "
        f"{time.monotonic() - started:.1f} s"
    )

    assert len({m.value() for m in on_topic}) == len(accepted)  # every report on Kafka was 200'd
    offline, invalid = offline_sketch(pipe, accepted)
    assert invalid == 0
    assert_same_sketch(live_sketch(uc), offline)
    assert time.monotonic() - started < 180
