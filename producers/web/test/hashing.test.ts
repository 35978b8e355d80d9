import assert from "node:assert/strict";
import { test } from "node:test";
import { HashFamily, canonicalBytes, fromHex, itemKey, parseSeed, toHex } from "../src/index.js";
import { vectors } from "./vectors.js";

const v = vectors("hashing");
const items = v.items.map((it: any) => (it.text !== undefined ? (it.text as string) : fromHex(it.bytes_hex)));

test("every item's canonical bytes and key match schemas/vectors/hashing.json", async () => {
  for (const [i, it] of v.items.entries()) {
    assert.equal(toHex(canonicalBytes(items[i])), it.canonical_bytes_hex, it.name);
    assert.equal((await itemKey(items[i])).toString(), it.key, it.name);
  }
});

test("every family's coefficients, polynomial values and hashes match", async () => {
  for (const fam of v.families) {
    const family = await HashFamily.create(fam.seed, fam.k, fam.m);
    for (const f of fam.functions) {
      assert.deepEqual(family.coefficients[f.j]!.map(String), [f.c0, f.c1, f.c2]);
    }
    for (const [i, item] of items.entries()) {
      const x = await itemKey(item);
      for (let j = 0; j < fam.k; j++) {
        assert.equal(family.poly(j, x).toString(), fam.poly_values[i][j]);
        assert.equal(await family.hash(j, item), fam.hashes[i][j], `${fam.seed}/${j}/${i}`);
      }
    }
  }
});

test("NFC: precomposed and decomposed é are the same item", async () => {
  assert.equal(await itemKey("\u00e9"), await itemKey("e\u0301"));
  assert.notEqual(await itemKey(new Uint8Array([0x65, 0xcc, 0x81])), await itemKey("\u00e9"));
});

test("the seed is a 64-bit decimal string read as BigInt", () => {
  assert.equal(parseSeed("18446744073709551615"), 2n ** 64n - 1n);
  assert.throws(() => parseSeed("18446744073709551616"), /unsigned 64-bit/);
  assert.throws(() => parseSeed("-1"), /unsigned 64-bit/);
  assert.throws(() => parseSeed("1e3"), /unsigned 64-bit/);
});

test("a lone surrogate is refused, as in Python (hashing.md Step 1), never replaced by U+FFFD", async () => {
  assert.throws(() => canonicalBytes("a\ud800b"), /lone surrogate U\+D800 at index 1/);
  assert.throws(() => canonicalBytes("\udfff"), /lone surrogate U\+DFFF/);
  await assert.rejects(itemKey("x\udc00"), /lone surrogate/);
  // a surrogate pair is one code point, and is text
  assert.equal(toHex(canonicalBytes("\ud83d\ude00")), "f09f9880");
});
