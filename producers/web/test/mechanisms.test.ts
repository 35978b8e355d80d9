// gcms, ocms and oue on the device (schemas/randomizers.md): their laws with a seeded source, their
// payloads against schemas/vectors/payloads.json's record lengths, and what they refuse.
import assert from "node:assert/strict";
import { test } from "node:test";
import { DeviceError, Randomizer, encodePayload, itemKey, itemText, parseRandomizer, sampleSubset, subsetEpsilon } from "../src/index.js";
import { seededRandom } from "../src/testing.js";
import { vectors } from "./vectors.js";

const near = (x: number, p: number, n: number, what: string): void =>
  assert.ok(Math.abs(x / n - p) < 5 * Math.sqrt((p * (1 - p)) / n), `${what}: ${x / n} vs ${p}`);

test("sampleSubset: distinct, ascending, never the excluded value, each other value alike", () => {
  const rng = seededRandom(11n);
  const counts = new Array<number>(10).fill(0);
  const n = 20000;
  for (let i = 0; i < n; i++) {
    const s = sampleSubset(rng, 3, 10, 4);
    assert.equal(s.length, 3);
    for (let j = 1; j < s.length; j++) assert.ok(s[j]! > s[j - 1]!);
    for (const v of s) counts[v]!++;
  }
  assert.equal(counts[4], 0);
  for (const [v, c] of counts.entries()) if (v !== 4) near(c, 3 / 9, n, `value ${v}`);
  assert.deepEqual(sampleSubset(rng, 9, 10, 0), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual(sampleSubset(rng, 0, 10, 0), []);
});

for (const mechanism of ["gcms", "ocms"] as const) {
  test(`${mechanism}: the true index w.p. p, the others w.p. (s - p)/(m - 1), s indices ascending`, async () => {
    const m = 32, s = 5;
    const p = 0.6; // eq. 5: ln(0.6·27/(0.4·5)) = 2.09
    const r = await Randomizer.create(mechanism, 2.1, "18446744073709551557", 8, m, { p, s });
    assert.ok(Math.abs(r.effectiveEpsilon - subsetEpsilon(p, s, m)) < 1e-12);
    const x = await itemKey("nai\u0308ve");
    assert.equal(x, await itemKey("naïve"));
    const rng = seededRandom(5n);
    let own = 0, others = 0;
    const rows = new Array<number>(8).fill(0);
    const n = 8000;
    for (let i = 0; i < n; i++) {
      const rep = await r.randomize("nai\u0308ve", rng);
      if (rep.mechanism !== mechanism) throw new Error(rep.mechanism);
      assert.equal(rep.indices.length, s);
      assert.equal(encodePayload(rep, 8, m).length, 6 + 4 * s); // rejects unsorted or repeated indices
      const cell = r.family!.hashKey(rep.row, x);
      if (rep.indices.includes(cell)) own++;
      others += rep.indices.filter((v) => v !== cell).length;
      rows[rep.row]!++;
    }
    near(own, p, n, "true index");
    near(others, (s - p) / (m - 1), n * (m - 1), "other indices");
    for (const c of rows) near(c, 1 / 8, n, "row");
  });
}

test("oue: the item's bit w.p. 1/2, every other w.p. 1/(e^eps + 1); NFC text and UTF-8 bytes find it", async () => {
  const dictionary = ["café", "naïve", "😀", "plain", "x", "y", "z", "w", "v", "u"];
  const r = await Randomizer.create("oue", 3, "0", 1, 0, { dictionary });
  assert.equal(r.m, 10);
  assert.equal(r.dictionaryIndex("cafe\u0301"), 0);
  assert.equal(r.dictionaryIndex(new TextEncoder().encode("nai\u0308ve")), 1);
  const rng = seededRandom(6n);
  const q = 1 / (Math.exp(3) + 1);
  let own = 0, other = 0;
  const n = 6000;
  for (let i = 0; i < n; i++) {
    const rep = await r.randomize("😀", rng);
    if (rep.mechanism !== "oue") throw new Error(rep.mechanism);
    assert.equal(rep.row, 0);
    assert.equal(encodePayload(rep, 1, 10).length, 8); // two bytes, padding zero
    for (let b = 0; b < 10; b++) {
      const bit = (rep.bits[b >> 3]! >> (b & 7)) & 1;
      if (b === 2) own += bit;
      else other += bit;
    }
  }
  near(own, 0.5, n, "own bit");
  near(other, q, 9 * n, "other bits");
  await assert.rejects(r.randomize("absent", rng), /not in the OUE dictionary/);
  await assert.rejects(r.randomize(Uint8Array.of(0xff, 0xfe), rng), /not valid UTF-8/);
  await assert.rejects(Randomizer.create("oue", 3, "0", 1, 0, { dictionary: ["é", "e\u0301"] }), /duplicate/);
});

test("randomized reports of every parameter set in payloads.json encode to its record length", async () => {
  const rng = seededRandom(7n);
  for (const set of vectors("payloads").parameter_sets) {
    const options =
      set.mechanism === "oue"
        ? { dictionary: Array.from({ length: set.m }, (_, i) => `item ${i}`) }
        : set.mechanism === "gcms" || set.mechanism === "ocms"
          ? { p: 0.9, s: set.s }
          : {};
    const r = await Randomizer.create(set.mechanism, 8, "3", set.k, set.m, options);
    const item = set.mechanism === "oue" ? "item 3" : "hello";
    for (let i = 0; i < 50; i++) {
      assert.equal(encodePayload(await r.randomize(item, rng), set.k, set.m).length, set.record_length, set.mechanism);
    }
  }
});

test("gcms parameters that break GCMS's conditions are refused, naming them", async () => {
  await assert.rejects(Randomizer.create("gcms", 4, "1", 4, 16), /needs parameters p and s/);
  await assert.rejects(Randomizer.create("gcms", 4, "1", 4, 16, { p: 0.5, s: 16 }), /s <= m - 1/);
  await assert.rejects(Randomizer.create("gcms", 4, "1", 4, 16, { p: 0.1, s: 4 }), /p > s\/m/);
  await assert.rejects(Randomizer.create("gcms", 1, "1", 4, 16, { p: 0.99, s: 1 }), /above the configured 1/);
});

test("parseRandomizer reads the configuration's resolved parameters, a decimal seed, and refuses a numeric one", async () => {
  const g = await parseRandomizer({ mechanism: "ocms", epsilon: 4, parameters: { k: 16, m: 64, p: 0.7, s: 3 }, hash_seed: "9223372036854795009" });
  assert.deepEqual([g.k, g.m, g.hashSeed, g.randomizer.options.s], [16, 64, 9223372036854795009n, 3]);
  const o = await parseRandomizer({ mechanism: "oue", epsilon: 4, parameters: { dictionary: ["a", "b", "c"] }, hash_seed: null });
  assert.deepEqual([o.k, o.m], [1, 3]);
  await assert.rejects(parseRandomizer({ mechanism: "cms", epsilon: 4, parameters: { k: 2, m: 8 }, hash_seed: 12 }), (e: unknown) => e instanceof DeviceError && /JSON number/.test(e.message));
  await assert.rejects(parseRandomizer({ mechanism: "oue", epsilon: 4, parameters: { dictionary: "abc" } }), /not a list of strings/);
});

test("text with a lone surrogate is refused with its index, never replaced by U+FFFD", async () => {
  assert.throws(() => itemText("ab\ud800c"), /lone surrogate U\+D800 at index 2/);
  assert.throws(() => itemText("\udc00"), /index 0/);
  assert.equal(itemText("😀"), "😀");
  await assert.rejects(itemKey("x\ud83d"), /lone surrogate/);
});
