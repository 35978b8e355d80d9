/**
 * The ldpipe hash family `ldpipe/hash/v1` (schemas/hashing.md), with BigInt arithmetic over
 * GF(2^61 - 1): item -> NFC UTF-8 bytes -> 61-bit key -> h_j(x) = ((c2 x^2 + c1 x + c0) mod P) mod m.
 */
import { ascii, concat, sha256, u32le, u64le } from "./bytes.js";

export const PRIME = (1n << 61n) - 1n;
const ITEM_DOMAIN = concat(ascii("ldpipe/item/v1"), new Uint8Array([0]));
const HASH_DOMAIN = concat(ascii("ldpipe/hash/v1"), new Uint8Array([0]));

/** An item: text (normalized to NFC, like the Python side's unicodedata.normalize) or bytes. */
export type Item = string | Uint8Array;

/**
 * The index of the first lone surrogate of `text` (a UTF-16 code unit in U+D800-U+DFFF not
 * paired), or -1: such text is not Unicode and has no UTF-8 form (schemas/randomizers.md "Items").
 */
export function loneSurrogate(text: string): number {
  for (let i = 0; i < text.length; i++) {
    const u = text.charCodeAt(i);
    if (u >= 0xd800 && u <= 0xdbff) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        i++;
        continue;
      }
      return i;
    }
    if (u >= 0xdc00 && u <= 0xdfff) return i;
  }
  return -1;
}

/**
 * hashing.md Step 1 for text: NFC. Text with a lone surrogate is refused (RangeError naming
 * its index), never replaced by U+FFFD as TextEncoder would, which would merge distinct inputs.
 */
export function itemText(text: string): string {
  const at = loneSurrogate(text);
  if (at >= 0) {
    const unit = text.charCodeAt(at).toString(16).toUpperCase();
    throw new RangeError(
      `item has a lone surrogate U+${unit} at index ${at}: it is not Unicode text and has no UTF-8 form; fix the text or send its bytes`,
    );
  }
  return text.normalize("NFC");
}

/** hashing.md Step 1: text is NFC-normalized and UTF-8 encoded; bytes are used as they are. */
export function canonicalBytes(item: Item): Uint8Array {
  return typeof item === "string" ? new TextEncoder().encode(itemText(item)) : item;
}

/** word61(d, i): bytes 8i..8i+7 as little-endian u64, masked to 61 bits, reduced mod P. */
export function word61(digest: Uint8Array, i: number): bigint {
  const v = new DataView(digest.buffer, digest.byteOffset, digest.byteLength).getBigUint64(8 * i, true);
  return (v & PRIME) % PRIME;
}

/** hashing.md Step 2: the item's key x. */
export async function itemKey(item: Item): Promise<bigint> {
  return word61(await sha256(concat(ITEM_DOMAIN, canonicalBytes(item))), 0);
}

/** Parse a 64-bit seed given as a decimal string (the configuration's `hash_seed`). */
export function parseSeed(seed: string | bigint): bigint {
  const v = typeof seed === "bigint" ? seed : /^[0-9]{1,20}$/.test(seed) ? BigInt(seed) : -1n;
  if (v < 0n || v > 0xffffffffffffffffn) {
    throw new RangeError(`hash seed ${String(seed)} is not an unsigned 64-bit decimal integer`);
  }
  return v;
}

/** A family of k functions into [m] (hashing.md Steps 3-4). Build with `HashFamily.create`. */
export class HashFamily {
  private constructor(
    readonly seed: bigint,
    readonly k: number,
    readonly m: number,
    readonly coefficients: ReadonlyArray<readonly [bigint, bigint, bigint]>,
  ) {}

  static async create(seed: string | bigint, k: number, m: number): Promise<HashFamily> {
    const s = parseSeed(seed);
    if (!Number.isInteger(k) || k < 1 || k > 2 ** 32) throw new RangeError(`k = ${k} is outside 1..2^32`);
    if (!Number.isInteger(m) || m < 2 || m > 2 ** 32) throw new RangeError(`m = ${m} is outside 2..2^32`);
    const coefficients: Array<readonly [bigint, bigint, bigint]> = [];
    for (let j = 0; j < k; j++) {
      const d = await sha256(concat(HASH_DOMAIN, u64le(s), u32le(j)));
      coefficients.push([word61(d, 0), word61(d, 1), word61(d, 2)]);
    }
    return new HashFamily(s, k, m, coefficients);
  }

  /** The polynomial value of function j at key x, in [0, P). */
  poly(j: number, x: bigint): bigint {
    const c = this.coefficients[j];
    if (c === undefined) throw new RangeError(`function ${j} is outside 0..${this.k - 1}`);
    return (((c[2] * x + c[1]) % PRIME) * x + c[0]) % PRIME;
  }

  /** h_j(x) for a key x. */
  hashKey(j: number, x: bigint): number {
    return Number(this.poly(j, x) % BigInt(this.m));
  }

  /** h_j(item). */
  async hash(j: number, item: Item): Promise<number> {
    return this.hashKey(j, await itemKey(item));
  }
}
