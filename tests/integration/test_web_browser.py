"""The TypeScript device SDK in a real browser (issue 20, acceptance 1): Debian's headless
Chromium, driven by ``puppeteer-core`` (``tests/browser/drive.mjs``, installed by
``./dev.sh setup`` from ``tests/browser/package-lock.json``), loads a page
(``tests/browser/page/``) that uses the SDK's bundle (``producers/web/dist/ldpipe.js``). The
page is served by a real HTTP server on its own loopback origin; the gateway and the issuer are
on two others, so every fetch the SDK makes is cross-origin and goes through CORS
(``[gateway] cors_origins`` and ``[issuer] cors_origins`` name the page's origin, and a token
request's preflight is answered; the same page served from an origin not listed gets no answer
from the gateway). In the page, one provisioned device fetches the configuration,
takes 2,000 tokens from the ``ldpipe issuer`` process, seals nested HPKE with WebCrypto and
uploads 2,000 reports of a Zipf(1.1) population over the emoji dictionary (fixed seed) to the
gateway, which produces them to the embedded broker; a shuffler and two aggregators take them
to the sketch store.

Every report is aggregated once, by the two aggregators together, and the estimates hold as the
Python device's do (``tests/integration/test_pipeline.py``): over the 40 most frequent items,
``Σ z_i²`` is χ²₄₀ (mean 40, sd √80) and stays below ``40 + 4·√80`` except with probability
5.4·10⁻⁴, and the number of items outside their 95 % intervals is Binomial(40, 0.05), so at
least 32 are inside except with probability ``P[Binomial(40, 0.95) < 32] = 1.3·10⁻⁴``. The
randomizer's noise is seeded (splitmix64, ``tests/browser/page/seeded.mjs``), so the figures are
the same on every run.

The browser is a test dependency: without ``/usr/bin/chromium``, Node or the driver's
``node_modules`` this test fails (it never skips), naming the fix.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from ldpipe.aggregator.query import query_use_case
from ldpipe.infra.runtime.kafka import KafkaSettings
from ldpipe.producers.datasets import dictionary_population
from tests.front_door_helpers import serve_front_door, with_issuer_table
from tests.integration.pipeline_helpers import make_pipeline
from tests.issuer_helpers import add_credential

ROOT = Path(__file__).resolve().parents[2]
BROWSER = ROOT / "tests" / "browser"
DRIVER = BROWSER / "drive.mjs"
CHROMIUM = Path(os.environ.get("LDPIPE_CHROMIUM", "/usr/bin/chromium"))
BUNDLE = ROOT / "producers" / "web" / "dist" / "ldpipe.js"
N = 2000
SEED = 20
PORTS = range(20200, 20300)  # this test's block of loopback ports
TYPES = {".html": "text/html; charset=utf-8", ".mjs": "text/javascript", ".js": "text/javascript",
         ".map": "application/json", ".json": "application/json"}  # fmt: skip


def page_files() -> dict[str, Path]:
    """What the page's origin serves: the page, its module and the SDK's bundle."""
    files = {f"/{p.name}": p for p in (BROWSER / "page").iterdir() if p.suffix in TYPES}
    files["/ldpipe.js"] = BUNDLE
    files["/ldpipe.js.map"] = BUNDLE.with_suffix(".js.map")
    return files


@contextmanager
def serve_page(params: dict[str, object]) -> Iterator[str]:
    """A real HTTP server for the page on the first free port of ``PORTS``; yields its origin.
    ``/params.json`` is ``params`` as it is when the page asks (the test fills it in once the
    gateway runs: the gateway's configuration needs the page's origin first)."""
    files = page_files()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/params.json":
                body, kind = json.dumps(params).encode(), TYPES[".json"]
            elif path in files and files[path].is_file():
                body, kind = files[path].read_bytes(), TYPES[files[path].suffix]
            else:
                self.send_error(HTTPStatus.NOT_FOUND)
                return
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the test reports what matters

    server = None
    for port in PORTS:
        try:
            server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
            break
        except OSError:
            continue
    assert server is not None, f"no free port in {PORTS.start}-{PORTS.stop - 1}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_browser(url: str) -> dict[str, object]:
    """``node drive.mjs URL``: Chromium opens the page and the driver prints its result."""
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (this test runs a browser)")
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install Node 20 (it drives the browser)")
    if not (BROWSER / "node_modules" / "puppeteer-core").is_dir():
        pytest.fail("tests/browser/node_modules is missing: run ./dev.sh setup (npm ci there)")
    if not BUNDLE.is_file():
        pytest.fail(f"{BUNDLE} is missing: run ./dev.sh setup (npm ci and build in producers/web)")
    # the page took 330 s for 2,000 reports on 2 cores under a load of 12: 900 s is the bound
    result = subprocess.run(
        [node, str(DRIVER), url, "900"], capture_output=True, text=True, timeout=960, cwd=BROWSER
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_chromium_reports_are_all_aggregated_and_estimates_hold(
    broker: KafkaSettings, tmp_path: Path
) -> None:
    started = time.monotonic()
    pipe = make_pipeline(
        tmp_path, broker.bootstrap_servers, n_min=1, max_reports=5000, max_wait_seconds=0.5,
        contribution_limit=N, mechanism="cms", mechanism_options={"k": 1024, "m": 1024},
    )  # fmt: skip
    uc = pipe.use_case
    assert uc.dictionary_items is not None
    population = dictionary_population(uc.dictionary_items, 1.1, N, SEED)
    devices = population.device_items()
    np.random.default_rng(SEED).shuffle(devices)
    params: dict[str, object] = {"use_case": uc.name, "seed": SEED,
                                 "items": [population.items[i] for i in devices]}  # fmt: skip
    try:
        with serve_page(params) as origin:
            issuer_config = with_issuer_table(pipe.config_path, issuer={"cors_origins": [origin]})
            with serve_front_door(
                issuer_config, broker, gateway_name="front-door.toml",
                gateway={"cors_origins": [origin]},
            ) as door:  # fmt: skip
                pipe.start("shuffler", ["shuffler", "--use-case", uc.name])
                pipe.start_aggregator(0)
                pipe.start_aggregator(1)
                params["gateway"] = door.gateway.url
                params["credential"] = add_credential(door.config, "browser-1")
                browser_started = time.monotonic()
                ran = run_browser(f"{origin}/index.html")
                browser_seconds = time.monotonic() - browser_started
                sent = ran["result"]
                assert isinstance(sent, dict) and "error" not in sent, ran
                assert sent["accepted"] == N, ran
                assert (sent["refused"], sent["held"], sent["undelivered"]) == ({}, 0, 0), sent
                assert sent["seed"] == str(uc.mechanism.seed)  # the 64-bit seed, exactly
                assert sent["origin"] == origin != door.gateway.url  # cross-origin: CORS
                assert sent["secure"] is True and sent["subtle"] is True  # WebCrypto
                assert "HeadlessChrome" in str(sent["user_agent"]), sent
                # the same page on an origin the gateway does not list: the browser hides the
                # gateway's answer from it, so CORS, not luck, let the first page through
                with serve_page({**params, "items": ["😀"]}) as stranger:
                    refused = run_browser(f"{stranger}/index.html")["result"]
                assert isinstance(refused, dict), refused
                assert str(refused.get("error")).startswith("gateway: cannot reach"), refused
                pipe.wait_for_count(pipe.aggregated, N, "the sketch", stall=120)
                pipe.wait_until(lambda: pipe.shuffler_backlog() == 0, 60, "the shuffler")
                assert pipe.aggregated() == N  # every report exactly once
    finally:
        pipe.stop_all()

    result = query_use_case(uc, items=[population.items[i] for i in population.top(40)])
    assert result.reports == N and len(result.writers) == 2  # both aggregators sealed windows
    truth = population.counts[population.top(40)]
    z = np.array([(r.estimate - t) / r.std_error for r, t in zip(result.items, truth, strict=True)])
    assert float(np.sum(z**2)) <= 40 + 4 * math.sqrt(2 * 40), z
    inside = sum(r.low <= t <= r.high for r, t in zip(result.items, truth, strict=True))
    assert inside >= 32, z  # P[Binomial(40, 0.95) < 32] = 1.3e-4
    print(
        f"\nbrowser: {N} reports in {browser_seconds:.1f} s of {time.monotonic() - started:.1f} s"
        f" (Chromium start {ran['launch_seconds']:.1f} s, page {ran['page_seconds']:.1f} s, of"
        f" which the SDK's send {sent['seconds']:.1f} s; {ran['chromium']}); sum z^2 ="
        f" {float(np.sum(z**2)):.1f}, {inside}/40 inside"
    )
