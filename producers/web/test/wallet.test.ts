// The token wallet's batches (schemas/tokens.md, "Batches"): the encoding against the vectors the
// Python encoder writes, and the wallet against a fake issuer (a fetch function) with a fresh RSA
// key from WebCrypto that blind-signs with BigInt arithmetic (RFC 9474 §4.3, s = m^d mod n; the
// wallet's finalize verifies every signature, so a wrong one fails the test); privacypass-ts's
// own Issuer takes ~0.8 s a signature. The real `ldpipe issuer` is in
// tests/producers/test_web_wallet_batch.py.
import assert from "node:assert/strict";
import { test } from "node:test";
import { publicVerif } from "@cloudflare/privacypass-ts";
import {
  BATCH_LIMIT,
  DeviceError,
  type RetryPolicy,
  TOKEN_REQUEST_LENGTH,
  TOKEN_RESPONSE_LENGTH,
  TokenWallet,
  decodeTokenBatch,
  encodeTokenBatch,
  toHex,
} from "../src/index.js";
import { vectors } from "./vectors.js";

const { BlindRSAMode, Issuer, TokenRequest, BLIND_RSA, getPublicKeyBytes } = publicVerif;

const big = (b64u: string): bigint => BigInt(`0x${Buffer.from(b64u, "base64url").toString("hex")}`);

function modPow(base: bigint, exponent: bigint, modulus: bigint): bigint {
  let result = 1n;
  for (let b = base % modulus, e = exponent; e > 0n; e >>= 1n, b = (b * b) % modulus) if (e & 1n) result = (result * b) % modulus;
  return result;
}
const hex = (h: string): Uint8Array => new Uint8Array(Buffer.from(h, "hex"));
const DIRECTORY = "http://issuer.test/.well-known/private-token-issuer-directory";
const PERIOD = 20_000;

function policy(slept: number[]): RetryPolicy {
  return { attempts: 3, baseDelay: 0.01, maxDelay: 0.05, maxRetryAfter: 10, sleep: async (s) => void slept.push(s) };
}

const json = (status: number, body: unknown, headers: Record<string, string> = {}): Response =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });

test("token batches are byte for byte what ldpipe.schemas.tokens.encode_batch writes (schemas/vectors/tokens.json)", () => {
  const doc = vectors("tokens");
  const requests = doc.vectors.map((v: { token_request: string }) => hex(v.token_request));
  const responses = doc.vectors.slice(0, 2).map((v: { token_response: string }) => hex(v.token_response));
  assert.equal(toHex(encodeTokenBatch(requests)), doc.batches.token_batch_request);
  assert.equal(toHex(encodeTokenBatch(responses)), doc.batches.token_batch_response);
  assert.deepEqual(decodeTokenBatch(hex(doc.batches.token_batch_request), TOKEN_REQUEST_LENGTH, BATCH_LIMIT), requests);
  // a partial answer: 2 responses to 4 requests
  assert.deepEqual(decodeTokenBatch(hex(doc.batches.token_batch_response), TOKEN_RESPONSE_LENGTH, requests.length), responses);

  const two = hex(doc.batches.token_batch_response);
  assert.throws(() => decodeTokenBatch(two.subarray(0, 1), TOKEN_RESPONSE_LENGTH, 4), /starts with its count/);
  assert.throws(() => decodeTokenBatch(two, TOKEN_RESPONSE_LENGTH, 1), /1 to 1 items, not 2/); // more than asked
  assert.throws(() => decodeTokenBatch(new Uint8Array([0, 0]), TOKEN_RESPONSE_LENGTH, 4), /not 0/);
  assert.throws(() => decodeTokenBatch(two.subarray(0, two.length - 1), TOKEN_RESPONSE_LENGTH, 4), /is 514 bytes, not 513/);
  assert.throws(() => encodeTokenBatch([]), /1 to 65535/);
  assert.throws(() => encodeTokenBatch([new Uint8Array(2), new Uint8Array(3)]), /one length/);
});

interface FakeIssuer {
  fetch: typeof fetch;
  posts: string[]; // the path and count of every POST
  quota: number;
}

/** An issuer answering as docs/issuer.md says, with `quota` tokens; `answer` may replace a batch's answer. */
async function fakeIssuer(
  quota: number,
  opts: { batches?: boolean; answer?: (n: number, ok: () => Promise<Response>) => Promise<Response> | Response } = {},
): Promise<FakeIssuer> {
  const keys = await Issuer.generateKey(BlindRSAMode.PSS, { modulusLength: 2048, publicExponent: Uint8Array.from([1, 0, 1]) });
  const jwk = await crypto.subtle.exportKey("jwk", keys.privateKey);
  const [n, d] = [big(jwk.n!), big(jwk.d!)];
  const issue = (request: Uint8Array): Uint8Array => {
    const blinded = BigInt(`0x${toHex(TokenRequest.deserialize(BLIND_RSA, request).blindedMsg)}`);
    return hex(modPow(blinded, d, n).toString(16).padStart(512, "0"));
  };
  const spki = Buffer.from(await getPublicKeyBytes(keys.publicKey)).toString("base64url");
  const state: FakeIssuer = { posts: [], quota, fetch: fetch };
  let batchCalls = 0;
  state.fetch = (async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(String(input));
    const headers = new Headers(init?.headers);
    if (url.pathname.endsWith("issuer-directory")) {
      const doc: Record<string, unknown> = {
        "issuer-request-uri": "/v1/token-request",
        "token-keys": [{ "token-type": 2, "token-key": spki, "use-case": "emoji", period: PERIOD }],
      };
      if (opts.batches !== false) doc["ldpipe-batch-request-uri"] = "/v1/token-batch-request";
      return json(200, doc);
    }
    assert.equal(headers.get("authorization"), "Bearer secret-1");
    assert.equal(url.searchParams.get("use_case"), "emoji");
    const body = new Uint8Array(init!.body as Uint8Array);
    if (url.pathname === "/v1/token-batch-request") {
      assert.equal(headers.get("content-type"), "application/x-ldpipe-token-batch-request");
      const items = decodeTokenBatch(body, TOKEN_REQUEST_LENGTH, BATCH_LIMIT);
      state.posts.push(`batch ${items.length}`);
      const ok = async (): Promise<Response> => {
        const k = Math.min(items.length, state.quota);
        if (k === 0) return json(429, { type: "urn:ldpipe:issuer:quota" });
        state.quota -= k;
        const answers = [];
        for (const item of items.slice(0, k)) answers.push(issue(item));
        return new Response(encodeTokenBatch(answers), { status: 200, headers: { "content-type": "application/x-ldpipe-token-batch-response" } });
      };
      return opts.answer ? opts.answer(++batchCalls, ok) : ok();
    }
    if (url.pathname === "/v1/token-request") {
      assert.equal(headers.get("content-type"), "application/private-token-request");
      state.posts.push("single");
      if (state.quota === 0) return json(429, { type: "urn:ldpipe:issuer:quota" });
      state.quota--;
      return new Response(issue(body), { status: 200 });
    }
    return json(404, {});
  }) as typeof fetch;
  return state;
}

const wallet = (issuer: FakeIssuer, slept: number[] = []): TokenWallet =>
  new TokenWallet(DIRECTORY, "emoji", "secret-1", policy(slept), issuer.fetch);

test("a take is one batch request; a partial answer means the quota is spent and nothing more is asked", async () => {
  const issuer = await fakeIssuer(5);
  const w = wallet(issuer);
  assert.equal((await w.take(3, PERIOD, "issuer.test", "gw")).length, 3);
  assert.deepEqual(issuer.posts, ["batch 3"]);
  assert.equal((await w.take(4, PERIOD, "issuer.test", "gw")).length, 2); // the quota's rest
  assert.deepEqual(issuer.posts, ["batch 3", "batch 4"]);
  assert.deepEqual(await w.take(1, PERIOD, "issuer.test", "gw"), []); // known spent: no request
  assert.equal(issuer.posts.length, 2);
});

test("a batch answered 429 quota gives nothing and marks the period spent; an issuer without batches gets one request per token", async () => {
  const none = await fakeIssuer(0);
  const w = wallet(none);
  assert.deepEqual(await w.take(2, PERIOD, "issuer.test", "gw"), []);
  assert.deepEqual(await w.take(2, PERIOD, "issuer.test", "gw"), []);
  assert.deepEqual(none.posts, ["batch 2"]);

  const old = await fakeIssuer(2, { batches: false });
  assert.equal((await wallet(old).take(3, PERIOD, "issuer.test", "gw")).length, 2);
  assert.deepEqual(old.posts, ["single", "single", "single"]);
});

test("a batch answered 503 with Retry-After is sent again after that long", async () => {
  const issuer = await fakeIssuer(5, {
    answer: (n, ok) => (n === 1 ? json(503, { reason: "unavailable" }, { "retry-after": "2" }) : ok()),
  });
  const slept: number[] = [];
  assert.equal((await wallet(issuer, slept).take(2, PERIOD, "issuer.test", "gw")).length, 2);
  assert.deepEqual(issuer.posts, ["batch 2", "batch 2"]);
  assert.equal(slept.length, 1);
  assert.ok(slept[0]! >= 2);
});

test("the issuer failing part way: the tokens already signed stay in the wallet", async () => {
  const issuer = await fakeIssuer(100, { answer: (n, ok) => (n === 1 ? ok() : json(500, { reason: "internal" })) });
  const w = wallet(issuer);
  await assert.rejects(
    w.take(BATCH_LIMIT + 1, PERIOD, "issuer.test", "gw"),
    (e: unknown) => e instanceof DeviceError && e.reason === "issuer" && /answered 500 \(internal\)/.test(e.message),
  );
  assert.deepEqual(issuer.posts, [`batch ${BATCH_LIMIT}`, "batch 1"]); // at most BATCH_LIMIT a request
  assert.equal(w.held(PERIOD), BATCH_LIMIT);
});

test("a bad batch answer or a refused credential is a one-line DeviceError", async () => {
  const more = await fakeIssuer(5, {
    answer: async (_n, ok) => {
      const answer = new Uint8Array(await (await ok()).arrayBuffer());
      return new Response(encodeTokenBatch([...decodeTokenBatch(answer, TOKEN_RESPONSE_LENGTH, 64), answer.subarray(2, 258)]), { status: 200 });
    },
  });
  await assert.rejects(wallet(more).take(1, PERIOD, "issuer.test", "gw"), (e: unknown) =>
    e instanceof DeviceError && e.reason === "issuer" && /does not make valid tokens: a batch holds 1 to 1 items, not 2/.test(e.message));

  const forged = await fakeIssuer(5, {
    answer: async () => new Response(encodeTokenBatch([new Uint8Array(256).fill(7)]), { status: 200 }),
  });
  await assert.rejects(wallet(forged).take(1, PERIOD, "issuer.test", "gw"), (e: unknown) =>
    e instanceof DeviceError && e.reason === "issuer" && /invalid signature/.test(e.message));

  const refused = await fakeIssuer(5, { answer: () => json(401, { type: "urn:ldpipe:issuer:unauthorized" }) });
  await assert.rejects(wallet(refused).take(1, PERIOD, "issuer.test", "gw"), (e: unknown) =>
    e instanceof DeviceError && e.reason === "unauthorized" && !e.message.includes("\n"));
});
