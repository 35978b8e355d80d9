/**
 * Report envelopes (schemas/envelope.md): the inner layer (LDP, version 2) sealed to the
 * analyzer, inside the outer layer (LDS, version 3: report id and rounded time) sealed to the
 * shuffler. HPKE (RFC 9180 §6.1 single-shot SealBase): mode_base, DHKEM(X25519, HKDF-SHA256),
 * HKDF-SHA256, ChaCha20Poly1305; info = the header bytes, aad empty.
 */
import { Chacha20Poly1305 } from "@hpke/chacha20poly1305";
import { CipherSuite, HkdfSha256 } from "@hpke/core";
import { DhkemX25519HkdfSha256 } from "@hpke/dhkem-x25519";
import { ascii, concat, u32le, u64le } from "./bytes.js";

const suite = new CipherSuite({
  kem: new DhkemX25519HkdfSha256(),
  kdf: new HkdfSha256(),
  aead: new Chacha20Poly1305(),
});

const USE_CASE = /^[a-z0-9_.-]+$/;

/** A recipient's X25519 public key and its key id (from the device configuration). */
export interface PublicKey {
  readonly keyId: number;
  readonly raw: Uint8Array;
}

/** Options for tests: fixed ephemeral key material (RFC 9180 DeriveKeyPair ikm). */
export interface SealOptions {
  readonly ikmE?: Uint8Array;
}

function checkUseCase(useCase: string, max: number): Uint8Array {
  if (useCase.length < 1 || useCase.length > max || !USE_CASE.test(useCase)) {
    throw new RangeError(`use case ${JSON.stringify(useCase)} must be 1..${max} characters of [a-z0-9_.-]`);
  }
  return ascii(useCase);
}

// recipient keys imported once per key array, not once per report (RFC 9180 §7.1.1
// DeserializePublicKey, then reused across seals); a copy of the bytes is kept with each, so an
// array changed in place is imported again
const imported = new WeakMap<Uint8Array, { readonly bytes: Uint8Array; readonly key: Promise<CryptoKey> }>();

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function recipientKey(key: PublicKey): Promise<CryptoKey> {
  const found = imported.get(key.raw);
  if (found !== undefined && sameBytes(found.bytes, key.raw)) return found.key;
  const bytes = key.raw.slice();
  const promise = suite.kem.importKey("raw", bytes.slice().buffer, true);
  imported.set(key.raw, { bytes, key: promise });
  promise.catch(() => imported.delete(key.raw));
  return promise;
}

async function sealTo(key: PublicKey, info: Uint8Array, pt: Uint8Array, opts: SealOptions): Promise<Uint8Array> {
  if (key.raw.length !== 32) throw new RangeError(`key ${key.keyId} is not a 32-byte X25519 public key`);
  const recipientPublicKey = await recipientKey(key);
  const { ct, enc } = await suite.seal(
    opts.ikmE === undefined ? { recipientPublicKey, info } : { recipientPublicKey, info, ekm: opts.ikmE },
    pt,
  );
  return concat(info, new Uint8Array(enc), new Uint8Array(ct));
}

/** The inner header: LDP ‖ version ‖ u32 epoch ‖ u32 key_id ‖ u8 L ‖ use case. */
export function innerHeader(useCase: string, epoch: number, keyId: number, version: 1 | 2 = 2): Uint8Array {
  const uc = checkUseCase(useCase, 51);
  return concat(ascii("LDP"), new Uint8Array([version]), u32le(epoch), u32le(keyId), new Uint8Array([uc.length]), uc);
}

/** Seal a payload to the analyzer: an inner envelope (version 2 unless told 1). */
export async function sealInner(
  payload: Uint8Array,
  useCase: string,
  epoch: number,
  analyzer: PublicKey,
  opts: SealOptions & { version?: 1 | 2 } = {},
): Promise<Uint8Array> {
  return sealTo(analyzer, innerHeader(useCase, epoch, analyzer.keyId, opts.version ?? 2), payload, opts);
}

/** The outer header: LDS ‖ 3 ‖ u32 key_id ‖ report_id[16] ‖ u64 time ‖ u8 L ‖ use case. */
export function outerHeader(useCase: string, keyId: number, reportId: Uint8Array, time: bigint): Uint8Array {
  const uc = checkUseCase(useCase, 55);
  if (reportId.length !== 16) throw new RangeError("the report id must be 16 bytes");
  return concat(ascii("LDS"), new Uint8Array([3]), u32le(keyId), reportId, u64le(time), new Uint8Array([uc.length]), uc);
}

/** Unix seconds rounded down to a multiple of the use case's time precision. */
export function roundTime(unixSeconds: number, precisionSeconds: number): bigint {
  if (!Number.isInteger(precisionSeconds) || precisionSeconds < 1) {
    throw new RangeError(`time precision ${precisionSeconds} must be a positive integer`);
  }
  const t = BigInt(Math.floor(unixSeconds));
  const p = BigInt(precisionSeconds);
  return t - (((t % p) + p) % p);
}

/** Seal an inner envelope to the shuffler (outer layer, version 3). */
export async function sealOuter(
  inner: Uint8Array,
  useCase: string,
  shuffler: PublicKey,
  time: bigint,
  opts: SealOptions & { reportId?: Uint8Array } = {},
): Promise<Uint8Array> {
  const reportId = opts.reportId ?? crypto.getRandomValues(new Uint8Array(16));
  return sealTo(shuffler, outerHeader(useCase, shuffler.keyId, reportId, time), inner, opts);
}
