/**
 * A seeded random source, for tests and the conformance adapter only (reproducible runs).
 * Not exported by the SDK's entry point: a device's noise comes from crypto.getRandomValues
 * (`cryptoRandom`), schemas/randomizers.md "Randomness".
 */
import type { RandomSource } from "./randomize.js";

const MASK = 0xffffffffffffffffn;

/** A splitmix64 stream (Steele, Lea & Flood 2014) from a 64-bit seed: 8 bytes per step, little-endian. */
export function seededRandom(seed: bigint): RandomSource {
  let state = seed & MASK;
  let word = 0n;
  let left = 0;
  return {
    fill(bytes: Uint8Array): void {
      for (let i = 0; i < bytes.length; i++) {
        if (left === 0) {
          state = (state + 0x9e3779b97f4a7c15n) & MASK;
          let z = state;
          z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK;
          z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK;
          word = z ^ (z >> 31n);
          left = 8;
        }
        bytes[i] = Number(word & 0xffn);
        word >>= 8n;
        left--;
      }
    },
  };
}
