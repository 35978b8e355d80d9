import assert from "node:assert/strict";
import { test } from "node:test";
import {
  HashFamily,
  type RandomSource,
  Randomizer,
  bernoulliBits,
  binaryExpansion,
  encodePayload,
  itemKey,
  optimalWidth,
  uniformInt,
} from "../src/index.js";
import { seededRandom } from "../src/testing.js";

const seeded = seededRandom;

test("uniformInt stays in range and covers it", () => {
  const rng = seeded(1n);
  const seen = new Set<number>();
  for (let i = 0; i < 2000; i++) seen.add(uniformInt(rng, 7));
  assert.deepEqual([...seen].sort(), [0, 1, 2, 3, 4, 5, 6]);
});

test("cms: the true bit is 1 w.p. p = e^(eps/2)/(1+e^(eps/2)), others w.p. 1-p", async () => {
  const r = await Randomizer.create("cms", 4, "5", 8, 64);
  const rng = seeded(2n);
  const x = await itemKey("😀");
  let own = 0, other = 0, others = 0;
  const n = 2000;
  for (let i = 0; i < n; i++) {
    const rep = await r.randomize("😀", rng);
    assert.equal(rep.mechanism, "cms");
    if (rep.mechanism !== "cms") return;
    const cell = r.family!.hashKey(rep.row, x);
    for (let b = 0; b < 64; b++) {
      const bit = (rep.bits[b >> 3]! >> (b & 7)) & 1;
      if (b === cell) own += bit;
      else { other += bit; others++; }
    }
    assert.equal(encodePayload(rep, 8, 64).length, 14);
  }
  const p = Math.exp(2) / (1 + Math.exp(2));
  assert.ok(Math.abs(own / n - p) < 4 * Math.sqrt((p * (1 - p)) / n), `own ${own / n} vs ${p}`);
  assert.ok(Math.abs(other / others - (1 - p)) < 4 * Math.sqrt((p * (1 - p)) / others));
});

test("hcms: the sign agrees with H[l, h_j(d)] w.p. e^eps/(1+e^eps)", async () => {
  const r = await Randomizer.create("hcms", 2, "7", 4, 16);
  const family = await HashFamily.create("7", 4, 16);
  const rng = seeded(3n);
  const x = await itemKey("hello");
  let agree = 0;
  const n = 4000;
  for (let i = 0; i < n; i++) {
    const rep = await r.randomize("hello", rng);
    if (rep.mechanism !== "hcms") throw new Error("not hcms");
    let pop = 0;
    for (let v = rep.column & family.hashKey(rep.row, x); v; v &= v - 1) pop++;
    if ((pop % 2 === 0 ? 1 : -1) === rep.sign) agree++;
  }
  const p = Math.exp(2) / (1 + Math.exp(2));
  assert.ok(Math.abs(agree / n - p) < 4 * Math.sqrt((p * (1 - p)) / n), `${agree / n} vs ${p}`);
});

test("rrcms: the true cell w.p. e^eps/(e^eps+m-1), the others uniformly; Pan's width", async () => {
  const r = await Randomizer.create("rrcms", 2, "9", 4, 8);
  const rng = seeded(4n);
  const x = await itemKey("hello");
  let own = 0;
  const seen = new Set<number>();
  const n = 4000;
  for (let i = 0; i < n; i++) {
    const rep = await r.randomize("hello", rng);
    if (rep.mechanism !== "rrcms") throw new Error("not rrcms");
    if (rep.value === r.family!.hashKey(rep.row, x)) own++;
    seen.add(rep.value);
  }
  const p = Math.exp(2) / (Math.exp(2) + 7);
  assert.ok(Math.abs(own / n - p) < 4 * Math.sqrt((p * (1 - p)) / n), `${own / n} vs ${p}`);
  assert.equal(seen.size, 8);
  // ldpipe.schemas.mechanisms.rrcms.optimal_width: round(1 + e^(eps/2)) for the defaults
  assert.equal(optimalWidth(4), Math.floor(1 + Math.exp(2) + 0.5));
  assert.equal(optimalWidth(1, "l2"), 4);
  assert.equal(optimalWidth(2, "mse", 0.3), 5); // the Python function's values
  assert.equal(optimalWidth(3, "l2", 1, 100), 19);
});

test("mechanisms this SDK does not do are refused by name", async () => {
  await assert.rejects(Randomizer.create("sfp", 4, "1", 1, 8), /not supported by this SDK/);
  await assert.rejects(Randomizer.create("hcms", 4, "1", 1, 12), /power of two/);
});

/** A RandomSource serving the given bytes in order (tests of exactness by enumeration). */
function scripted(data: Uint8Array): RandomSource {
  let at = 0;
  return {
    fill(bytes: Uint8Array): void {
      assert.ok(at + bytes.length <= data.length, "drew more bytes than scripted");
      bytes.set(data.subarray(at, at + bytes.length));
      at += bytes.length;
    },
  };
}

test("binaryExpansion is q's exact binary expansion", () => {
  assert.deepEqual(binaryExpansion(3 / 8), [0, 1, 1]);
  assert.deepEqual(binaryExpansion(0.5), [1]);
  const q = 1 / (1 + Math.exp(2));
  const bits = binaryExpansion(q);
  assert.equal(bits.reduce((sum, b, i) => sum + b * 2 ** -(i + 1), 0), q);
});

test("bernoulliBits is exact: q = 3/8 gives 1 for exactly 3 of the 8 first-three-bit patterns", () => {
  // lane 0 reads bit 0 of the first word of each step; 3 steps for 3/8 = 0.011b
  let ones = 0;
  for (let pattern = 0; pattern < 8; pattern++) {
    const data = new Uint8Array(12); // 3 steps x one 32-bit word (m = 5 lanes)
    for (let step = 0; step < 3; step++) data[4 * step] = (pattern >> step) & 1 ? 0x1f : 0;
    const bits = bernoulliBits(3 / 8, 5, scripted(data));
    assert.equal(bits.length, 1);
    assert.equal(bits[0]! >> 5, 0, "padding bits stay zero");
    assert.ok(bits[0] === 0 || bits[0] === 0x1f, "the same coins give the same lanes");
    ones += bits[0]! & 1;
  }
  assert.equal(ones, 3);
});

test("bernoulliBits: rate q in every lane over m = 1,024 (CMS at eps = 4)", () => {
  const q = 1 / (1 + Math.exp(2));
  const rng = seeded(9n);
  const n = 400;
  const m = 1024;
  const perLane = new Array<number>(m).fill(0);
  for (let i = 0; i < n; i++) {
    const bits = bernoulliBits(q, m, rng);
    for (let b = 0; b < m; b++) perLane[b]! += (bits[b >> 3]! >> (b & 7)) & 1;
  }
  const total = perLane.reduce((a, b) => a + b, 0);
  assert.ok(Math.abs(total - n * m * q) < 5 * Math.sqrt(n * m * q * (1 - q)), `total ${total}`);
  assert.ok(bernoulliBits(1, 12, rng).every((b, i) => b === (i === 0 ? 0xff : 0x0f)));
  assert.ok(bernoulliBits(0, 12, rng).every((b) => b === 0));
});
