// Opens one page in Debian's headless Chromium (puppeteer-core, never a downloaded browser) and
// prints what the page left in window.ldpipeResult, for tests/integration/test_web_browser.py:
//   node drive.mjs URL [TIMEOUT_SECONDS]
// prints one JSON line {result, launch_seconds, page_seconds, chromium, console}; on failure
// exits 1 with one line on stderr naming the fix. LDPIPE_CHROMIUM overrides /usr/bin/chromium.
import { existsSync } from "node:fs";
import puppeteer from "puppeteer-core";

const CHROMIUM = process.env.LDPIPE_CHROMIUM || "/usr/bin/chromium";
// the network is closed: nothing but the page's loopback origins may be fetched
const FLAGS = [
    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
];

function fail(message) {
    process.stderr.write(message.split(/\s*\n\s*/).join(" ") + "\n");
    process.exit(1);
}

const [url, timeoutArg] = process.argv.slice(2);
if (!url) fail("usage: node drive.mjs URL [TIMEOUT_SECONDS]");
const timeout = 1000 * Number(timeoutArg ?? 300);
if (!existsSync(CHROMIUM)) fail(`${CHROMIUM} is missing: apt-get install chromium (Debian's headless browser)`);

const started = performance.now();
let browser;
try {
    // protocolTimeout: a page busy with 2,000 blind signatures answers the driver's polls late
    browser = await puppeteer.launch({
        executablePath: CHROMIUM, headless: true, args: FLAGS, timeout: 60_000, protocolTimeout: timeout + 60_000,
    });
} catch (err) {
    fail(`${CHROMIUM} did not start: ${err.message}`);
}
const console_ = [];
try {
    const launched = performance.now();
    const page = await browser.newPage();
    page.on("console", (m) => { if (m.type() === "error" || m.type() === "warn") console_.push(`${m.type()}: ${m.text()}`); });
    page.on("pageerror", (err) => console_.push(`pageerror: ${err.message}`));
    page.on("requestfailed", (r) => console_.push(`requestfailed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
    await page.goto(url, { waitUntil: "load", timeout: 60_000 });
    await page.waitForFunction(() => window.ldpipeResult !== undefined, { timeout, polling: 200 });
    const result = await page.evaluate(() => window.ldpipeResult);
    const finished = performance.now();
    process.stdout.write(JSON.stringify({
        result,
        launch_seconds: (launched - started) / 1000,
        page_seconds: (finished - launched) / 1000,
        chromium: await browser.version(),
        console: console_,
    }) + "\n");
} catch (err) {
    await browser.close();
    fail(`the page ${url} gave no result: ${err.message}; console: ${console_.join(" | ")}`);
}
await browser.close();
