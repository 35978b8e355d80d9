// The on-device budget (docs/privacy.md "On the device"): the ledger's rules, its file, and a
// device asked for ten reports in one period sending one, across restarts (a fresh WebDevice and
// ledger each time, reading the same file), against a fake gateway and issuer (privacypass-ts's
// own Issuer with a fresh RSA key).
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { type IncomingMessage, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { publicVerif } from "@cloudflare/privacypass-ts";
import { BUDGET_FORMAT, BudgetLedger, DeviceError, FileBudgetStorage, MemoryBudgetStorage, WebDevice, localStorageBudget } from "../src/node.js";
import { vectors } from "./vectors.js";

const { BlindRSAMode, Issuer, TokenRequest, BLIND_RSA, getPublicKeyBytes } = publicVerif;
const env = vectors("envelope");
const b64 = (hex: string): string => Buffer.from(hex, "hex").toString("base64");
const DAY = 86400;
const T0 = 1_800_000_123;
const period = (now: number) => ({ now, epsilon: 4, periodSeconds: DAY });

test("the ledger: one report per period by default, rollover at period_end, a clock set back reopens nothing", async () => {
  const ledger = await BudgetLedger.open();
  assert.equal(ledger.allowance("emoji", period(100)), 1);
  await ledger.spend("emoji", 1, period(100));
  assert.equal(ledger.allowance("emoji", period(200)), 0);
  assert.equal(ledger.allowance("emoji", period(DAY)), 1); // the next period
  await ledger.spend("emoji", 1, period(DAY));
  assert.equal(ledger.allowance("emoji", period(100)), 0); // clock set back: still the spent period
  const three = await BudgetLedger.open(new MemoryBudgetStorage(), { epsilonPerPeriod: 12 });
  assert.equal(three.allowance("emoji", { now: 0, epsilon: 4, periodSeconds: DAY }), 3);
  assert.equal(three.allowance("emoji", { now: 0, epsilon: 0.1, periodSeconds: DAY }), 120); // 12/0.1 with the slack
  const none = await BudgetLedger.open(new MemoryBudgetStorage(), { epsilonPerPeriod: 3.9 });
  assert.equal(none.allowance("emoji", period(0)), 0);
  assert.equal(ledger.hold("emoji", ["a", "b"]), 2);
  assert.deepEqual(ledger.takeHeld("emoji"), ["a", "b"]);
  const small = await BudgetLedger.open(new MemoryBudgetStorage(), { maxHeld: 1 });
  assert.equal(small.hold("emoji", ["a", "b"]), 1);
  await assert.rejects(BudgetLedger.open(new MemoryBudgetStorage(), { overBudget: "keep" as "hold" }), /"hold" or "drop"/);
});

test("the file: the Python library's format, mode 0600, bytes held as base64; a corrupt file is an error naming it", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ldpipe-budget-"));
  const path = join(dir, "sub", "budget.json");
  const ledger = await BudgetLedger.open(new FileBudgetStorage(path));
  ledger.hold("emoji", ["😀", Uint8Array.of(0, 255)]);
  await ledger.spend("emoji", 1, period(T0));
  const doc = JSON.parse(readFileSync(path, "utf8"));
  assert.equal(doc.format, BUDGET_FORMAT);
  assert.deepEqual(doc.use_cases.emoji, {
    period_start: Math.floor(T0 / DAY) * DAY, period_end: Math.floor(T0 / DAY) * DAY + DAY, spent_epsilon: 4, reports: 1,
    held: [{ text: "😀" }, { b64: "AP8=" }],
  });
  assert.equal(statSync(path).mode & 0o777, 0o600);
  const again = await BudgetLedger.open(new FileBudgetStorage(path));
  assert.deepEqual(again.takeHeld("emoji"), ["😀", Uint8Array.of(0, 255)]);
  assert.equal(again.allowance("emoji", period(T0 + 10)), 0);
  writeFileSync(path, "{not json");
  await assert.rejects(BudgetLedger.open(new FileBudgetStorage(path)), (e: unknown) => e instanceof DeviceError && e.reason === "budget" && e.message.includes(path));
  writeFileSync(path, JSON.stringify({ format: "other" }));
  await assert.rejects(BudgetLedger.open(new FileBudgetStorage(path)), /is not an ldpipe device budget ledger/);
});

test("localStorageBudget keeps the ledger under its key", async () => {
  const store = new Map<string, string>();
  const fake = { getItem: (k: string) => store.get(k) ?? null, setItem: (k: string, v: string) => void store.set(k, v) } as unknown as Storage;
  const ledger = await BudgetLedger.open(localStorageBudget("ldpipe-budget", fake));
  await ledger.spend("emoji", 1, period(T0));
  assert.equal(JSON.parse(store.get("ldpipe-budget")!).use_cases.emoji.reports, 1);
  assert.equal((await BudgetLedger.open(localStorageBudget("ldpipe-budget", fake))).allowance("emoji", period(T0)), 0);
});

let keyPair: ReturnType<typeof Issuer.generateKey> | undefined; // one RSA key for every test (slow to make)

/** A fake gateway and issuer: the issuer signs up to `quota` tokens per period; the gateway accepts every report. */
async function fakeServers(quota: number): Promise<{ fetch: typeof fetch; uploaded: () => number; issued: () => number }> {
  keyPair ??= Issuer.generateKey(BlindRSAMode.PSS, { modulusLength: 2048, publicExponent: Uint8Array.from([1, 0, 1]) });
  const keys = await keyPair;
  const issuer = new Issuer(BlindRSAMode.PSS, "issuer.test", keys.privateKey, keys.publicKey);
  const spki = Buffer.from(await getPublicKeyBytes(keys.publicKey)).toString("base64url");
  const config = {
    use_case: "emoji", epoch: 1, mechanism: "gcms", epsilon: 4, parameters: { k: 16, m: 64, p: 0.75, s: 4 },
    hash_seed: "18446744073709551615",
    analyzer_keys: [{ key_id: env.keyring[0].key_id, kem: "DHKEM(X25519, HKDF-SHA256)", public_key: b64(env.keyring[0].public_key_hex) }],
    shuffler_keys: [{ key_id: env.nested.shuffler_keyring[0].key_id, kem: "DHKEM(X25519, HKDF-SHA256)", public_key: b64(env.nested.shuffler_keyring[0].public_key_hex) }],
    token_issuer: { name: "issuer.test", directory_url: "http://issuer.test/.well-known/private-token-issuer-directory" },
    origin_name: "gateway.test", period_seconds: DAY, contribution_limit: quota, time_precision_seconds: 3600,
    upload: { path: "/v1/use-cases/emoji/reports", max_reports_per_request: 100, max_body_bytes: 1 << 20 },
  };
  let issued = 0;
  let uploaded = 0;
  const json = (status: number, body: unknown): Response => new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
  const fake = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(String(input));
    if (url.pathname === "/v1/use-cases/emoji/config") return json(200, config);
    if (url.pathname.endsWith("issuer-directory")) {
      const periods = [0, 1, 2].map((i) => Math.floor(T0 / DAY) + i);
      return json(200, { "issuer-request-uri": "/v1/token-request", "token-keys": periods.map((p) => ({ "token-type": 2, "token-key": spki, "use-case": "emoji", period: p })) });
    }
    if (url.pathname === "/v1/token-request") {
      if (issued >= quota) return json(429, { type: "urn:ldpipe:issuer:quota" });
      issued++;
      const request = TokenRequest.deserialize(BLIND_RSA, new Uint8Array(init!.body as Uint8Array));
      return new Response((await issuer.issue(request)).serialize(), { status: 200 });
    }
    if (url.pathname === "/v1/use-cases/emoji/reports") {
      const body = new Uint8Array(init!.body as Uint8Array);
      let n = 0;
      for (let at = 6; at < body.length; n++) at += 358 + new DataView(body.buffer, body.byteOffset + at + 354, 4).getUint32(0, true);
      uploaded += n;
      return json(200, { accepted: n, refused: [] });
    }
    return json(404, {});
  };
  return { fetch: fake, uploaded: () => uploaded, issued: () => issued };
}

test("acceptance: a device asked for ten reports in one period sends one, across restarts; the held ones go next period", async () => {
  const servers = await fakeServers(10); // the issuer would sign ten: the device's own budget is the limit
  const path = join(mkdtempSync(join(tmpdir(), "ldpipe-budget-")), "budget.json");
  const results = [];
  for (let i = 0; i < 10; i++) {
    // a restart: nothing survives but the ledger file
    const budget = await BudgetLedger.open(new FileBudgetStorage(path));
    const device = new WebDevice({ gatewayUrl: "http://gw.test", useCase: "emoji", credential: "c", fetch: servers.fetch, clock: () => T0 + 60 * i, budget });
    results.push(await device.send([`report ${i}`]));
  }
  assert.equal(servers.uploaded(), 1);
  assert.equal(servers.issued(), 1); // no token was even asked for beyond the budget
  assert.deepEqual(results.map((r) => r.accepted), [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
  assert.deepEqual(results.map((r) => r.budgetHeld), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
  const doc = JSON.parse(readFileSync(path, "utf8"));
  assert.equal(doc.use_cases.emoji.reports, 1);
  assert.deepEqual(doc.use_cases.emoji.held.map((h: { text: string }) => h.text), Array.from({ length: 9 }, (_, i) => `report ${i + 1}`));

  // the next period: one more report, the oldest held item first
  const budget = await BudgetLedger.open(new FileBudgetStorage(path));
  const device = new WebDevice({ gatewayUrl: "http://gw.test", useCase: "emoji", credential: "c", fetch: servers.fetch, clock: () => T0 + DAY, budget });
  const next = await device.send([]);
  assert.deepEqual([next.accepted, next.budgetHeld, servers.uploaded()], [1, 8, 2]);
  assert.equal(JSON.parse(readFileSync(path, "utf8")).use_cases.emoji.held[0].text, "report 2");
});

test("over budget with drop: the rest is dropped and counted; without a ledger the issuer's quota is the only limit", async () => {
  const servers = await fakeServers(3);
  const budget = await BudgetLedger.open(new MemoryBudgetStorage(), { overBudget: "drop" });
  const device = new WebDevice({ gatewayUrl: "http://gw.test", useCase: "emoji", credential: "c", fetch: servers.fetch, clock: () => T0, budget });
  const r = await device.send(["a", "b", "c"]);
  assert.deepEqual([r.accepted, r.budgetHeld, r.budgetDropped], [1, 0, 2]);
  const free = new WebDevice({ gatewayUrl: "http://gw.test", useCase: "emoji", credential: "c", fetch: servers.fetch, clock: () => T0 });
  const f = await free.send(["a", "b", "c"]);
  assert.deepEqual([f.accepted, f.held.length, f.budgetHeld, f.budgetDropped], [2, 1, 0, 0]); // 3 tokens in all
});

test("a budget is spent before sending and refunded when the issuer gives no token", async () => {
  const servers = await fakeServers(0);
  const budget = await BudgetLedger.open(new MemoryBudgetStorage());
  const device = new WebDevice({ gatewayUrl: "http://gw.test", useCase: "emoji", credential: "c", fetch: servers.fetch, clock: () => T0, budget });
  const r = await device.send(["a"]);
  assert.deepEqual([r.accepted, r.held.length], [0, 1]);
  assert.equal(budget.allowance("emoji", period(T0)), 1); // refunded: nothing was randomized
});

/** Serve a fetch-style handler over real HTTP on 127.0.0.1 (an ephemeral port). */
async function serve(handler: typeof fetch): Promise<{ url: string; close: () => Promise<void> }> {
  const server = createServer(async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const init: RequestInit = { method: req.method ?? "GET", headers: req.headers as Record<string, string> };
    if (chunks.length > 0) init.body = new Uint8Array(Buffer.concat(chunks));
    const answer = await handler(`http://${req.headers.host}${req.url}`, init);
    const headers: Record<string, string> = {};
    answer.headers.forEach((value, name) => void (headers[name] = value));
    res.writeHead(answer.status, headers);
    res.end(Buffer.from(await answer.arrayBuffer()));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

// One run of a device process: open the ledger file, send one item, print the result, exit.
const DEVICE_PROCESS = `
import { BudgetLedger, FileBudgetStorage, WebDevice } from ${JSON.stringify(new URL("../ldpipe-node.mjs", import.meta.url).href)};
const [gatewayUrl, path, now, item] = process.argv.slice(2);
const budget = await BudgetLedger.open(new FileBudgetStorage(path));
const device = new WebDevice({ gatewayUrl, useCase: "emoji", credential: "c", clock: () => Number(now), budget,
  issuerUrl: gatewayUrl });
const r = await device.send([item]);
console.log(JSON.stringify({ accepted: r.accepted, budgetHeld: r.budgetHeld, budgetDropped: r.budgetDropped }));
`;

test("acceptance, with real restarts: ten device processes in one period, one ledger file, one report over HTTP", async () => {
  const servers = await fakeServers(10);
  const http = await serve(servers.fetch);
  const dir = mkdtempSync(join(tmpdir(), "ldpipe-budget-"));
  const script = join(dir, "device.mjs");
  writeFileSync(script, DEVICE_PROCESS);
  const path = join(dir, "budget.json");
  try {
    const out = [];
    for (let i = 0; i < 10; i++) {
      const { stdout } = await promisify(execFile)(process.execPath, [script, http.url, path, String(T0 + 60 * i), `report ${i}`]);
      out.push(JSON.parse(stdout) as { accepted: number; budgetHeld: number });
    }
    assert.deepEqual(out.map((r) => r.accepted), [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert.deepEqual(out.map((r) => r.budgetHeld), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert.deepEqual([servers.uploaded(), servers.issued()], [1, 1]);
    assert.equal(JSON.parse(readFileSync(path, "utf8")).use_cases.emoji.reports, 1);
  } finally {
    await http.close();
  }
});
