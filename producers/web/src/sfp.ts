/**
 * Apple's Sequence Fragment Puzzle on the device (Apple §4.3, Alg. 9; docs/sfp.md): for one word,
 * a word report (the normalized, padded word at ε, the SFP use case's own sketch) and a fragment
 * report (a uniform position l and the fragment item h(s) ‖ "|" ‖ s[l·len, (l+1)·len) at ε′, sent
 * to `<name>.fragments` in row l·k′ + j). Encodings as ldpipe.schemas.discovery.sfp_words; the
 * randomizers are this SDK's cms/hcms (schemas/randomizers.md), rows as schemas/discovery/sfp_wire.py.
 */
import { ascii, concat, sha256 } from "./bytes.js";
import { type PublicKey, type SealOptions, roundTime, sealInner, sealOuter } from "./envelope.js";
import { encodePayload, type Report } from "./payloads.js";
import { pyStrip, hasLoneSurrogate } from "./pytext.js";
import { type RandomSource, Randomizer, cryptoRandom, uniformInt } from "./randomize.js";

/** Every SFP setting a device needs; defaults are Apple's §6.1 deployment (ldpipe's SfpParams). */
export interface SfpSettings {
  readonly epsilonFragment: number;
  readonly epsilonWord: number;
  readonly wordLength: number;
  readonly fragmentLength: number;
  readonly pieceBits: number;
  readonly pad: string;
  readonly lowercase: boolean;
  readonly fragmentMechanism: "cms" | "hcms";
  readonly fragmentK: number;
  readonly fragmentM: number;
  readonly fragmentHashSeed: string | bigint;
  readonly wordMechanism: "cms" | "hcms";
  readonly wordK: number;
  readonly wordM: number;
  readonly wordHashSeed: string | bigint;
}

export const SFP_DEFAULTS: SfpSettings = {
  epsilonFragment: 6,
  epsilonWord: 2,
  wordLength: 10,
  fragmentLength: 2,
  pieceBits: 8,
  pad: " ",
  lowercase: true,
  fragmentMechanism: "cms",
  fragmentK: 2048,
  fragmentM: 1024,
  fragmentHashSeed: 0x5f9fn,
  wordMechanism: "cms",
  wordK: 2048,
  wordM: 1024,
  wordHashSeed: 0x5f9en,
};

const PIECE_DOMAIN = concat(ascii("ldpipe/sfp-piece/v1"), new Uint8Array([0]));
const SEPARATOR = ascii("|");

/** Unicode code points of a string (what Python indexes and slices by). */
function codePoints(text: string): string[] {
  return Array.from(text);
}

/** NFC, surrounding whitespace stripped, then (lowercase) lower-cased and NFC again. */
export function cleanWord(word: string, settings: SfpSettings = SFP_DEFAULTS): string {
  if (typeof word !== "string") throw new TypeError(`a word must be a string, got ${typeof word}`);
  if (hasLoneSurrogate(word)) throw new RangeError("a word must not hold a lone surrogate (it has no UTF-8)");
  let text = pyStrip(word.normalize("NFC"));
  if (settings.lowercase) text = text.toLowerCase().normalize("NFC");
  return text;
}

/** The first `wordLength` code points of the clean word, right-padded with `pad`. */
export function normalizeWord(word: string, settings: SfpSettings = SFP_DEFAULTS): string {
  const chars = codePoints(cleanWord(word, settings)).slice(0, settings.wordLength);
  return chars.join("") + settings.pad.repeat(settings.wordLength - chars.length);
}

/** The word item a device reports: the normalized word's UTF-8. */
export function encodeWord(word: string, settings: SfpSettings = SFP_DEFAULTS): Uint8Array {
  return new TextEncoder().encode(normalizeWord(word, settings));
}

/** The puzzle piece h(s): SHA-256("ldpipe/sfp-piece/v1" ‖ 0x00 ‖ word item)[0] >> (8 − pieceBits). */
export async function pieceOf(wordItem: Uint8Array, pieceBits: number): Promise<number> {
  if (!Number.isInteger(pieceBits) || pieceBits < 1 || pieceBits > 8) throw new RangeError(`piece_bits ${pieceBits} is outside 1..8`);
  return (await sha256(concat(PIECE_DOMAIN, wordItem)))[0]! >> (8 - pieceBits);
}

/** The fragment item: one piece byte, "|", the fragment's UTF-8. */
export function fragmentItem(piece: number, fragment: string): Uint8Array {
  if (!Number.isInteger(piece) || piece < 0 || piece > 255) throw new RangeError(`piece ${piece} is outside 0..255`);
  return concat(new Uint8Array([piece]), SEPARATOR, new TextEncoder().encode(fragment));
}

/** What a word encodes to: the padded word, its item, its piece and one fragment item per position. */
export interface SfpWord {
  readonly word: string;
  readonly wordItem: Uint8Array;
  readonly piece: number;
  readonly fragmentItems: readonly Uint8Array[];
}

/** The encodings of one word (ldpipe.schemas.discovery.sfp_device.encode_words for one device). */
export async function encodeSfpWord(word: string, settings: SfpSettings = SFP_DEFAULTS): Promise<SfpWord> {
  const padded = normalizeWord(word, settings);
  const wordItem = new TextEncoder().encode(padded);
  const piece = await pieceOf(wordItem, settings.pieceBits);
  const chars = codePoints(padded);
  const fragmentItems: Uint8Array[] = [];
  for (let start = 0; start < settings.wordLength; start += settings.fragmentLength) {
    fragmentItems.push(fragmentItem(piece, chars.slice(start, start + settings.fragmentLength).join("")));
  }
  return { word: padded, wordItem, piece, fragmentItems };
}

/** One device's two randomized reports: the word report and the fragment report (row l·k′ + j). */
export interface SfpReportPair {
  readonly word: Report;
  readonly position: number;
  readonly fragment: Report;
}

/** The two payloads (schemas/payloads.md) of one device's SFP reports. */
export interface SfpPayloads {
  readonly word: Uint8Array;
  readonly fragment: Uint8Array;
}

/** The two envelopes of one device's SFP reports: what it sends to each use case. */
export type SfpEnvelopes = SfpPayloads;

/** Where the two reports go: the SFP use case (word) and `<name>.fragments`, and their keys. */
export interface SfpTarget {
  readonly useCase: string;
  readonly epoch: number;
  readonly analyzerKey: PublicKey;
  /** Nested use cases: the shuffler's key (both halves share the shuffle settings). */
  readonly shufflerKey?: PublicKey;
  readonly timePrecisionSeconds?: number;
}

/** The SFP device of one parameter set: randomizes and seals a word's report pair. */
export class SfpClient {
  private constructor(
    readonly settings: SfpSettings,
    readonly word: Randomizer,
    readonly fragment: Randomizer,
  ) {}

  static async create(overrides: Partial<SfpSettings> = {}): Promise<SfpClient> {
    const s: SfpSettings = { ...SFP_DEFAULTS, ...overrides };
    const int = (v: number, name: string, lo: number, hi: number): void => {
      if (!Number.isInteger(v) || v < lo || v > hi) throw new RangeError(`SFP ${name} must be an integer in [${lo}, ${hi}], got ${v}`);
    };
    int(s.wordLength, "word_length", 1, 64);
    int(s.fragmentLength, "fragment_length", 1, s.wordLength);
    if (s.wordLength % s.fragmentLength !== 0) {
      throw new RangeError(`SFP word_length (${s.wordLength}) must be a multiple of fragment_length (${s.fragmentLength})`);
    }
    int(s.pieceBits, "piece_bits", 1, 8);
    if (codePoints(s.pad).length !== 1) throw new RangeError(`SFP pad must be one character, got ${JSON.stringify(s.pad)}`);
    const word = await Randomizer.create(s.wordMechanism, s.epsilonWord, s.wordHashSeed, s.wordK, s.wordM);
    const fragment = await Randomizer.create(s.fragmentMechanism, s.epsilonFragment, s.fragmentHashSeed, s.fragmentK, s.fragmentM);
    return new SfpClient(s, word, fragment);
  }

  /** Number of fragment positions (Apple: 5). */
  get positions(): number {
    return this.settings.wordLength / this.settings.fragmentLength;
  }

  /** Rows of the fragments use case's sketch: positions × k′. */
  get fragmentRows(): number {
    return this.positions * this.settings.fragmentK;
  }

  /** Alg. 9: the word at ε; a uniform position l, its fragment at ε′, reported in row l·k′ + j. */
  async randomize(word: string, rng: RandomSource = cryptoRandom): Promise<SfpReportPair> {
    const code = await encodeSfpWord(word, this.settings);
    const position = uniformInt(rng, this.positions);
    const local = await this.fragment.randomize(code.fragmentItems[position]!, rng);
    const fragment = { ...local, row: position * this.settings.fragmentK + local.row } as Report;
    return { word: await this.word.randomize(code.wordItem, rng), position, fragment };
  }

  /** Alg. 9's fragment half alone (what the fragments use case's device sends): the same
   * draws as `randomize` makes before the word's, the row l·k′ + j of the stacked sketch. */
  async randomizeFragment(word: string, rng: RandomSource = cryptoRandom): Promise<Report> {
    const code = await encodeSfpWord(word, this.settings);
    const position = uniformInt(rng, this.positions);
    const local = await this.fragment.randomize(code.fragmentItems[position]!, rng);
    return { ...local, row: position * this.settings.fragmentK + local.row } as Report;
  }

  /** The two payloads of a word (the word use case's and the fragments use case's parameters). */
  async payloads(word: string, rng: RandomSource = cryptoRandom): Promise<SfpPayloads> {
    const pair = await this.randomize(word, rng);
    const s = this.settings;
    return {
      word: encodePayload(pair.word, s.wordK, s.wordM),
      fragment: encodePayload(pair.fragment, this.fragmentRows, s.fragmentM),
    };
  }

  /**
   * The two envelopes a device sends for a word: the word report to `target.useCase`, the fragment
   * report to `<useCase>.fragments`; with a shuffler key both nested (inner v2, outer v3).
   */
  async seal(
    word: string,
    target: SfpTarget,
    opts: { rng?: RandomSource; clock?: () => number; seal?: SealOptions } = {},
  ): Promise<SfpEnvelopes> {
    const payloads = await this.payloads(word, opts.rng ?? cryptoRandom);
    const nested = target.shufflerKey !== undefined;
    const fragments = `${target.useCase}.fragments`;
    const sealOpts = { ...(opts.seal ?? {}), version: nested ? 2 : 1 } as const;
    const wordInner = await sealInner(payloads.word, target.useCase, target.epoch, target.analyzerKey, sealOpts);
    const fragmentInner = await sealInner(payloads.fragment, fragments, target.epoch, target.analyzerKey, sealOpts);
    if (target.shufflerKey === undefined) return { word: wordInner, fragment: fragmentInner };
    const now = (opts.clock ?? (() => Date.now() / 1000))();
    const time = roundTime(now, target.timePrecisionSeconds ?? 3600);
    return {
      word: await sealOuter(wordInner, target.useCase, target.shufflerKey, time, opts.seal ?? {}),
      fragment: await sealOuter(fragmentInner, fragments, target.shufflerKey, time, opts.seal ?? {}),
    };
  }
}
