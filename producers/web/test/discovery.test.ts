import assert from "node:assert/strict";
import { test } from "node:test";
import {
  DiscoveryClient,
  DiscoveryError,
  type ItemRules,
  discoveryTag,
  encodeItemPayload,
  encodeOuterPayload,
  fromHex,
  normalizeItem,
  sealInner,
  tagMessage,
  toHex,
} from "../src/index.js";
import { vectors } from "./vectors.js";

const V = vectors("discovery");
const rulesOf = (r: Record<string, any>): ItemRules => ({
  maxBytes: r["max_bytes"],
  mode: r["mode"],
  lowercase: r["lowercase"],
  strip: r["strip"],
});
const tagKeys = new Map<number, Uint8Array>(V.tag_keys.map((k: any) => [k.key_id, fromHex(k.secret_hex)]));
const serverKey = { keyId: V.keys.server.key_id, raw: fromHex(V.keys.server.public_key_hex) };
const auxKey = { keyId: V.keys.aux.key_id, raw: fromHex(V.keys.aux.public_key_hex) };

test("discovery vectors: every normalization and refusal", () => {
  for (const c of V.normalization) {
    const input = c.input_hex !== undefined ? fromHex(c.input_hex) : c.input;
    const where = JSON.stringify(c);
    if (c.reason !== undefined) {
      assert.throws(() => normalizeItem(input, rulesOf(c.rules)), (e: unknown) => e instanceof DiscoveryError && e.reason === c.reason, where);
    } else {
      assert.equal(normalizeItem(input, rulesOf(c.rules)), c.output, where);
    }
  }
});

test("discovery vectors: tag, item payload, both layers byte for byte", async () => {
  assert.equal(toHex(tagMessage("words", "hello")).startsWith(V.tag.domain_hex), true);
  for (const c of V.reports) {
    const rules = rulesOf(c.rules);
    const secret = tagKeys.get(c.tag_key_id)!;
    assert.equal(toHex(await discoveryTag({ keyId: c.tag_key_id, secret }, c.use_case, c.item)), c.tag_hex, c.name);
    assert.equal(toHex(encodeItemPayload(c.item, rules.maxBytes)), c.item_payload_hex, c.name);
    const inner = await sealInner(fromHex(c.item_payload_hex), `${c.use_case}.disc.srv`, c.epoch, serverKey, {
      ikmE: fromHex(c.inner_ikm_e_hex),
      version: 1,
    });
    assert.equal(toHex(inner), c.inner_envelope_hex, c.name);
    assert.equal(toHex(encodeOuterPayload(c.tag_key_id, fromHex(c.tag_hex), inner)), c.outer_payload_hex, c.name);
    const client = new DiscoveryClient({ useCase: c.use_case, epoch: c.epoch, rules, serverKey, auxKey, tagKey: { keyId: c.tag_key_id, secret } });
    const report = await client.encode(c.item, { inner: { ikmE: fromHex(c.inner_ikm_e_hex) }, outer: { ikmE: fromHex(c.outer_ikm_e_hex) } });
    assert.equal(toHex(report), c.outer_envelope_hex, c.name);
  }
});

test("discovery reports of a use case all have one length; fresh keys each time", async () => {
  const client = new DiscoveryClient({ useCase: "words", epoch: 0, serverKey, auxKey, tagKey: { keyId: 9, secret: new Uint8Array(32) } });
  const a = await client.encode("hello");
  const b = await client.encode("a much longer word than hello");
  const c = await client.encode("hello");
  assert.equal(a.length, 238); // schemas/discovery.md: 238 bytes for words, max_bytes = 64
  assert.equal(b.length, 238);
  assert.notEqual(toHex(a), toHex(c));
  await assert.rejects(client.encode("   "), (e: unknown) => e instanceof DiscoveryError && e.reason === "empty_item");
});

test("a nested discovery report is the aux report inside an outer v3 layer of <uc>.discovery", async () => {
  const shufflerKey = { keyId: 5, raw: fromHex(V.keys.aux.public_key_hex).map((x) => x ^ 1) };
  const client = new DiscoveryClient({
    useCase: "words",
    epoch: 0,
    serverKey,
    auxKey,
    tagKey: { keyId: 9, secret: new Uint8Array(32) },
    shufflerKey,
    timePrecisionSeconds: 3600,
  });
  const report = await client.encode("hello", { clock: () => 1800003599 });
  assert.equal(toHex(report.subarray(0, 4)), "4c445303");
  const view = new DataView(report.buffer, report.byteOffset);
  assert.equal(view.getBigUint64(24, true), 1800000000n);
  assert.equal(new TextDecoder().decode(report.subarray(33, 33 + report[32]!)), "words.discovery");
  assert.equal(report.length, 238 + 33 + 15 + 32 + 16);
});

test("discovery client refuses what the spec refuses", () => {
  const tagKey = { keyId: 9, secret: new Uint8Array(32) };
  assert.throws(() => new DiscoveryClient({ useCase: "Words", epoch: 0, serverKey, auxKey, tagKey }), /invalid/);
  assert.throws(() => new DiscoveryClient({ useCase: "words", epoch: 0, serverKey, auxKey: serverKey, tagKey }), /different keys/);
  assert.throws(() => normalizeItem("a\udc00"), (e: unknown) => e instanceof DiscoveryError && e.reason === "invalid_utf8");
  assert.throws(() => normalizeItem(42), (e: unknown) => e instanceof DiscoveryError && e.reason === "not_text");
});
