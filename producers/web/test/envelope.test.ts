import assert from "node:assert/strict";
import { test } from "node:test";
import { type PublicKey, fromHex, roundTime, sealInner, sealOuter, toHex } from "../src/index.js";
import { vectors } from "./vectors.js";

const v = vectors("envelope");
const keys = (ring: any[]): Map<number, PublicKey> =>
  new Map(ring.map((k) => [k.key_id, { keyId: k.key_id, raw: fromHex(k.public_key_hex) }]));
const analyzers = keys(v.keyring);
const shufflers = keys(v.nested.shuffler_keyring);

test("every single-layer and inner envelope matches schemas/vectors/envelope.json", async () => {
  for (const c of v.valid) {
    const sealed = await sealInner(fromHex(c.payload_hex), c.use_case, c.epoch, analyzers.get(c.key_id)!, {
      ikmE: fromHex(c.ikm_e_hex),
      version: c.version,
    });
    assert.equal(toHex(sealed), c.envelope_hex, c.name);
  }
});

test("every nested report (inner v2 inside outer v3) matches byte for byte", async () => {
  const analyzerRing = keys(v.nested.analyzer_keyring);
  for (const c of v.nested.valid) {
    const i = c.inner;
    const inner = await sealInner(fromHex(i.payload_hex), i.use_case, i.epoch, analyzerRing.get(i.key_id)!, {
      ikmE: fromHex(i.ikm_e_hex),
      version: 2,
    });
    assert.equal(toHex(inner), c.inner_hex, `${c.name} inner`);
    const outer = await sealOuter(inner, c.use_case, shufflers.get(c.key_id)!, BigInt(c.time), {
      ikmE: fromHex(c.ikm_e_hex),
      reportId: fromHex(c.report_id_hex),
    });
    assert.equal(toHex(outer), c.report_hex, c.name);
  }
});

test("sealing is randomized: fresh ephemeral key and report id", async () => {
  const k = [...shufflers.values()][0]!;
  const a = await sealOuter(new Uint8Array([1]), "emoji", k, 0n);
  const b = await sealOuter(new Uint8Array([1]), "emoji", k, 0n);
  assert.equal(a.length, b.length);
  assert.notEqual(toHex(a.subarray(8, 24)), toHex(b.subarray(8, 24)));
});

test("time is rounded down to the precision; bad use cases are refused", async () => {
  assert.equal(roundTime(1800003599.9, 3600), 1800000000n);
  assert.equal(roundTime(1800000000, 3600), 1800000000n);
  await assert.rejects(sealOuter(new Uint8Array([1]), "Emoji", [...shufflers.values()][0]!, 0n), /a-z0-9/);
});
