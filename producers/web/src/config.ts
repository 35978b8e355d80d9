/**
 * A use case's device configuration, read from the gateway's JSON
 * (`GET /v1/use-cases/{name}/config`, docs/gateway.md "The device configuration").
 */
import { fromBase64 } from "./bytes.js";
import type { PublicKey } from "./envelope.js";
import { DeviceError } from "./errors.js";
import { parseSeed } from "./hashing.js";
import { Randomizer, optimalWidth } from "./randomize.js";

export const KEM_NAME = "DHKEM(X25519, HKDF-SHA256)";

export interface DeviceConfiguration {
  readonly useCase: string;
  readonly epoch: number;
  readonly mechanism: string;
  readonly epsilon: number;
  readonly k: number;
  readonly m: number;
  readonly hashSeed: bigint;
  readonly analyzerKey: PublicKey;
  readonly shufflerKey: PublicKey;
  readonly issuerName: string;
  readonly issuerDirectoryUrl: string;
  readonly originName: string;
  readonly periodSeconds: number;
  readonly contributionLimit: number;
  readonly timePrecisionSeconds: number;
  readonly uploadPath: string;
  readonly maxReportsPerRequest: number;
  readonly maxBodyBytes: number;
  readonly etag: string | null;
  readonly randomizer: Randomizer;
}

const fail = (what: string): DeviceError =>
  new DeviceError("config", `the gateway's device configuration ${what}; is the URL an ldpipe gateway of a compatible version?`);

function int(value: unknown, name: string): number {
  const v = typeof value === "string" && /^[0-9]{1,15}$/.test(value) ? Number(value) : value;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) throw fail(`has ${name} = ${JSON.stringify(value)}, not an integer`);
  return v;
}

function firstKey(entries: unknown, role: string): PublicKey {
  if (!Array.isArray(entries) || entries.length === 0) throw fail(`lists no ${role} key`);
  for (const e of entries as Array<Record<string, unknown>>) {
    if (typeof e !== "object" || e === null || e["kem"] !== KEM_NAME) continue;
    try {
      const raw = fromBase64(String(e["public_key"]));
      if (raw.length === 32) return { keyId: int(e["key_id"], "key_id"), raw };
    } catch {
      continue;
    }
  }
  throw fail(`lists no ${role} key of ${KEM_NAME} that this device can read`);
}

/** The randomizer's fields of a device configuration, read (schemas/randomizers.md "Inputs"). */
export interface RandomizerConfiguration {
  readonly mechanism: string;
  readonly epsilon: number;
  /** Rows and columns (oue: 1 row, one column per dictionary entry). */
  readonly k: number;
  readonly m: number;
  readonly hashSeed: bigint;
  readonly randomizer: Randomizer;
}

/**
 * Build the randomizer from a configuration's `mechanism`, `epsilon`, `parameters` and
 * `hash_seed` (what the gateway serves, and what the conformance harness sends); DeviceError
 * (reason "config") if they do not make one.
 */
export async function parseRandomizer(doc: Record<string, any>): Promise<RandomizerConfiguration> {
  const parameters = (doc["parameters"] ?? {}) as Record<string, unknown>;
  if (typeof parameters !== "object" || Array.isArray(parameters)) throw fail("has parameters that are not a JSON object");
  if (typeof doc["hash_seed"] === "number") {
    // a binary64 number cannot hold every 64-bit seed exactly: the gateway sends a decimal string
    throw fail(`has hash_seed = ${JSON.stringify(doc["hash_seed"])}, a JSON number, not a decimal string`);
  }
  let hashSeed: bigint;
  try {
    // a sketch mechanism's default seed is 0 (ldpipe.schemas.mechanisms.base), as in Python
    hashSeed = doc["hash_seed"] == null ? 0n : parseSeed(String(doc["hash_seed"]));
  } catch {
    throw fail(`has hash_seed = ${JSON.stringify(doc["hash_seed"])}, not an unsigned 64-bit decimal string`);
  }
  const epsilon = Number(doc["epsilon"]);
  const mechanism = String(doc["mechanism"]);
  const options: { p?: number; s?: number; dictionary?: readonly string[] } = {};
  if (parameters["p"] != null) {
    const p = Number(parameters["p"]);
    if (!Number.isFinite(p)) throw fail(`has parameters.p = ${JSON.stringify(parameters["p"])}, not a number`);
    options.p = p;
  }
  if (parameters["s"] != null) options.s = int(parameters["s"], "parameters.s");
  if (parameters["dictionary"] != null) {
    const d = parameters["dictionary"];
    if (!Array.isArray(d) || !d.every((e) => typeof e === "string")) throw fail("has a parameters.dictionary that is not a list of strings");
    options.dictionary = d as string[];
  }
  let k: number;
  let m: number;
  if (mechanism === "oue") {
    // no hash: one row, one column per dictionary entry (schemas/randomizers.md, oue)
    k = 1;
    m = options.dictionary?.length ?? 0;
  } else {
    // the defaults of ldpipe.schemas.mechanisms when the configuration leaves k or m out
    k = int(parameters["k"] ?? 1024, "parameters.k");
    try {
      m =
        parameters["m"] != null
          ? int(parameters["m"], "parameters.m")
          : mechanism === "rrcms"
            ? optimalWidth(
                epsilon,
                String(parameters["objective"] ?? "mse"),
                Number(parameters["f_star"] ?? 1),
                parameters["dictionary_size"] == null ? null : Number(parameters["dictionary_size"]),
              )
            : 1024;
    } catch (err) {
      throw err instanceof DeviceError ? err : fail(`has rrcms parameters that give no width (${(err as Error).message})`);
    }
  }
  let randomizer: Randomizer;
  try {
    randomizer = await Randomizer.create(mechanism, epsilon, hashSeed, k, m, options);
  } catch (err) {
    const of = doc["use_case"] == null ? "" : `of ${JSON.stringify(doc["use_case"])} `;
    throw fail(`${of}does not build a randomizer (${(err as Error).message})`);
  }
  return { mechanism, epsilon, k, m, hashSeed, randomizer };
}

/** Read the gateway's document; DeviceError (reason "config") if it is not one. */
export async function parseConfiguration(body: string, etag: string | null): Promise<DeviceConfiguration> {
  let doc: Record<string, any>;
  try {
    doc = JSON.parse(body);
  } catch {
    throw fail("is not JSON");
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw fail("is not a JSON object");
  const { mechanism, epsilon, k, m, hashSeed, randomizer } = await parseRandomizer(doc);
  const issuer = (doc["token_issuer"] ?? {}) as Record<string, unknown>;
  const upload = (doc["upload"] ?? {}) as Record<string, unknown>;
  return {
    useCase: String(doc["use_case"]),
    epoch: int(doc["epoch"], "epoch"),
    mechanism,
    epsilon,
    k,
    m,
    hashSeed,
    analyzerKey: firstKey(doc["analyzer_keys"], "analyzer"),
    shufflerKey: firstKey(doc["shuffler_keys"], "shuffler"),
    issuerName: String(issuer["name"]),
    issuerDirectoryUrl: String(issuer["directory_url"]),
    originName: String(doc["origin_name"]),
    periodSeconds: int(doc["period_seconds"], "period_seconds"),
    contributionLimit: int(doc["contribution_limit"], "contribution_limit"),
    timePrecisionSeconds: int(doc["time_precision_seconds"] ?? 3600, "time_precision_seconds"),
    uploadPath: String(upload["path"]),
    maxReportsPerRequest: int(upload["max_reports_per_request"], "upload.max_reports_per_request"),
    maxBodyBytes: int(upload["max_body_bytes"], "upload.max_body_bytes"),
    etag,
    randomizer,
  };
}
