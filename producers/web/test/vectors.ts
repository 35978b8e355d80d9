import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** schemas/vectors/<name>.json (the tests run from dist/test/, four levels below the repo). */
export function vectors(name: string): any {
  const url = new URL(`../../../../schemas/vectors/${name}.json`, import.meta.url);
  // integers beyond 2^53 (times, periods) become decimal strings so that no digit is lost
  const text = readFileSync(fileURLToPath(url), "utf8").replace(/(:\s*)(\d{16,})(?=\s*[,}\]])/g, '$1"$2"');
  return JSON.parse(text);
}
