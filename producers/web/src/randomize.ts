/**
 * Local randomizers run on the device, with the OS CSPRNG (crypto.getRandomValues):
 * cms (Apple §4.1, Alg. 2) and hcms (Apple §4.2, Alg. 6), as ldpipe.schemas.mechanisms does.
 */
import { HashFamily, type Item, itemKey } from "./hashing.js";
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

export type Mechanism = "cms" | "hcms" | "rrcms";
export const SUPPORTED_MECHANISMS: readonly string[] = ["cms", "hcms", "rrcms"];

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

/** A randomizer of one parameter set: its family, epsilon and mechanism. */
export class Randomizer {
  constructor(
    readonly mechanism: Mechanism,
    readonly epsilon: number,
    readonly family: HashFamily,
  ) {
    if (!(epsilon > 0) || !Number.isFinite(epsilon)) throw new RangeError(`epsilon ${epsilon} must be > 0`);
    if (mechanism === "hcms" && (family.m & (family.m - 1)) !== 0) {
      throw new RangeError(`hcms needs m a power of two, not ${family.m}`);
    }
    this.cmsQ = 1 - Math.exp(epsilon / 2) / (1 + Math.exp(epsilon / 2));
  }

  /** cms: q = 1 - p, p = e/(1+e), e = exp(eps/2), in binary64 as the reference computes it. */
  private readonly cmsQ: number;

  static async create(mechanism: string, epsilon: number, seed: string | bigint, k: number, m: number): Promise<Randomizer> {
    if (mechanism !== "cms" && mechanism !== "hcms" && mechanism !== "rrcms") {
      throw new RangeError(`mechanism ${mechanism} is not supported by this SDK (only ${SUPPORTED_MECHANISMS.join(", ")})`);
    }
    return new Randomizer(mechanism, epsilon, await HashFamily.create(seed, k, m));
  }

  /** Randomize one item: choose a row uniformly, hash, then perturb. */
  async randomize(item: Item, rng: RandomSource = cryptoRandom): Promise<Report> {
    const { k, m } = this.family;
    const row = uniformInt(rng, k);
    const cell = this.family.hashKey(row, await itemKey(item));
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
    // hcms: w = (-1)^popcount(l & cell), kept w.p. p = e^eps / (1 + e^eps)
    const column = uniformInt(rng, m);
    const keep = uniformFloat(rng) < 1 / (1 + Math.exp(-this.epsilon));
    const w = popcount(column & cell) % 2 === 0 ? 1 : -1;
    return { mechanism: "hcms", row, column, sign: (keep ? w : -w) as 1 | -1 };
  }
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
