/** Privacy Pass challenge for ldpipe tokens, type 0x0002 (schemas/tokens.md, RFC 9577 §2.1.1). */
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
