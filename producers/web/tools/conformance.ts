/**
 * The TypeScript SDK's randomizer behind the conformance line protocol (docs/conformance.md):
 * `ldpipe conformance --client "node producers/web/dist/conformance.mjs"`.
 *
 * One JSON request per line on stdin (`config`: the device configuration's mechanism, epsilon,
 * parameters and hash_seed; `item`; `count`), one line `{"payloads": [hex, ...]}` per request:
 * `count` independent reports of the item, made by the code a device runs (`parseRandomizer`,
 * `Randomizer.randomize`, `encodePayload`), unsealed; `{"error": "one line"}` for a request it
 * cannot serve. Randomness: crypto.getRandomValues, as on a device; `--seed N` fixes a seeded
 * generator instead, for reproducible tests only. Exits when stdin closes.
 */
import { createInterface } from "node:readline";
import { parseRandomizer } from "../src/config.js";
import { toHex } from "../src/bytes.js";
import { encodePayload } from "../src/payloads.js";
import { type RandomSource, cryptoRandom } from "../src/randomize.js";
import { seededRandom } from "../src/testing.js";

const MAX_COUNT = 10_000_000;

function options(argv: readonly string[]): { rng: RandomSource } {
  let rng: RandomSource = cryptoRandom;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--seed" && /^[0-9]{1,20}$/.test(argv[i + 1] ?? "")) {
      rng = seededRandom(BigInt(argv[++i]!));
    } else if (arg === "--help" || arg === "-h") {
      process.stdout.write("usage: node conformance.mjs [--seed N]\n");
      process.exit(0);
    } else {
      process.stderr.write(`conformance.mjs: unknown option ${JSON.stringify(arg)}; give --seed N (an unsigned decimal) or nothing\n`);
      process.exit(2);
    }
  }
  return { rng };
}

/** The reply to one request line. */
export async function answer(line: string, rng: RandomSource): Promise<Record<string, unknown>> {
  let request: any;
  try {
    request = JSON.parse(line);
  } catch {
    return { error: "the request is not one JSON line" };
  }
  if (typeof request !== "object" || request === null || Array.isArray(request)) return { error: "the request is not a JSON object" };
  const { config, item, count } = request as Record<string, unknown>;
  if (config === undefined || item === undefined || count === undefined) {
    return { error: "the request lacks config, item or count; it needs all three" };
  }
  if (typeof config !== "object" || config === null || typeof item !== "string") {
    return { error: '"config" must be an object and "item" a string' };
  }
  if (typeof count !== "number" || !Number.isInteger(count) || count < 1 || count > MAX_COUNT) {
    return { error: `"count" must be an integer in [1, ${MAX_COUNT}], got ${JSON.stringify(count)}` };
  }
  try {
    const { k, m, randomizer } = await parseRandomizer(config as Record<string, unknown>);
    const payloads: string[] = [];
    for (let i = 0; i < count; i++) payloads.push(toHex(encodePayload(await randomizer.randomize(item, rng), k, m)));
    return { payloads };
  } catch (err) {
    return { error: String((err as Error).message).split("\n")[0] };
  }
}

async function main(): Promise<void> {
  const { rng } = options(process.argv.slice(2));
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (line.trim() === "") continue;
    const reply = JSON.stringify(await answer(line, rng)) + "\n";
    if (!process.stdout.write(reply)) await new Promise((resolve) => process.stdout.once("drain", resolve));
  }
}

await main();
