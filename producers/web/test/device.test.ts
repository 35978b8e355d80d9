// WebDevice's failure paths against a fake gateway and issuer (a fetch function): the issuer is
// privacypass-ts's own Issuer with a fresh RSA key, the gateway answers as docs/gateway.md says.
import assert from "node:assert/strict";
import { test } from "node:test";
import { publicVerif } from "@cloudflare/privacypass-ts";
import { DeviceError, type RetryPolicy, WebDevice, fetchWithRetries, retryAfter } from "../src/index.js";
import { vectors } from "./vectors.js";

const { BlindRSAMode, Issuer, TokenRequest, BLIND_RSA, getPublicKeyBytes } = publicVerif;
const env = vectors("envelope");
const b64 = (hex: string): string => Buffer.from(hex, "hex").toString("base64");
const NOW = 1_800_000_123;

function policy(slept: number[]): RetryPolicy {
  return { attempts: 3, baseDelay: 0.01, maxDelay: 0.05, maxRetryAfter: 10, sleep: async (s) => void slept.push(s) };
}

const json = (status: number, body: unknown, headers: Record<string, string> = {}): Response =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });

test("fetchWithRetries: 503 with Retry-After waits that long; a quota 429 is final; network errors retry", async () => {
  const slept: number[] = [];
  const answers = [json(503, { reason: "kafka_unavailable" }, { "retry-after": "2" }), json(200, {})];
  const r = await fetchWithRetries(async () => answers.shift()!, "http://x/", {}, policy(slept));
  assert.equal(r.status, 200);
  assert.equal(slept.length, 1);
  assert.ok(slept[0]! >= 2);

  let calls = 0;
  const quota = await fetchWithRetries(async () => (calls++, json(429, { type: "urn:ldpipe:issuer:quota" })), "http://x/", {}, policy([]));
  assert.equal(quota.status, 429);
  assert.equal(calls, 1);

  calls = 0;
  const flaky = async (): Promise<Response> => {
    if (calls++ < 2) throw new TypeError("fetch failed");
    return json(200, {});
  };
  assert.equal((await fetchWithRetries(flaky, "http://x/", {}, policy([]))).status, 200);
  calls = 0;
  await assert.rejects(fetchWithRetries(async () => (calls++, Promise.reject(new TypeError("down"))), "http://x/", {}, policy([])), /down/);
  assert.equal(calls, 3);

  const tooLong = json(503, {}, { "retry-after": "3600" });
  assert.equal((await fetchWithRetries(async () => tooLong, "http://x/", {}, policy([]))).status, 503);
  assert.equal(retryAfter(new Response("", { headers: { "retry-after": new Date(10_000).toUTCString() } }), 4_000), 6);
});

test("a device refetches the configuration on outdated_config and reseals with the same tokens", async () => {
  const keys = await Issuer.generateKey(BlindRSAMode.PSS, { modulusLength: 2048, publicExponent: Uint8Array.from([1, 0, 1]) });
  const issuer = new Issuer(BlindRSAMode.PSS, "issuer.test", keys.privateKey, keys.publicKey);
  const spki = Buffer.from(await getPublicKeyBytes(keys.publicKey)).toString("base64url");
  const period = Math.floor(NOW / 86400);
  const config = {
    use_case: "emoji", epoch: 1, mechanism: "cms", epsilon: 4, parameters: { k: 16, m: 64 },
    hash_seed: "18446744073709551615",
    analyzer_keys: [{ key_id: env.keyring[0].key_id, kem: "DHKEM(X25519, HKDF-SHA256)", public_key: b64(env.keyring[0].public_key_hex) }],
    shuffler_keys: [{ key_id: env.nested.shuffler_keyring[0].key_id, kem: "DHKEM(X25519, HKDF-SHA256)", public_key: b64(env.nested.shuffler_keyring[0].public_key_hex) }],
    token_issuer: { name: "issuer.test", directory_url: "http://issuer.test/.well-known/private-token-issuer-directory" },
    origin_name: "gateway.test", period_seconds: 86400, contribution_limit: 2, time_precision_seconds: 3600,
    upload: { path: "/v1/use-cases/emoji/reports", max_reports_per_request: 100, max_body_bytes: 1 << 20 },
  };
  const log: string[] = [];
  const bodies: Uint8Array[] = [];
  let issued = 0;
  const fake = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(String(input));
    const headers = new Headers(init?.headers);
    if (url.pathname === "/v1/use-cases/emoji/config") {
      log.push(`config ${headers.get("if-none-match") ?? "-"}`);
      if (headers.get("if-none-match") === '"e1"') return new Response(null, { status: 304, headers: { etag: '"e1"' } });
      return json(200, config, { etag: '"e1"', "cache-control": "public, max-age=60" });
    }
    if (url.pathname.endsWith("issuer-directory")) {
      return json(200, { "issuer-request-uri": "/v1/token-request", "token-keys": [{ "token-type": 2, "token-key": spki, "use-case": "emoji", period }] });
    }
    if (url.pathname === "/v1/token-request") {
      assert.equal(headers.get("authorization"), "Bearer secret-1");
      assert.equal(headers.get("content-type"), "application/private-token-request");
      assert.equal(url.searchParams.get("use_case"), "emoji");
      if (issued >= 2) return json(429, { type: "urn:ldpipe:issuer:quota" });
      issued++;
      const request = TokenRequest.deserialize(BLIND_RSA, new Uint8Array(init!.body as Uint8Array));
      return new Response((await issuer.issue(request)).serialize(), { status: 200 });
    }
    if (url.pathname === "/v1/use-cases/emoji/reports") {
      bodies.push(new Uint8Array(init!.body as Uint8Array));
      if (bodies.length === 1) return json(200, { accepted: 0, refused: [0, 1].map((index) => ({ index, reason: "outdated_config" })) });
      return json(200, { accepted: 2, refused: [] });
    }
    return json(404, {});
  };
  const device = new WebDevice({ gatewayUrl: "http://gw.test/", useCase: "emoji", credential: "secret-1", fetch: fake, clock: () => NOW, retry: policy([]) });
  const result = await device.send(["😀", "😂", "👍"]);
  assert.deepEqual({ ...result, held: result.held.length }, { accepted: 2, refused: {}, held: 1, undelivered: 0, budgetHeld: 0, budgetDropped: 0 });
  assert.deepEqual(log, ["config -", 'config "e1"']); // refetched once, with If-None-Match
  assert.equal(bodies.length, 2);
  const tokensOf = (b: Uint8Array): string[] => {
    const out: string[] = [];
    for (let at = 6; at < b.length; ) {
      out.push(Buffer.from(b.subarray(at, at + 354)).toString("hex"));
      at += 358 + new DataView(b.buffer, b.byteOffset + at + 354, 4).getUint32(0, true);
    }
    return out;
  };
  assert.deepEqual(tokensOf(bodies[1]!), tokensOf(bodies[0]!)); // the same tokens, resealed
  assert.notDeepEqual(bodies[1], bodies[0]); // a fresh outer layer (report id, ephemeral key)
  const outerTime = new DataView(bodies[0]!.buffer, bodies[0]!.byteOffset + 6 + 358 + 24, 8).getBigUint64(0, true);
  assert.equal(outerTime, 1_800_000_000n); // rounded down to the hour

  const unknown = new WebDevice({ gatewayUrl: "http://gw.test", useCase: "nope", credential: "x", fetch: fake, retry: policy([]) });
  await assert.rejects(unknown.send(["😀"]), (e: unknown) => e instanceof DeviceError && e.reason === "unknown_use_case");
});

test("a discovery configuration without the device's tag key is refused in one line", async () => {
  const fake = async (): Promise<Response> =>
    json(200, { use_case: "words.discovery", mechanism: "discovery", discovery: { use_case: "words", epoch: 1 } }, { etag: '"x"' });
  const device = new WebDevice({ gatewayUrl: "http://gw.test/", useCase: "words.discovery", credential: "c", fetch: fake, clock: () => NOW, retry: policy([]) });
  await assert.rejects(device.send(["x"]), (err: unknown) => {
    assert.ok(err instanceof DeviceError);
    assert.equal(err.reason, "config");
    assert.match(err.message, /is a discovery use case: .* give the device the tag key/);
    return true;
  });
});
