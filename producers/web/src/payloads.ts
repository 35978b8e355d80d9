/** The client payload, format v1 (schemas/payloads.md): header, then a mechanism's body. */
import { concat, u32le } from "./bytes.js";

export const MECHANISM_CODES = { cms: 1, hcms: 2, gcms: 3, ocms: 4, rrcms: 5, oue: 6 } as const;
export type MechanismName = keyof typeof MECHANISM_CODES;

/** One randomized report, as the payload encodes it. */
export type Report =
  | { mechanism: "cms" | "oue"; row: number; bits: Uint8Array }
  | { mechanism: "hcms"; row: number; column: number; sign: 1 | -1 }
  | { mechanism: "gcms" | "ocms"; row: number; indices: readonly number[] }
  | { mechanism: "rrcms"; row: number; value: number };

export class PayloadError extends Error {
  constructor(
    readonly reason: string,
    message: string,
  ) {
    super(message);
    this.name = "PayloadError";
  }
}

/** Encode one report for a parameter set (k rows, m columns); applies rules 4-8 of payloads.md. */
export function encodePayload(report: Report, k: number, m: number): Uint8Array {
  if (!Number.isInteger(report.row) || report.row < 0 || report.row >= k) {
    throw new PayloadError("row_out_of_range", `row ${report.row} is not below k = ${k}`);
  }
  const header = concat(new Uint8Array([1, MECHANISM_CODES[report.mechanism]]), u32le(report.row));
  const index = (v: number): Uint8Array => {
    if (!Number.isInteger(v) || v < 0 || v >= m) {
      throw new PayloadError("index_out_of_range", `index ${v} is not below m = ${m}`);
    }
    return u32le(v);
  };
  switch (report.mechanism) {
    case "cms":
    case "oue": {
      const B = Math.ceil(m / 8);
      if (report.bits.length !== B) throw new PayloadError("wrong_length", `bits must be ${B} bytes`);
      if (m % 8 !== 0 && (report.bits[B - 1]! >> (m % 8)) !== 0) {
        throw new PayloadError("nonzero_padding", "a padding bit of the last byte is set");
      }
      return concat(header, report.bits);
    }
    case "hcms":
      return concat(header, index(report.column), new Uint8Array([report.sign === 1 ? 1 : 0]));
    case "gcms":
    case "ocms": {
      for (let i = 1; i < report.indices.length; i++) {
        if (report.indices[i]! <= report.indices[i - 1]!) {
          throw new PayloadError("indices_not_ascending", "indices must be strictly ascending");
        }
      }
      return concat(header, ...report.indices.map(index));
    }
    case "rrcms":
      return concat(header, index(report.value));
  }
}
