/**
 * Discovery reports (GCMS paper §5.1, Alg. 5; schemas/discovery.md): v = E_aux(E_server(d) ‖ H(d)).
 * The item is normalized and bounded ("Items"), tagged with the keyed HMAC ("Tag"), padded into
 * the item payload and sealed to the server as `<uc>.disc.srv` ("Inner layer"), then put with its
 * tag into the outer payload sealed to the aux server as `<uc>.disc.aux` ("Outer layer"); a
 * nested use case seals that once more to the discovery shuffler (`<uc>.discovery`, outer v3).
 * As ldpipe.schemas.discovery.client.DiscoveryClient, byte for byte.
 */
import { ascii, concat, u32le } from "./bytes.js";
import { type PublicKey, type SealOptions, roundTime, sealInner, sealOuter } from "./envelope.js";
import { hasLoneSurrogate, pyStrip } from "./pytext.js";

export type ItemMode = "text" | "url";

/** How items are normalized and bounded (ldpipe.schemas.discovery.item.ItemRules). */
export interface ItemRules {
  readonly maxBytes: number;
  readonly mode: ItemMode;
  readonly lowercase: boolean;
  readonly strip: boolean;
}

export const DEFAULT_ITEM_RULES: ItemRules = { maxBytes: 64, mode: "text", lowercase: false, strip: true };

/** Device-side refusal reasons of schemas/discovery.md ("Validation"). */
export type DiscoveryReason = "not_text" | "invalid_utf8" | "not_a_url" | "url_too_long" | "empty_item";

export class DiscoveryError extends Error {
  constructor(
    readonly reason: DiscoveryReason,
    message: string,
  ) {
    super(message);
    this.name = "DiscoveryError";
  }
}

const utf8 = new TextEncoder();
const byteLength = (s: string): number => utf8.encode(s).length;
const ZWJ = "\u200d";
const DEFAULT_PORTS: Readonly<Record<string, number>> = { http: 80, https: 443 };

function checkRules(rules: ItemRules): void {
  if (!Number.isInteger(rules.maxBytes) || rules.maxBytes < 1 || rules.maxBytes > 1024) {
    throw new RangeError(`max_bytes must be an integer in [1, 1024], got ${rules.maxBytes}`);
  }
  if (rules.mode !== "text" && rules.mode !== "url") throw new RangeError(`mode must be 'text' or 'url', got ${String(rules.mode)}`);
}

function asText(item: unknown): string {
  if (item instanceof Uint8Array) {
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(item);
    } catch {
      throw new DiscoveryError("invalid_utf8", "item bytes are not UTF-8; pass text");
    }
  }
  if (typeof item !== "string") throw new DiscoveryError("not_text", `an item must be a string or bytes, got ${typeof item}`);
  if (hasLoneSurrogate(item)) throw new DiscoveryError("invalid_utf8", "item has a lone surrogate, which UTF-8 cannot encode");
  return item;
}

const notAUrl = (why: string): DiscoveryError =>
  new DiscoveryError("not_a_url", `item is not an absolute URL with a host (${why}); the use case is in url mode, so report items like 'https://example.com/path'`);

/** Python's str.partition: [before, separator found, after]. */
function partition(text: string, sep: string): [string, boolean, string] {
  const at = text.indexOf(sep);
  return at < 0 ? [text, false, ""] : [text.slice(0, at), true, text.slice(at + sep.length)];
}

/** ipaddress.IPv4Address's parse (Python 3.11: four decimal octets, no leading zeros). */
function isIPv4(text: string): boolean {
  const octets = text.split(".");
  return (
    octets.length === 4 &&
    octets.every((o) => /^[0-9]{1,3}$/.test(o) && Number(o) <= 255 && (o === "0" || o[0] !== "0"))
  );
}

/** ipaddress.IPv6Address's parse (Python 3.11): hextets, one "::", a trailing IPv4, a %scope. */
function isIPv6(text: string): boolean {
  const [address, scoped, scope] = partition(text, "%");
  if (scoped && (scope === "" || scope.includes("%"))) return false;
  const parts = address.split(":");
  if (parts.length < 3) return false;
  if (parts[parts.length - 1]!.includes(".")) {
    if (!isIPv4(parts.pop()!)) return false;
    parts.push("0", "0");
  }
  if (parts.length > 9) return false;
  let skip: number | null = null;
  for (let i = 1; i < parts.length - 1; i++) {
    if (parts[i] !== "") continue;
    if (skip !== null) return false;
    skip = i;
  }
  let hextets: string[];
  if (skip !== null) {
    let hi = skip;
    let lo = parts.length - skip - 1;
    if (parts[0] === "" && --hi !== 0) return false;
    if (parts[parts.length - 1] === "" && --lo !== 0) return false;
    if (8 - (hi + lo) < 1) return false;
    hextets = [...parts.slice(parts[0] === "" ? 1 : 0, skip), ...parts.slice(skip + 1, parts.length - (parts[parts.length - 1] === "" ? 1 : 0))];
  } else {
    if (parts.length !== 8 || parts[0] === "" || parts[7] === "") return false;
    hextets = parts;
  }
  return hextets.every((h) => /^[0-9A-Fa-f]{1,4}$/.test(h));
}

/**
 * Step 3, url mode: urllib.parse.urlsplit's reading of scheme, netloc and path as Python 3.11
 * does it (leading C0 controls and spaces stripped, tab/CR/LF removed; a bracketed host must be
 * an IPv6 address or IPvFuture; a non-ASCII netloc must not gain "/?#@:" under NFKC), the
 * hostname (lower-cased up to a "%" zone) and port, then scheme://host[:port]path.
 */
function normalizeUrl(input: string): string {
  // eslint-disable-next-line no-control-regex
  let url = input.replace(/^[\x00-\x20]+/, "").replace(/[\t\r\n]/g, "");
  let scheme = "";
  const colon = url.indexOf(":");
  if (colon > 0 && /^[A-Za-z][A-Za-z0-9+.-]*$/.test(url.slice(0, colon))) {
    scheme = url.slice(0, colon).toLowerCase();
    url = url.slice(colon + 1);
  }
  let netloc = "";
  if (url.startsWith("//")) {
    const rest = url.slice(2);
    const end = rest.search(/[/?#]/);
    netloc = end < 0 ? rest : rest.slice(0, end);
    url = end < 0 ? "" : rest.slice(end);
    const open = netloc.includes("[");
    if (open !== netloc.includes("]")) throw notAUrl("Invalid IPv6 URL");
    if (open) {
      const bracketed = partition(partition(netloc, "[")[2], "]")[0];
      if (bracketed.startsWith("v")) {
        if (!/^v[a-fA-F0-9]+\.[^\n]+$/.test(bracketed)) throw notAUrl("IPvFuture address is invalid");
      } else if (isIPv4(bracketed)) {
        throw notAUrl("An IPv4 address cannot be in brackets");
      } else if (!isIPv6(bracketed)) {
        throw notAUrl("does not appear to be an IPv4 or IPv6 address");
      }
    }
  }
  // eslint-disable-next-line no-control-regex
  if (netloc !== "" && /[^\x00-\x7f]/.test(netloc)) {
    const bare = netloc.replace(/[@:#?]/g, "");
    const folded = bare.normalize("NFKC");
    if (folded !== bare && /[/?#@:]/.test(folded)) throw notAUrl("netloc contains invalid characters under NFKC normalization");
  }
  const path = url.split(/[?#]/, 1)[0]!;
  const hostinfo = netloc.slice(netloc.lastIndexOf("@") + 1);
  let hostname: string;
  let portText: string;
  const [, bracket, bracketed] = partition(hostinfo, "[");
  if (bracket) {
    const [inside, , after] = partition(bracketed, "]");
    hostname = inside;
    portText = partition(after, ":")[2];
  } else {
    [hostname, , portText] = partition(hostinfo, ":");
  }
  let port: number | null = null;
  if (portText !== "") {
    if (!/^[0-9]+$/.test(portText)) throw notAUrl(`Port could not be cast to integer value as '${portText}'`);
    port = Number(portText);
    if (port > 65535) throw notAUrl("Port out of range 0-65535");
  }
  const [name, zoned, zone] = partition(hostname, "%");
  let host = name.toLowerCase() + (zoned ? "%" + zone : "");
  if (!scheme || !host) throw notAUrl("no scheme or no host");
  if (/[\p{White_Space}\p{C}]/u.test(host)) throw notAUrl("whitespace or a control character in the host");
  if (host.includes(":")) host = `[${host}]`;
  const portPart = port === null || DEFAULT_PORTS[scheme] === port ? "" : `:${port}`;
  return `${scheme}://${host}${portPart}${path || "/"}`.normalize("NFC");
}

/** How many leading code points of `chars` fit in `limit` UTF-8 bytes. */
function fittingChars(chars: readonly string[], limit: number): number {
  let total = 0;
  for (const [i, c] of chars.entries()) {
    total += byteLength(c);
    if (total > limit) return i;
  }
  return chars.length;
}

const isRegionalIndicator = (c: string): boolean => c >= "\u{1f1e6}" && c <= "\u{1f1ff}";

function splitsCluster(chars: readonly string[], cut: number): boolean {
  const after = chars[cut]!;
  const before = chars[cut - 1]!;
  if (/^\p{M}$/u.test(after) || after === ZWJ || before === ZWJ) return true;
  if (after >= "\u{1f3fb}" && after <= "\u{1f3ff}") return true;
  if (isRegionalIndicator(after) && isRegionalIndicator(before)) {
    let run = 0;
    while (run < cut && isRegionalIndicator(chars[cut - 1 - run]!)) run++;
    return run % 2 === 1;
  }
  return false;
}

function textCut(chars: readonly string[], limit: number): number {
  const fit = fittingChars(chars, limit);
  let cut = fit;
  while (cut > 0 && cut < chars.length && splitsCluster(chars, cut)) cut--;
  if (cut === 0) {
    cut = fit;
    while (cut > 1 && chars[cut - 1] === ZWJ) cut--;
  }
  return cut;
}

/** Step 1-5 of schemas/discovery.md "Items": the normalized, bounded item; DiscoveryError if refused. */
export function normalizeItem(item: unknown, rules: ItemRules = DEFAULT_ITEM_RULES): string {
  checkRules(rules);
  let text = asText(item).normalize("NFC");
  if (rules.strip) text = pyStrip(text);
  if (rules.lowercase) text = text.toLowerCase().normalize("NFC");
  if (rules.mode === "url") {
    text = normalizeUrl(text);
    if (rules.strip) text = pyStrip(text);
  }
  while (byteLength(text) > rules.maxBytes) {
    const chars = Array.from(text);
    const cut = rules.mode === "url" ? urlCut(chars, rules.maxBytes) : textCut(chars, rules.maxBytes);
    text = chars.slice(0, cut).join("").normalize("NFC");
    if (rules.strip) text = pyStrip(text);
  }
  if (text === "") throw new DiscoveryError("empty_item", "the item is empty after normalization (NFC, strip); a device does not report an empty item");
  return text;
}

/**
 * Where to cut a normalized URL (code points): after the last path "/" that fits, else after the
 * origin scheme://host[:port]; url_too_long if the origin does not fit.
 */
function urlCut(chars: readonly string[], limit: number): number {
  let start = -1;
  for (let i = 0; i + 3 <= chars.length && start < 0; i++) {
    if (chars[i] === ":" && chars[i + 1] === "/" && chars[i + 2] === "/") start = i;
  }
  const slash = start >= 0 ? chars.indexOf("/", start + 3) : -1;
  const origin = slash < 0 ? chars.join("") : chars.slice(0, slash).join("");
  if (slash < 0 || byteLength(origin) > limit) {
    throw new DiscoveryError(
      "url_too_long",
      `the URL's scheme://host[:port] is ${byteLength(origin)} bytes, more than the use case's max_bytes (${limit}); raise max_bytes`,
    );
  }
  const fit = fittingChars(chars, limit);
  for (let i = fit - 1; i >= slash; i--) if (chars[i] === "/") return i + 1;
  return slash;
}

export const DISCOVERY_TAG_LENGTH = 16;
export const DISCOVERY_TAG_KEY_LENGTH = 32;
const TAG_DOMAIN = concat(ascii("ldpipe/discovery-tag/v1"), new Uint8Array([0]));

/** A tag key: its u32 id and 32 secret bytes (schemas/discovery.md "Tag"). */
export interface TagKey {
  readonly keyId: number;
  readonly secret: Uint8Array;
}

/** The HMAC input: domain ‖ u8 len(use case) ‖ use case ‖ item (UTF-8). */
export function tagMessage(useCase: string, item: string): Uint8Array {
  const name = ascii(useCase);
  return concat(TAG_DOMAIN, new Uint8Array([name.length]), name, utf8.encode(item));
}

/** H(d) of a normalized item: HMAC-SHA256(K, tagMessage)[0..16). */
export async function discoveryTag(key: TagKey, useCase: string, item: string): Promise<Uint8Array> {
  if (key.secret.length !== DISCOVERY_TAG_KEY_LENGTH) throw new RangeError(`a tag key is ${DISCOVERY_TAG_KEY_LENGTH} bytes`);
  const hmacKey = await crypto.subtle.importKey("raw", key.secret, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const mac = new Uint8Array(await crypto.subtle.sign("HMAC", hmacKey, tagMessage(useCase, item)));
  return mac.slice(0, DISCOVERY_TAG_LENGTH);
}

/** The inner plaintext: version 1 ‖ u16 item length ‖ item ‖ zeros up to 3 + maxBytes bytes. */
export function encodeItemPayload(item: string, maxBytes: number): Uint8Array {
  const raw = utf8.encode(item);
  if (raw.length < 1 || raw.length > maxBytes) {
    throw new RangeError(`a normalized item is 1-${maxBytes} UTF-8 bytes, got ${raw.length}; normalize it with normalizeItem first`);
  }
  const out = new Uint8Array(3 + maxBytes);
  out[0] = 1;
  new DataView(out.buffer).setUint16(1, raw.length, true);
  out.set(raw, 3);
  return out;
}

/** The outer plaintext: version 1 ‖ u32 tag key id ‖ tag[16] ‖ inner envelope. */
export function encodeOuterPayload(tagKeyId: number, tag: Uint8Array, inner: Uint8Array): Uint8Array {
  if (tag.length !== DISCOVERY_TAG_LENGTH) throw new RangeError(`a tag is ${DISCOVERY_TAG_LENGTH} bytes, got ${tag.length}`);
  return concat(new Uint8Array([1]), u32le(tagKeyId), tag, inner);
}

/** What a discovery device holds for one use case: public keys and the tag key. */
export interface DiscoveryTarget {
  /** 1-42 characters of [a-z0-9_.-]; the layers append .disc.srv and .disc.aux. */
  readonly useCase: string;
  readonly epoch: number;
  readonly rules?: ItemRules;
  readonly serverKey: PublicKey;
  readonly auxKey: PublicKey;
  readonly tagKey: TagKey;
  /** Nested use cases: the discovery shuffler's key; its use case is `<uc>.discovery` unless given. */
  readonly shufflerKey?: PublicKey;
  readonly shufflerUseCase?: string;
  readonly timePrecisionSeconds?: number;
}

/** Options for tests: fixed ephemeral keys of each layer, a report id and a clock. */
export interface DiscoverySealOptions {
  readonly inner?: SealOptions;
  readonly outer?: SealOptions;
  readonly shuffler?: SealOptions & { reportId?: Uint8Array };
  readonly clock?: () => number;
}

/** Makes discovery reports for one use case (GCMS Alg. 5). */
export class DiscoveryClient {
  readonly rules: ItemRules;

  constructor(readonly target: DiscoveryTarget) {
    const uc = target.useCase;
    if (!/^[a-z0-9_.-]{1,42}$/.test(uc) || uc.endsWith(".disc.srv") || uc.endsWith(".disc.aux")) {
      throw new RangeError(`discovery use case id ${JSON.stringify(uc)} is invalid; use 1-42 characters of [a-z0-9_.-] not ending in .disc.srv or .disc.aux`);
    }
    if (target.serverKey.raw.length === target.auxKey.raw.length && target.serverKey.raw.every((b, i) => b === target.auxKey.raw[i])) {
      throw new RangeError("the server and the aux server must have different keys: the aux server must not be able to open the inner layer");
    }
    this.rules = target.rules ?? DEFAULT_ITEM_RULES;
    checkRules(this.rules);
  }

  /** The report of an item already normalized with the use case's rules. */
  async encodeNormalized(item: string, opts: DiscoverySealOptions = {}): Promise<Uint8Array> {
    const t = this.target;
    const innerUseCase = `${t.useCase}.disc.srv`;
    const outerUseCase = `${t.useCase}.disc.aux`;
    const inner = await sealInner(encodeItemPayload(item, this.rules.maxBytes), innerUseCase, t.epoch, t.serverKey, { ...(opts.inner ?? {}), version: 1 });
    const tag = await discoveryTag(t.tagKey, t.useCase, item);
    const outer = encodeOuterPayload(t.tagKey.keyId, tag, inner);
    const report = await sealInner(outer, outerUseCase, t.epoch, t.auxKey, { ...(opts.outer ?? {}), version: 1 });
    if (t.shufflerKey === undefined) return report;
    const now = (opts.clock ?? (() => Date.now() / 1000))();
    const time = roundTime(now, t.timePrecisionSeconds ?? 3600);
    return sealOuter(report, t.shufflerUseCase ?? `${t.useCase}.discovery`, t.shufflerKey, time, opts.shuffler ?? {});
  }

  /** The report of one item; DiscoveryError if it cannot be normalized (a device then sends nothing). */
  async encode(item: string | Uint8Array, opts: DiscoverySealOptions = {}): Promise<Uint8Array> {
    return this.encodeNormalized(normalizeItem(item, this.rules), opts);
  }
}
