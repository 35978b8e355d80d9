/**
 * Python's text rules where JavaScript's differ, for encodings the Python reference defines
 * (schemas/discovery.md "Items", docs/sfp.md): internal to the SDK, not exported by index.ts.
 */

import { loneSurrogate } from "./hashing.js";

/** Python's str.isspace characters (str.strip strips exactly these; JS trim differs: U+FEFF, U+001C-1F, U+0085). */
const PY_SPACE = "\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const PY_STRIP = new RegExp(`^[${PY_SPACE}]+|[${PY_SPACE}]+$`, "gu");

/** Python's `str.strip()`: leading and trailing whitespace as Python defines it. */
export function pyStrip(text: string): string {
  return text.replace(PY_STRIP, "");
}

/** Whether a string holds a lone surrogate (then it has no UTF-8, and Python refuses to encode it). */
export function hasLoneSurrogate(text: string): boolean {
  return loneSurrogate(text) >= 0;
}
