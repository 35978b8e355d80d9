/**
 * Local randomizers run on the device, with the OS CSPRNG (crypto.getRandomValues), as
 * schemas/randomizers.md specifies and ldpipe.schemas.mechanisms does: cms (Apple §4.1, Alg. 2),
 * hcms (Apple §4.2, Alg. 6), gcms and ocms (GCMS paper §4.1 Alg. 1, §4.3), rrcms (Pan §3.4,
 * eq. 12) and oue (Wang et al. 2017, §4.4).
 */
import { HashFamily, type Item, itemKey, itemText } from "./hashing.js";
import type { Report } from "./payloads.js";

/** Where the randomness comes from; tests pass a seeded one, devices never do. */
export interface RandomSource {
  /** Fill the array with uniformly random bytes. */
  fill(bytes: Uint8Array): void;
}

export const cryptoRandom: RandomSource = {
  fill(bytes: Uint8Array): void {
    for (let at = 0; at < bytes.length; at += 65536) {
      crypto.getRandomValues(bytes.subarray(at, Math.min(bytes.length, at + 65536)));
    }
  },
};

/** A uniform integer in [0, n), n ≤ 2^32, by rejection sampling (no modulo bias). */
export function uniformInt(rng: RandomSource, n: number): number {
  if (!Number.isInteger(n) || n < 1 || n > 2 ** 32) throw new RangeError(`bad range ${n}`);
  const limit = 2 ** 32 - (2 ** 32 % n);
  const b = new Uint8Array(4);
  for (;;) {
    rng.fill(b);
    const v = new DataView(b.buffer).getUint32(0, true);
    if (v < limit) return v % n;
  }
}

/** A uniform double in [0, 1) with 53 random bits. */
export function uniformFloat(rng: RandomSource): number {
  const b = new Uint8Array(8);
  rng.fill(b);
  const v = new DataView(b.buffer).getBigUint64(0, true) >> 11n;
  return Number(v) / 2 ** 53;
}

export type Mechanism = "cms" | "hcms" | "gcms" | "ocms" | "rrcms" | "oue";
export const SUPPORTED_MECHANISMS: readonly string[] = ["cms", "hcms", "gcms", "ocms", "rrcms", "oue"];

/** Bernoulli(x): 1 with probability x, from a 53-bit uniform double (schemas/randomizers.md). */
export function bernoulli(rng: RandomSource, x: number): boolean {
  return uniformFloat(rng) < x;
}

/**
 * `size` distinct values drawn uniformly from [0, m) without `excluded`, ascending: Floyd's
 * algorithm (Bentley & Floyd 1987) over [0, m - 1), each value v >= excluded shifted up by one.
 */
export function sampleSubset(rng: RandomSource, size: number, m: number, excluded: number): number[] {
  const universe = m - 1;
  if (!Number.isInteger(size) || size < 0 || size > universe) throw new RangeError(`cannot draw ${size} of ${universe} values`);
  const chosen = new Set<number>();
  for (let j = universe - size; j < universe; j++) {
    const t = uniformInt(rng, j + 1);
    chosen.add(chosen.has(t) ? j : t);
  }
  return Array.from(chosen, (v) => (v >= excluded ? v + 1 : v)).sort((a, b) => a - b);
}

/** GCMS eq. 5: the LDP epsilon of inclusion probability p with s of m indices. */
export function subsetEpsilon(p: number, s: number, m: number): number {
  return p >= 1 ? Infinity : Math.abs(Math.log((p * (m - s)) / ((1 - p) * s)));
}

/**
 * OUE compares items as NFC text (schemas/randomizers.md, oue): bytes are decoded as UTF-8,
 * strictly, then normalized; a lone surrogate is refused (hashing.md Step 1).
 */
export function oueText(item: Item): string {
  if (typeof item === "string") return itemText(item);
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(item);
  } catch {
    throw new RangeError("OUE item is not valid UTF-8: OUE compares text; send the item's text");
  }
  return itemText(text);
}

/** The parameters a randomizer reads beyond (epsilon, seed, k, m): the configuration's `parameters`. */
export interface RandomizerOptions {
  /** gcms/ocms: the inclusion probability, as the server resolved it. */
  readonly p?: number;
  /** gcms/ocms: the message size, as the server resolved it. */
  readonly s?: number;
  /** oue: the dictionary, in index order. */
  readonly dictionary?: readonly string[];
}

/**
 * Pan's optimized rrcms width when the configuration gives no m: eq. 15 (Thm 3.6) for "mse",
 * Thm 3.7 / Cor. 3.5 for "l2", as ldpipe.schemas.mechanisms.rrcms.optimal_width.
 */
export function optimalWidth(epsilon: number, objective = "mse", fStar = 1.0, dictionarySize: number | null = null): number {
  const e = Math.exp(epsilon);
  let raw: number;
  if (objective === "mse") {
    if (!(fStar >= 0 && fStar <= 1)) throw new RangeError(`f* must be in [0, 1], got ${fStar}`);
    if (fStar <= 0.5) {
      const delta = Math.sqrt(e) * Math.sqrt(((1 - fStar) * e + fStar) * (fStar * e + 1 - fStar));
      raw = 1 + delta / (fStar * e + 1 - fStar);
    } else {
      raw = 1 + Math.sqrt(e);
    }
  } else if (objective === "l2") {
    if (dictionarySize === null) {
      raw = 1 + e;
    } else {
      const d = dictionarySize;
      if (d < 2) throw new RangeError(`dictionary size must be >= 2, got ${d}`);
      raw = 1 + (Math.sqrt(e) * Math.sqrt((e + d - 1) * (d * e - e + 1))) / (e + d - 1);
    }
  } else {
    throw new RangeError(`objective must be 'mse' or 'l2', got ${objective}`);
  }
  return Math.max(2, Math.floor(raw + 0.5));
}

const EPS_SLACK = 1e-9;

/**
 * A randomizer of one parameter set (schemas/randomizers.md): its mechanism, epsilon, and hash
 * family (null for oue), with gcms/ocms's p and s and oue's dictionary.
 */
export class Randomizer {
  /** oue's dictionary index, by NFC text. */
  private readonly index: ReadonlyMap<string, number>;
  /** The sketch's rows and columns (oue: 1 row, one column per dictionary entry). */
  readonly k: number;
  readonly m: number;

  constructor(
    readonly mechanism: Mechanism,
    readonly epsilon: number,
    readonly family: HashFamily | null,
    readonly options: RandomizerOptions = {},
  ) {
    if (!(epsilon > 0) || !Number.isFinite(epsilon)) throw new RangeError(`epsilon ${epsilon} must be > 0`);
    const index = new Map<string, number>();
    if (mechanism === "oue") {
      const dictionary = options.dictionary ?? [];
      if (dictionary.length < 2) throw new RangeError("oue needs a dictionary of at least 2 items");
      dictionary.forEach((entry, i) => {
        const key = oueText(entry);
        const first = index.get(key);
        if (first !== undefined) {
          throw new RangeError(`oue dictionary has duplicate items at positions ${first} and ${i} (the same text in NFC); remove one`);
        }
        index.set(key, i);
      });
      this.k = 1;
      this.m = dictionary.length;
    } else {
      if (family === null) throw new RangeError(`${mechanism} needs a hash family`);
      this.k = family.k;
      this.m = family.m;
    }
    this.index = index;
    const m = this.m;
    if (mechanism === "hcms" && (m & (m - 1)) !== 0) {
      throw new RangeError(`hcms needs m a power of two, not ${m}`);
    }
    if (mechanism === "gcms" || mechanism === "ocms") {
      const { p, s } = options;
      if (p === undefined || s === undefined) {
        throw new RangeError(`${mechanism} needs parameters p and s, resolved by the server`);
      }
      if (!(p > 0 && p < 1)) throw new RangeError(`${mechanism} needs 0 < p < 1, got p=${p}`);
      if (!Number.isInteger(s) || s < 1 || s > m - 1) throw new RangeError(`${mechanism} needs an integer 1 <= s <= m - 1 = ${m - 1}, got s=${s}`);
      if (!(p > s / m)) throw new RangeError(`${mechanism} needs p > s/m (= ${s / m}), got p=${p}`);
      const eff = subsetEpsilon(p, s, m);
      if (eff > epsilon + EPS_SLACK) {
        throw new RangeError(`${mechanism} with p=${p}, s=${s}, m=${m} gives epsilon=${eff} (GCMS eq. 5) above the configured ${epsilon}`);
      }
    }
    this.cmsQ = 1 - Math.exp(epsilon / 2) / (1 + Math.exp(epsilon / 2));
  }

  /** cms: q = 1 - p, p = e/(1+e), e = exp(eps/2), in binary64 as the reference computes it. */
  private readonly cmsQ: number;

  static async create(
    mechanism: string,
    epsilon: number,
    seed: string | bigint,
    k: number,
    m: number,
    options: RandomizerOptions = {},
  ): Promise<Randomizer> {
    if (!(SUPPORTED_MECHANISMS as readonly string[]).includes(mechanism)) {
      throw new RangeError(`mechanism ${mechanism} is not supported by this SDK (only ${SUPPORTED_MECHANISMS.join(", ")})`);
    }
    const family = mechanism === "oue" ? null : await HashFamily.create(seed, k, m);
    return new Randomizer(mechanism as Mechanism, epsilon, family, options);
  }

  /**
   * The LDP epsilon one report of this randomizer costs: GCMS eq. 5 for gcms/ocms, the
   * configured epsilon for the others (Apple Thm 4.1, 4.3; Pan eq. 12; Wang et al. §4.4).
   */
  get effectiveEpsilon(): number {
    const { p, s } = this.options;
    if ((this.mechanism === "gcms" || this.mechanism === "ocms") && p !== undefined && s !== undefined) {
      return subsetEpsilon(p, s, this.m);
    }
    return this.epsilon;
  }

  /** oue: the dictionary index of an item (RangeError if it is not in the dictionary). */
  dictionaryIndex(item: Item): number {
    const i = this.index.get(oueText(item));
    if (i === undefined) {
      throw new RangeError("item is not in the OUE dictionary; OUE only reports known items: add it to the dictionary or use a sketch mechanism");
    }
    return i;
  }

  /** Randomize one item: choose a row uniformly, hash, then perturb (schemas/randomizers.md). */
  async randomize(item: Item, rng: RandomSource = cryptoRandom): Promise<Report> {
    const { k, m } = this;
    if (this.mechanism === "oue") {
      // Wang et al. §4.4: the item's bit is 1 w.p. 1/2, every other w.p. q = 1/(e^eps + 1)
      const i = this.dictionaryIndex(item);
      const q = 1 / (Math.exp(this.epsilon) + 1);
      return { mechanism: "oue", row: 0, bits: bitVector(rng, m, i, 0.5, q) };
    }
    const family = this.family!;
    const row = uniformInt(rng, k);
    const cell = family.hashKey(row, await itemKey(item));
    if (this.mechanism === "rrcms") {
      // y = h_j(d) w.p. p = e^eps / (e^eps + m - 1), else one of the other m - 1 values uniformly
      const keep = uniformFloat(rng) < 1 / (1 + (m - 1) * Math.exp(-this.epsilon));
      const other = uniformInt(rng, m - 1);
      return { mechanism: "rrcms", row, value: keep ? cell : other + (other >= cell ? 1 : 0) };
    }
    if (this.mechanism === "cms") {
      // every bit is 1 w.p. q = 1/(1+e^(eps/2)); the one-hot bit is then flipped, so it is 1 w.p. 1-q
      const bits = bernoulliBits(this.cmsQ, m, rng);
      bits[cell >> 3]! ^= 1 << (cell & 7);
      return { mechanism: "cms", row, bits };
    }
    if (this.mechanism === "gcms" || this.mechanism === "ocms") {
      // GCMS Alg. 1: c w.p. p, the message filled to s with a uniform subset of [m] \ {c}
      const p = this.options.p!;
      const s = this.options.s!;
      const include = bernoulli(rng, p);
      const indices = sampleSubset(rng, include ? s - 1 : s, m, cell);
      if (include) {
        indices.push(cell);
        indices.sort((a, b) => a - b);
      }
      return { mechanism: this.mechanism, row, indices };
    }
    // hcms: w = (-1)^popcount(l & cell), kept w.p. p = e^eps / (1 + e^eps)
    const column = uniformInt(rng, m);
    const keep = uniformFloat(rng) < 1 / (1 + Math.exp(-this.epsilon));
    const w = popcount(column & cell) % 2 === 0 ? 1 : -1;
    return { mechanism: "hcms", row, column, sign: (keep ? w : -w) as 1 | -1 };
  }
}

/**
 * An m-bit vector packed little-endian within each byte (payloads.md), bit `at` 1 w.p. `own`,
 * every other w.p. `other`, all independent: one 53-bit uniform draw per bit.
 */
function bitVector(rng: RandomSource, m: number, at: number, own: number, other: number): Uint8Array {
  const bits = new Uint8Array(Math.ceil(m / 8));
  const noise = new Uint8Array(8 * m); // drawn at once
  rng.fill(noise);
  const view = new DataView(noise.buffer);
  for (let i = 0; i < m; i++) {
    // the top 53 bits of a little-endian u64: high word · 2^21 + (low word >>> 11)
    const u = (view.getUint32(8 * i + 4, true) * 2 ** 21 + (view.getUint32(8 * i, true) >>> 11)) / 2 ** 53;
    if (u < (i === at ? own : other)) bits[i >> 3]! |= 1 << (i & 7);
  }
  return bits;
}

/**
 * The bits b1, b2, ... of q's binary expansion (q in (0, 1) is a binary64 value, a dyadic
 * rational N / 2^L, so the expansion ends): doubling and subtracting 1 are exact in binary64.
 */
export function binaryExpansion(q: number): number[] {
  if (!(q > 0 && q < 1)) throw new RangeError(`q = ${q} must be in (0, 1)`);
  const bits: number[] = [];
  for (let x = q; x !== 0; ) {
    x *= 2;
    const bit = x >= 1 ? 1 : 0;
    bits.push(bit);
    x -= bit;
  }
  return bits;
}

const FIRST_STEPS = 8; // steps whose random words are drawn in one call

/**
 * m independent bits, each 1 with probability exactly q, packed little-endian within each byte
 * (payloads.md), padding zero (randomizers.md: "any exact Bernoulli sampler conforms"). Each
 * bit compares a uniform real u = 0.r1 r2 ... with q's expansion and is decided at the first
 * differing bit (u < q iff that bit of q is 1); bit-sliced, 32 lanes per random word, one
 * random bit per still-undecided lane per step (about log2(m) + 9 steps in all for m = 1,024),
 * as ldpipe.schemas.mechanisms.single.bernoulli_bits does.
 */
export function bernoulliBits(q: number, m: number, rng: RandomSource = cryptoRandom): Uint8Array {
  const out = new Uint8Array(Math.ceil(m / 8));
  if (q <= 0) return out;
  const words = Math.ceil(m / 32);
  const result = new Uint32Array(words);
  const undecided = new Uint32Array(words).fill(0xffffffff);
  if (m % 32 !== 0) undecided[words - 1] = (1 << m % 32) - 1;
  if (q >= 1) {
    result.set(undecided);
  } else {
    const bits = binaryExpansion(q);
    const first = Math.min(FIRST_STEPS, bits.length);
    let random = new Uint32Array(words * first);
    rng.fill(new Uint8Array(random.buffer));
    let left = words;
    for (let step = 0; step < bits.length && left > 0; step++) {
      let at = step * words;
      if (step >= first) {
        random = new Uint32Array(words);
        rng.fill(new Uint8Array(random.buffer));
        at = 0;
      }
      left = 0;
      for (let w = 0; w < words; w++) {
        const open = undecided[w]!;
        if (open === 0) continue;
        const r = random[at + w]!;
        if (bits[step] === 1) {
          // a 1 in r: u's bit is 0 < 1, so u < q and the lane is decided 1
          const hit = r & open;
          result[w] = result[w]! | hit;
          undecided[w] = open ^ hit;
        } else {
          // a 1 in r: u's bit agrees (0), the lane stays undecided; the others are decided 0
          undecided[w] = open & r;
        }
        if (undecided[w] !== 0) left++;
      }
    }
  }
  for (let j = 0; j < out.length; j++) out[j] = (result[j >> 2]! >>> (8 * (j & 3))) & 0xff;
  return out;
}

function popcount(v: number): number {
  let n = 0;
  for (let x = v >>> 0; x !== 0; x &= x - 1) n++;
  return n;
}
