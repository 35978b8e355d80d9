import assert from "node:assert/strict";
import { test } from "node:test";
import {
  HashFamily,
  type RandomSource,
  SfpClient,
  type SfpSettings,
  encodePayload,
  encodeSfpWord,
  fromHex,
  itemKey,
  toHex,
} from "../src/index.js";
import { pyStrip } from "../src/pytext.js";
import { vectors } from "./vectors.js";

/** A seeded splitmix64 stream (tests only). */
function seeded(seed: bigint): RandomSource {
  let s = seed;
  return {
    fill(bytes: Uint8Array): void {
      for (let i = 0; i < bytes.length; i += 8) {
        s = (s + 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn;
        let z = s;
        z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & 0xffffffffffffffffn;
        z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & 0xffffffffffffffffn;
        z ^= z >> 31n;
        for (let b = 0; b < 8 && i + b < bytes.length; b++) bytes[i + b] = Number((z >> BigInt(8 * b)) & 0xffn);
      }
    },
  };
}

/** schemas/vectors/sfp.json's settings (Python's SfpParams names) as this SDK's. */
function settingsOf(v: Record<string, any>): SfpSettings {
  return {
    epsilonFragment: v["epsilon_fragment"],
    epsilonWord: v["epsilon_word"],
    wordLength: v["word_length"],
    fragmentLength: v["fragment_length"],
    pieceBits: v["piece_bits"],
    pad: v["pad"],
    lowercase: v["lowercase"],
    fragmentMechanism: v["fragment_mechanism"],
    fragmentK: v["fragment_k"],
    fragmentM: v["fragment_m"],
    fragmentHashSeed: String(v["fragment_hash_seed"]),
    wordMechanism: v["word_mechanism"],
    wordK: v["word_k"],
    wordM: v["word_m"],
    wordHashSeed: String(v["word_hash_seed"]),
  };
}

const V = vectors("sfp");

test("sfp vectors: words, pieces, fragment items, keys and hash values byte for byte", async () => {
  let checked = 0;
  for (const set of V.sets) {
    const s = settingsOf(set.settings);
    const word = await HashFamily.create(s.wordHashSeed, s.wordK, s.wordM);
    const fragment = await HashFamily.create(s.fragmentHashSeed, s.fragmentK, s.fragmentM);
    for (const w of set.words) {
      const code = await encodeSfpWord(w.input, s);
      const where = `${set.name} / ${w.name}`;
      assert.equal(code.word, w.word, where);
      assert.equal(toHex(code.wordItem), w.word_item_hex, where);
      assert.equal(code.piece, w.piece, where);
      assert.deepEqual(code.fragmentItems.map(toHex), w.fragment_items_hex, where);
      const x = await itemKey(code.wordItem);
      assert.equal(x.toString(), w.word_key, where);
      const keys = await Promise.all(code.fragmentItems.map((item) => itemKey(item)));
      assert.deepEqual(keys.map(String), w.fragment_keys, where);
      for (let j = 0; j < s.wordK; j++) assert.equal(word.hashKey(j, x), w.word_hashes[j], where);
      for (let j = 0; j < s.fragmentK; j++) {
        assert.deepEqual(keys.map((key) => fragment.hashKey(j, key)), w.fragment_hashes_by_row[j], where);
      }
      checked++;
    }
  }
  assert.ok(checked >= 20);
});

test("sfp vectors: fragment reports are payloads of the stacked rows l k' + j", async () => {
  for (const set of V.sets) {
    const s = settingsOf(set.settings);
    const client = await SfpClient.create(s);
    assert.equal(client.positions, set.positions);
    assert.equal(client.fragmentRows, set.fragment_rows);
    for (const p of set.fragment_payloads) {
      const row = p.position * s.fragmentK + p.row;
      const payload =
        s.fragmentMechanism === "cms"
          ? encodePayload({ mechanism: "cms", row, bits: fromHex(p.bits_hex) }, client.fragmentRows, s.fragmentM)
          : encodePayload({ mechanism: "hcms", row, column: p.column, sign: p.sign }, client.fragmentRows, s.fragmentM);
      assert.equal(toHex(payload), p.payload_hex, set.name);
    }
  }
});

test("python's strip, not JavaScript's trim: U+FEFF stays, U+001F and U+0085 go", () => {
  assert.equal(pyStrip("\ufeffx\u0085\u001f "), "\ufeffx");
  assert.equal(pyStrip("\u00a0\u3000x\u2029"), "x");
});

test("sfp reports: the position is uniform and its row block is the fragment's hash row", async () => {
  const client = await SfpClient.create({ fragmentK: 4, fragmentM: 16, wordK: 4, wordM: 16 });
  const code = await encodeSfpWord("moana", client.settings);
  const rng = seeded(11n);
  const counts = new Array<number>(client.positions).fill(0);
  let own = 0;
  const n = 2500;
  for (let i = 0; i < n; i++) {
    const pair = await client.randomize("Moana", rng);
    assert.equal(pair.fragment.mechanism, "cms");
    if (pair.fragment.mechanism !== "cms") return;
    const position = Math.floor(pair.fragment.row / 4);
    assert.equal(position, pair.position);
    counts[position]!++;
    const j = pair.fragment.row % 4;
    const cell = client.fragment.family!.hashKey(j, await itemKey(code.fragmentItems[position]!));
    own += (pair.fragment.bits[cell >> 3]! >> (cell & 7)) & 1;
    assert.ok(pair.word.row >= 0 && pair.word.row < 4);
  }
  // chi-square with 4 degrees of freedom: 18.47 is its 0.999 quantile
  const chi = counts.reduce((acc, c) => acc + (c - n / 5) ** 2 / (n / 5), 0);
  assert.ok(chi < 18.47, `positions ${counts.join(",")} chi2 ${chi}`);
  const p = Math.exp(3) / (1 + Math.exp(3)); // cms keeps the true bit w.p. e^(eps'/2)/(1+e^(eps'/2))
  assert.ok(Math.abs(own / n - p) < 4 * Math.sqrt((p * (1 - p)) / n), `own bit ${own / n} vs ${p}`);
});

test("sfp settings that cannot tile a word are refused with the rule", async () => {
  await assert.rejects(SfpClient.create({ wordLength: 10, fragmentLength: 3 }), /multiple of fragment_length/);
  await assert.rejects(SfpClient.create({ pieceBits: 9 }), /piece_bits/);
  await assert.rejects(encodeSfpWord("a\ud800"), /lone surrogate/);
});
