/**
 * A device of one use case, talking to an ldpipe gateway and token issuer (docs/device-web.md):
 * configuration with ETag / If-None-Match, one token per report, inner v2 + outer v3 sealing,
 * batched uploads with retries, and one reseal after `outdated_config`.
 */
import type { BudgetLedger } from "./budget.js";
import { type DeviceConfiguration, parseConfiguration } from "./config.js";
import type { TagKey } from "./discovery.js";
import { roundTime, sealInner, sealOuter } from "./envelope.js";
import { DeviceError } from "./errors.js";
import type { Item } from "./hashing.js";
import { encodePayload } from "./payloads.js";
import { type RandomSource, cryptoRandom } from "./randomize.js";
import { DEFAULT_RETRY, type RetryPolicy, fetchWithRetries, problemReason } from "./retry.js";
import { BATCH_FIXED_LENGTH, MEDIA_TYPE, REPORT_FIXED_LENGTH, encodeBatch, parseAnswer } from "./upload.js";
import { DIRECTORY_PATH, TokenWallet } from "./wallet.js";

export interface DeviceOptions {
  /** The gateway's base URL, e.g. "https://telemetry.example". */
  readonly gatewayUrl: string;
  readonly useCase: string;
  /** The bearer credential the issuer's attester knows. */
  readonly credential: string;
  /** The issuer's base URL (default: the directory the configuration names). */
  readonly issuerUrl?: string;
  readonly retry?: RetryPolicy;
  /** The fetch to use (default: globalThis.fetch). */
  readonly fetch?: typeof fetch;
  /** Unix time in seconds (tests only). */
  readonly clock?: () => number;
  /** Randomness for the randomizer (tests only: a device must use getRandomValues, the default). */
  readonly rng?: RandomSource;
  /** The device's own budget ledger (docs/privacy.md "On the device"); default none: the issuer's quota is the only limit. */
  readonly budget?: BudgetLedger;
  /** A discovery use case's (`<name>.discovery`) tag key, which the device was provisioned with. */
  readonly tagKey?: TagKey;
}

export interface SendResult {
  /** Reports now on the use case's reports topic. */
  readonly accepted: number;
  /** Reports the gateway refused, by reason (upload.md "The answer"). */
  readonly refused: Readonly<Record<string, number>>;
  /** Items not sent for want of a token this period (the issuer's quota). */
  readonly held: readonly Item[];
  /** Reports whose fate is unknown: the gateway could not be reached or stayed busy. */
  readonly undelivered: number;
  /** With a budget ledger: items over the period's budget now waiting in the ledger (with those held before). */
  readonly budgetHeld: number;
  /** With a budget ledger: items over the budget dropped ("drop", or beyond the ledger's maxHeld). */
  readonly budgetDropped: number;
}

interface Pending {
  readonly item: Item;
  readonly inner: Uint8Array;
  readonly token: Uint8Array;
  readonly envelope: Uint8Array;
}

// refused before the token was checked: the token was not spent and goes back to the wallet
const TOKEN_UNSPENT = new Set(["outdated_config", "too_early", "too_old", "wrong_use_case"]);

export class WebDevice {
  readonly gatewayUrl: string;
  private config: DeviceConfiguration | null = null;
  private fetchedAt = 0;
  private maxAge = 0;
  private wallet_: TokenWallet | null = null;
  private readonly retry: RetryPolicy;
  private readonly fetcher: typeof fetch;
  private readonly clock: () => number;
  private readonly rng: RandomSource;

  constructor(readonly options: DeviceOptions) {
    this.gatewayUrl = options.gatewayUrl.replace(/\/+$/, "");
    this.retry = options.retry ?? DEFAULT_RETRY;
    this.fetcher = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.clock = options.clock ?? (() => Date.now() / 1000);
    this.rng = options.rng ?? cryptoRandom;
  }

  get configUrl(): string {
    return `${this.gatewayUrl}/v1/use-cases/${this.options.useCase}/config`;
  }

  /** The configuration: kept for its Cache-Control max-age, then asked again with If-None-Match. */
  async configuration(refresh = false): Promise<DeviceConfiguration> {
    const fresh = this.clock() - this.fetchedAt < this.maxAge;
    if (this.config !== null && fresh && !refresh) return this.config;
    const headers: Record<string, string> = { accept: "application/json" };
    if (this.config?.etag) headers["if-none-match"] = this.config.etag;
    let response: Response;
    try {
      response = await fetchWithRetries(this.fetcher, this.configUrl, { headers }, this.retry);
    } catch (err) {
      throw new DeviceError("gateway", `cannot reach the gateway at ${this.configUrl}: ${(err as Error).message}`);
    }
    let config: DeviceConfiguration;
    if (response.status === 304 && this.config !== null) {
      config = this.config;
    } else if (response.status === 200) {
      config = await parseConfiguration(await response.text(), response.headers.get("etag"), {
        ...(this.options.tagKey === undefined ? {} : { tagKey: this.options.tagKey }),
      });
      if (config.useCase !== this.options.useCase) {
        throw new DeviceError("config", `${this.configUrl} describes use case ${JSON.stringify(config.useCase)}`);
      }
    } else if (response.status === 404) {
      throw new DeviceError("unknown_use_case", `the gateway at ${this.gatewayUrl} serves no use case ${JSON.stringify(this.options.useCase)}; check the name`);
    } else {
      const reason = (await problemReason(response)) || "no reason given";
      throw new DeviceError("gateway", `the gateway answered ${response.status} (${reason}) for ${this.configUrl}`);
    }
    this.config = config;
    this.fetchedAt = this.clock();
    const maxAge = /max-age=(\d+)/.exec(response.headers.get("cache-control") ?? "");
    this.maxAge = maxAge ? Number(maxAge[1]) : 0;
    return config;
  }

  /** The device's tokens (created with the first configuration). */
  async wallet(): Promise<TokenWallet> {
    if (this.wallet_ === null) {
      const config = await this.configuration();
      const directory = this.options.issuerUrl
        ? this.options.issuerUrl.replace(/\/+$/, "") + DIRECTORY_PATH
        : config.issuerDirectoryUrl;
      this.wallet_ = new TokenWallet(directory, this.options.useCase, this.options.credential, this.retry, this.fetcher);
    }
    return this.wallet_;
  }

  /**
   * Randomize, seal and upload one report per item (one token each). With a budget ledger, the
   * items held in it come first, then `items`, up to what the period's budget allows; the rest
   * are held in the ledger or dropped, and the ledger is saved before anything is randomized.
   */
  async send(items: readonly Item[]): Promise<SendResult> {
    // SFP halves and discovery use cases too (docs/device-web.md): their documents say which
    const refused: Record<string, number> = {};
    const budget = this.options.budget;
    if (items.length === 0 && budget === undefined) return { accepted: 0, refused, held: [], undelivered: 0, budgetHeld: 0, budgetDropped: 0 };
    const config = await this.configuration();
    if (config.screen !== undefined) {
      // items the use case's rules refuse (discovery) are counted before any token is spent
      const screen = config.screen;
      items = items.filter((item) => {
        const reason = screen(item);
        if (reason !== null) refused[reason] = (refused[reason] ?? 0) + 1;
        return reason === null;
      });
      if (items.length === 0 && budget === undefined) return { accepted: 0, refused, held: [], undelivered: 0, budgetHeld: 0, budgetDropped: 0 };
    }
    let budgetHeld = 0;
    let budgetDropped = 0;
    if (budget !== undefined) {
      [items, budgetHeld, budgetDropped] = await this.withinBudget(budget, config, items);
      if (items.length === 0) return { accepted: 0, refused, held: [], undelivered: 0, budgetHeld, budgetDropped };
    }
    const wallet = await this.wallet();
    const period = Math.floor(this.clock() / config.periodSeconds);
    let tokens: Uint8Array[];
    try {
      tokens = await wallet.take(items.length, period, config.issuerName, config.originName);
    } catch (err) {
      if (budget !== undefined) await this.refund(budget, config, items.length, items); // nothing was randomized: hold them again
      throw err;
    }
    if (budget !== undefined && tokens.length < items.length) await this.refund(budget, config, items.length - tokens.length, []);
    const sending = items.slice(0, tokens.length);
    const held = items.slice(tokens.length);
    const tally = { accepted: 0, refused, undelivered: 0, outdated: [] as Pending[], resealed: false };
    const pending = await this.seal(config, sending, null, tokens);
    await this.upload(config, pending, tally, period);
    if (tally.outdated.length > 0) {
      const again = tally.outdated;
      tally.outdated = [];
      tally.resealed = true;
      const fresh = await this.configuration(true);
      const reuse = fresh.epoch === config.epoch && fresh.analyzerKey.keyId === config.analyzerKey.keyId;
      const resealed = await this.seal(
        fresh,
        again.map((p) => p.item),
        reuse ? again.map((p) => p.inner) : null,
        again.map((p) => p.token),
      );
      await this.upload(fresh, resealed, tally, period);
    }
    return { accepted: tally.accepted, refused, held, undelivered: tally.undelivered, budgetHeld, budgetDropped };
  }

  /** ε₀ of one report: the configuration's epsilon, or the mechanism's effective ε if larger. */
  private epsilon(config: DeviceConfiguration): number {
    return Math.max(config.epsilon, config.randomizer?.effectiveEpsilon ?? 0);
  }

  /** [items to send now, held in the ledger, dropped]; the ledger is spent and saved. */
  private async withinBudget(budget: BudgetLedger, config: DeviceConfiguration, items: readonly Item[]): Promise<[Item[], number, number]> {
    const useCase = this.options.useCase;
    const period = { now: this.clock(), epsilon: this.epsilon(config), periodSeconds: config.periodSeconds };
    budget.entry(useCase, period.now, period.periodSeconds); // roll the period over first
    const queue = [...budget.takeHeld(useCase), ...items];
    const n = budget.allowance(useCase, period);
    const sending = queue.slice(0, n);
    const over = queue.slice(n);
    const held = budget.overBudget === "hold" ? budget.hold(useCase, over) : 0;
    await budget.spend(useCase, sending.length, period);
    return [sending, held, over.length - held];
  }

  /** Give back the ε of `reports` never randomized; `items` go back to the front of the held ones ("hold"). */
  private async refund(budget: BudgetLedger, config: DeviceConfiguration, reports: number, items: readonly Item[]): Promise<void> {
    if (items.length > 0 && budget.overBudget === "hold") budget.hold(this.options.useCase, items, true);
    await budget.refund(this.options.useCase, reports, this.epsilon(config));
  }

  private async seal(
    config: DeviceConfiguration,
    items: readonly Item[],
    inners: readonly Uint8Array[] | null,
    tokens: readonly Uint8Array[],
  ): Promise<Pending[]> {
    const time = roundTime(this.clock(), config.timePrecisionSeconds);
    const out: Pending[] = [];
    for (const [i, item] of items.entries()) {
      let inner = inners?.[i];
      if (inner === undefined && config.inner !== undefined) {
        inner = await config.inner(item, this.rng);
      } else if (inner === undefined) {
        const report = await config.randomizer!.randomize(item, this.rng);
        const payload = encodePayload(report, config.k, config.m);
        inner = await sealInner(payload, config.useCase, config.epoch, config.analyzerKey);
      }
      const envelope = await sealOuter(inner, config.useCase, config.shufflerKey, time);
      out.push({ item, inner, token: tokens[i]!, envelope });
    }
    return out;
  }

  /** Consecutive batches within the gateway's report count and body size. */
  private batches(config: DeviceConfiguration, pending: Pending[]): Pending[][] {
    const batches: Pending[][] = [];
    let current: Pending[] = [];
    let size = BATCH_FIXED_LENGTH;
    for (const p of pending) {
      const grows = REPORT_FIXED_LENGTH + p.envelope.length;
      const full = current.length >= config.maxReportsPerRequest;
      if (current.length > 0 && (full || size + grows > config.maxBodyBytes)) {
        batches.push(current);
        current = [];
        size = BATCH_FIXED_LENGTH;
      }
      current.push(p);
      size += grows;
    }
    if (current.length > 0) batches.push(current);
    return batches;
  }

  private async upload(
    config: DeviceConfiguration,
    pending: Pending[],
    tally: { accepted: number; refused: Record<string, number>; undelivered: number; outdated: Pending[]; resealed: boolean },
    period: number,
  ): Promise<void> {
    for (const batch of this.batches(config, pending)) await this.post(config, batch, tally, period);
  }

  private async post(
    config: DeviceConfiguration,
    batch: Pending[],
    tally: { accepted: number; refused: Record<string, number>; undelivered: number; outdated: Pending[]; resealed: boolean },
    period: number,
  ): Promise<void> {
    const url = this.gatewayUrl + config.uploadPath;
    const body = encodeBatch(batch.map((p) => ({ token: p.token, envelope: p.envelope })));
    const wallet = await this.wallet();
    let response: Response;
    try {
      response = await fetchWithRetries(
        this.fetcher,
        url,
        { method: "POST", body, headers: { "content-type": MEDIA_TYPE, accept: "application/json" } },
        this.retry,
      );
    } catch {
      tally.undelivered += batch.length;
      return;
    }
    const reason = await problemReason(response);
    const tooLarge = response.status === 413 || reason === "too_many_reports";
    if (tooLarge && batch.length > 1) {
      const half = Math.floor(batch.length / 2);
      await this.post(config, batch.slice(0, half), tally, period);
      await this.post(config, batch.slice(half), tally, period);
      return;
    }
    if (tooLarge) {
      tally.refused["body_too_large"] = (tally.refused["body_too_large"] ?? 0) + 1;
      wallet.giveBack(period, [batch[0]!.token]);
      return;
    }
    if (response.status === 404) {
      throw new DeviceError("unknown_use_case", `the gateway at ${this.gatewayUrl} takes no reports of ${JSON.stringify(this.options.useCase)}`);
    }
    if (response.status !== 200) {
      if (response.status >= 500 || response.status === 408 || response.status === 429) {
        tally.undelivered += batch.length; // retries exhausted; tokens maybe spent
        if (reason === "issuer_unavailable") wallet.giveBack(period, batch.map((p) => p.token));
        return;
      }
      throw new DeviceError(
        "gateway",
        `the gateway refused a batch with ${response.status} (${reason || "no reason given"}): a bug in this device's encoder; report it`,
      );
    }
    let answer;
    try {
      answer = parseAnswer(await response.text());
    } catch (err) {
      throw new DeviceError("gateway", `${url} answered 200 without an upload answer: ${(err as Error).message}`);
    }
    tally.accepted += answer.accepted;
    const unspent: Uint8Array[] = [];
    for (const refusal of answer.refused) {
      const p = batch[refusal.index];
      if (p === undefined) continue;
      if (refusal.reason === "outdated_config" && !tally.resealed) {
        tally.outdated.push(p);
        continue;
      }
      tally.refused[refusal.reason] = (tally.refused[refusal.reason] ?? 0) + 1;
      if (TOKEN_UNSPENT.has(refusal.reason)) unspent.push(p.token);
    }
    if (unspent.length > 0) wallet.giveBack(period, unspent);
  }
}
