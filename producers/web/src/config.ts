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

/** Read the gateway's document; DeviceError (reason "config") if it is not one. */
export async function parseConfiguration(body: string, etag: string | null): Promise<DeviceConfiguration> {
  let doc: Record<string, any>;
  try {
    doc = JSON.parse(body);
  } catch {
    throw fail("is not JSON");
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw fail("is not a JSON object");
  // an SFP fragments use case or a discovery use case (docs/gateway.md, "Served use cases"):
  // the generic randomizer would hash the fragment with the stacked sketch's function (row
  // l k' + j is SfpClient's to make), and discovery has nothing to randomize; refuse rather
  // than send reports the server reads as other items. (An SFP word use case's reports are
  // ordinary ones of the encoded word: send encodeWord(word, settings).)
  const fragments = doc["sfp"] != null && doc["sfp"]["role"] === "fragments";
  if (fragments || doc["discovery"] != null) {
    const kind = fragments ? "an SFP fragments use case" : "a discovery use case";
    throw new DeviceError(
      "config",
      `${JSON.stringify(doc["use_case"])} is ${kind}, which WebDevice does not send yet; make its reports with SfpClient or DiscoveryClient (docs/device-web.md)`,
    );
  }
  const parameters = (doc["parameters"] ?? {}) as Record<string, unknown>;
  const issuer = (doc["token_issuer"] ?? {}) as Record<string, unknown>;
  const upload = (doc["upload"] ?? {}) as Record<string, unknown>;
  let hashSeed: bigint;
  try {
    // a sketch mechanism's default seed is 0 (ldpipe.schemas.mechanisms.base), as in Python
    hashSeed = doc["hash_seed"] == null ? 0n : parseSeed(String(doc["hash_seed"]));
  } catch {
    throw fail(`has hash_seed = ${JSON.stringify(doc["hash_seed"])}, not an unsigned 64-bit decimal string`);
  }
  const epsilon = Number(doc["epsilon"]);
  const mechanism = String(doc["mechanism"]);
  // the defaults of ldpipe.schemas.mechanisms when the configuration leaves k or m out
  const k = int(parameters["k"] ?? 1024, "parameters.k");
  let m: number;
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
  let randomizer: Randomizer;
  try {
    randomizer = await Randomizer.create(mechanism, epsilon, hashSeed, k, m);
  } catch (err) {
    throw fail(`of ${JSON.stringify(doc["use_case"])} does not build a randomizer (${(err as Error).message})`);
  }
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
