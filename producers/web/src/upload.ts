/** Upload batches (schemas/upload.md): LDU ‖ 1 ‖ u16 count, then token[354] ‖ u32 length ‖ envelope. */
import { ascii, concat, u32le } from "./bytes.js";

export const MEDIA_TYPE = "application/vnd.ldpipe.upload";
export const TOKEN_LENGTH = 354;
export const BATCH_FIXED_LENGTH = 6;
export const REPORT_FIXED_LENGTH = TOKEN_LENGTH + 4;

export interface UploadReport {
  readonly token: Uint8Array;
  readonly envelope: Uint8Array;
}

export function encodeBatch(reports: readonly UploadReport[]): Uint8Array {
  if (reports.length < 1 || reports.length > 65535) throw new RangeError(`a batch holds 1..65535 reports, not ${reports.length}`);
  const count = new Uint8Array(2);
  new DataView(count.buffer).setUint16(0, reports.length, true);
  const parts: Uint8Array[] = [ascii("LDU"), new Uint8Array([1]), count];
  for (const r of reports) {
    if (r.token.length !== TOKEN_LENGTH) throw new RangeError(`a token is ${TOKEN_LENGTH} bytes, not ${r.token.length}`);
    if (r.envelope.length < 1 || r.envelope.length > 1 << 20) throw new RangeError("an envelope is 1 byte to 1 MiB");
    parts.push(r.token, u32le(r.envelope.length), r.envelope);
  }
  return concat(...parts);
}

/** The gateway's answer to a batch that parsed. */
export interface UploadAnswer {
  readonly accepted: number;
  readonly refused: ReadonlyArray<{ index: number; reason: string; detail?: string }>;
}

export function parseAnswer(text: string): UploadAnswer {
  const doc: unknown = JSON.parse(text);
  if (typeof doc !== "object" || doc === null) throw new SyntaxError("the upload answer is not a JSON object");
  const { accepted, refused } = doc as { accepted?: unknown; refused?: unknown };
  if (typeof accepted !== "number" || !Array.isArray(refused)) throw new SyntaxError("the upload answer lacks accepted/refused");
  return { accepted, refused: refused as UploadAnswer["refused"] };
}
