/**
 * A use case's device configuration, read from the gateway's JSON
 * (`GET /v1/use-cases/{name}/config`, docs/gateway.md "The device configuration").
 */
import { fromBase64 } from "./bytes.js";
import { DiscoveryClient, DiscoveryError, type ItemMode, type TagKey, normalizeItem } from "./discovery.js";
import { type PublicKey, sealInner } from "./envelope.js";
import { DeviceError } from "./errors.js";
import { type Item, parseSeed } from "./hashing.js";
import { encodePayload } from "./payloads.js";
import { type RandomSource, Randomizer, optimalWidth } from "./randomize.js";
import { SFP_DEFAULTS, SfpClient, type SfpSettings, encodeWord } from "./sfp.js";

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
  /** The frequency randomizer (null for a discovery use case). */
  readonly randomizer: Randomizer | null;
  /** What the document describes (docs/gateway.md, "Served use cases"). */
  readonly kind: "frequency" | "sfp_word" | "sfp_fragments" | "discovery";
  /** SFP and discovery: the inner report of one item (sealed to the analyzer, or discovery's two
   * layers), instead of the generic randomizer's. */
  readonly inner?: (item: Item, rng: RandomSource) => Promise<Uint8Array>;
  /** Discovery: the reason the use case's item rules refuse an item (null: it is taken). */
  readonly screen?: (item: Item) => string | null;
}

export interface ParseOptions {
  /** A discovery use case's tag key, which the device was provisioned with (never served). */
  readonly tagKey?: TagKey;
}

const SEED_KEYS = new Set(["fragment_hash_seed", "word_hash_seed"]);

/** An SFP document's `sfp.params` (snake_case SfpParams) as SfpSettings. */
function sfpSettings(params: Record<string, unknown>): SfpSettings {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(params)) {
    const camel = key.replace(/_([a-z])/g, (_m, c: string) => c.toUpperCase());
    out[camel] = SEED_KEYS.has(key) ? String(value) : value;
  }
  return { ...SFP_DEFAULTS, ...(out as Partial<SfpSettings>) };
}

async function sfpInner(
  doc: Record<string, any>,
  analyzerKey: PublicKey,
  epoch: number,
): Promise<NonNullable<DeviceConfiguration["inner"]>> {
  const client = await SfpClient.create(sfpSettings((doc["sfp"]["params"] ?? {}) as Record<string, unknown>));
  const useCase = String(doc["use_case"]);
  const s = client.settings;
  if (doc["sfp"]["role"] === "fragments") {
    return async (item, rng) => {
      const report = await client.randomizeFragment(typeof item === "string" ? item : new TextDecoder().decode(item), rng);
      return sealInner(encodePayload(report, client.fragmentRows, s.fragmentM), useCase, epoch, analyzerKey);
    };
  }
  // a string is a word, encoded here; bytes are a word item already encoded (encodeWord)
  return async (item, rng) => {
    const wordItem = typeof item === "string" ? encodeWord(item, s) : item;
    const report = await client.word.randomize(wordItem, rng);
    return sealInner(encodePayload(report, s.wordK, s.wordM), useCase, epoch, analyzerKey);
  };
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
export async function parseConfiguration(body: string, etag: string | null, opts: ParseOptions = {}): Promise<DeviceConfiguration> {
  let doc: Record<string, any>;
  try {
    doc = JSON.parse(body);
  } catch {
    throw fail("is not JSON");
  }
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw fail("is not a JSON object");
  if (doc["discovery"] != null && opts.tagKey === undefined) {
    throw new DeviceError(
      "config",
      `${JSON.stringify(doc["use_case"])} is a discovery use case: its reports are tagged with the use case's tag key, which no gateway serves; give the device the tag key it was provisioned with (tagKey)`,
    );
  }
  const issuer = (doc["token_issuer"] ?? {}) as Record<string, unknown>;
  const upload = (doc["upload"] ?? {}) as Record<string, unknown>;
  const common = {
    useCase: String(doc["use_case"]),
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
  };
  const discovery = doc["discovery"] as Record<string, any> | undefined;
  if (discovery != null && opts.tagKey !== undefined) {
    // GCMS §5.1: nothing to randomize; the server's key inside, the aux server's outside
    const rules = (discovery["item_rules"] ?? {}) as Record<string, unknown>;
    const epoch = int(discovery["epoch"], "discovery.epoch");
    const serverKey = firstKey(discovery["server_keys"], "server");
    let client: DiscoveryClient;
    try {
      client = new DiscoveryClient({
        useCase: String(discovery["use_case"]),
        epoch,
        rules: { maxBytes: int(rules["max_bytes"], "max_bytes"), mode: rules["mode"] as ItemMode, lowercase: Boolean(rules["lowercase"]), strip: true },
        serverKey,
        auxKey: firstKey(discovery["aux_keys"], "aux"),
        tagKey: opts.tagKey,
      });
    } catch (err) {
      throw fail(`of ${JSON.stringify(doc["use_case"])} does not build a discovery client (${(err as Error).message})`);
    }
    return {
      ...common,
      epoch,
      mechanism: "discovery",
      epsilon: 0,
      k: 0,
      m: 0,
      hashSeed: 0n,
      analyzerKey: serverKey,
      randomizer: null,
      kind: "discovery",
      inner: (item) => client.encode(item),
      screen: (item) => {
        try {
          normalizeItem(item, client.rules);
          return null;
        } catch (err) {
          if (err instanceof DiscoveryError) return err.reason;
          throw err;
        }
      },
    };
  }
  const { mechanism, epsilon, k, m, hashSeed, randomizer } = await parseRandomizer(doc);
  const epoch = int(doc["epoch"], "epoch");
  const analyzerKey = firstKey(doc["analyzer_keys"], "analyzer");
  let inner: DeviceConfiguration["inner"];
  let kind: DeviceConfiguration["kind"] = "frequency";
  if (doc["sfp"] != null) {
    kind = doc["sfp"]["role"] === "fragments" ? "sfp_fragments" : "sfp_word";
    try {
      inner = await sfpInner(doc, analyzerKey, epoch);
    } catch (err) {
      throw fail(`of ${JSON.stringify(doc["use_case"])} has SFP settings that build no client (${(err as Error).message})`);
    }
  }
  return {
    ...common,
    kind,
    ...(inner === undefined ? {} : { inner }),
    epoch,
    mechanism,
    epsilon,
    k,
    m,
    hashSeed,
    analyzerKey,
    randomizer,
  };
}
