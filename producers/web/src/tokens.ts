/**
 * Privacy Pass challenge for ldpipe tokens, type 0x0002 (schemas/tokens.md, RFC 9577 §2.1.1), and
 * ldpipe's token batches (schemas/tokens.md, "Batches"), as ldpipe.schemas.tokens writes them.
 */
import { ascii, concat, sha256 } from "./bytes.js";

const CONTEXT_DOMAIN = concat(ascii("ldpipe/token-redemption-context/v1"), new Uint8Array([0]));

/** SHA-256("ldpipe/token-redemption-context/v1" ‖ 0 ‖ u8 len ‖ use case ‖ u64 period), 32 bytes. */
export async function redemptionContext(useCase: string, period: number | bigint | string): Promise<Uint8Array> {
  const uc = new TextEncoder().encode(useCase);
  if (uc.length < 1 || uc.length > 255) throw new RangeError("the use case must be 1..255 bytes");
  const p = new Uint8Array(8);
  const v = BigInt(period);
  if (v < 0n || v > 0xffffffffffffffffn) throw new RangeError(`period ${v} is not an unsigned 64-bit integer`);
  new DataView(p.buffer).setBigUint64(0, v, false);
  return sha256(concat(CONTEXT_DOMAIN, new Uint8Array([uc.length]), uc, p));
}

/** The TokenChallenge bytes: u16 type ‖ u16 len ‖ issuer ‖ u8 len ‖ context ‖ u16 len ‖ origin. */
export function tokenChallenge(issuerName: string, context: Uint8Array, originInfo: string): Uint8Array {
  const u16 = (n: number): Uint8Array => new Uint8Array([n >> 8, n & 0xff]);
  const issuer = new TextEncoder().encode(issuerName);
  const origin = new TextEncoder().encode(originInfo);
  return concat(u16(2), u16(issuer.length), issuer, new Uint8Array([context.length]), context, u16(origin.length), origin);
}

export const TOKEN_REQUEST_LENGTH = 259; // RFC 9578 §6.1: u16 type ‖ u8 key id ‖ blinded_msg 256
export const TOKEN_RESPONSE_LENGTH = 256; // RFC 9578 §6.2: blind_sig 256

/** count u16 (big-endian) ‖ the items, all of one length: a batch of token requests or responses. */
export function encodeTokenBatch(items: readonly Uint8Array[]): Uint8Array {
  if (items.length < 1 || items.length > 0xffff) throw new RangeError(`a batch holds 1 to 65535 items, not ${items.length}`);
  if (items.some((item) => item.length !== items[0]!.length)) throw new RangeError("a batch's items must all have one length");
  return concat(new Uint8Array([items.length >> 8, items.length & 0xff]), ...items);
}

/** The items of a batch; a RangeError names what is wrong (no count, a count of 0 or above `maxCount`, a wrong length). */
export function decodeTokenBatch(data: Uint8Array, itemLength: number, maxCount: number): Uint8Array[] {
  if (data.length < 2) throw new RangeError("a batch starts with its count, a 2-byte big-endian integer");
  const count = (data[0]! << 8) | data[1]!;
  if (count < 1 || count > maxCount) throw new RangeError(`a batch holds 1 to ${maxCount} items, not ${count}`);
  if (data.length !== 2 + count * itemLength) {
    throw new RangeError(`a batch of ${count} items of ${itemLength} bytes is ${2 + count * itemLength} bytes, not ${data.length}`);
  }
  return Array.from({ length: count }, (_, i) => data.slice(2 + i * itemLength, 2 + (i + 1) * itemLength));
}
