/**
 * The device's own privacy budget, per use case and period, in a ledger it keeps itself
 * (docs/privacy.md "On the device"; the same rules and file format as the Python library's
 * `BudgetLedger`, ldpipe.producers.device.budget).
 *
 * Apple's rule (Learning with Privacy at Scale, §3): the device limits its own reports, whatever
 * its caller asks. A period is the configuration's `period_seconds` and one report costs ε₀, the
 * larger of the configuration's `epsilon` and the mechanism's effective ε. Reports of one period
 * compose basically (Dwork & Roth Thm 3.16): k reports cost k·ε₀, so a budget B per period allows
 * ⌊B/ε₀⌋ reports (default B = ε₀: one report per use case per period). What a send asks beyond
 * that is held (sent first in a later period, at most `maxHeld` per use case) or dropped.
 *
 * The ledger is spent and saved *before* the reports are randomized or leave the device, and
 * refunded only for items never randomized. A period ends at `period_end` (Unix seconds, stored):
 * a clock set back does not reopen a spent period. Storage is injectable: `localStorage` in a
 * browser (`localStorageBudget`), a JSON file under Node (`FileBudgetStorage`, in the Node entry
 * point `ldpipe-node.mjs`), or memory.
 */
import { fromBase64 } from "./bytes.js";
import { DeviceError } from "./errors.js";
import type { Item } from "./hashing.js";

/** The ledger's format name (the Python library's too). */
export const BUDGET_FORMAT = "ldpipe-device-budget/1";
const SLACK = 1e-9; // ⌊B/ε₀⌋ with B = k·ε₀ written in decimal

/** Where the ledger lives: its whole text, read once and replaced durably on every change. */
export interface BudgetStorage {
  /** For error messages: the file, the localStorage key. */
  readonly name: string;
  /** The saved text, or null if nothing was saved yet. */
  load(): Promise<string | null>;
  /** Replace the saved text; resolves once it is durable (as durable as the storage gets). */
  save(text: string): Promise<void>;
}

/** A ledger kept in memory: for the life of the object (a restart starts afresh), and tests. */
export class MemoryBudgetStorage implements BudgetStorage {
  readonly name = "(memory)";
  text: string | null = null;
  async load(): Promise<string | null> {
    return this.text;
  }
  async save(text: string): Promise<void> {
    this.text = text;
  }
}

/** The ledger in a browser's `localStorage` (synchronous, so written before `save` resolves). */
export function localStorageBudget(key = "ldpipe-device-budget", storage: Storage = globalThis.localStorage): BudgetStorage {
  if (storage === undefined) throw new RangeError("this platform has no localStorage; give the ledger another BudgetStorage");
  return {
    name: `localStorage[${JSON.stringify(key)}]`,
    load: async () => storage.getItem(key),
    save: async (text: string) => storage.setItem(key, text),
  };
}

/** One use case's entry: the period in force [periodStart, periodEnd) in Unix seconds, the ε spent and reports sent in it, the held items. */
export interface UseCaseBudget {
  periodStart: number;
  periodEnd: number;
  spentEpsilon: number;
  reports: number;
  held: Item[];
}

export interface BudgetOptions {
  /** B, the budget per use case and period, in ε (default: one report's ε₀, one report per period). */
  readonly epsilonPerPeriod?: number;
  /** What happens to items over the budget: "hold" (default) keeps them for a later period; "drop". */
  readonly overBudget?: "hold" | "drop";
  /** Held items kept per use case (default 100); more are dropped. */
  readonly maxHeld?: number;
}

interface Period {
  readonly now: number;
  readonly epsilon: number;
  readonly periodSeconds: number;
}

function itemJson(item: Item): Record<string, string> {
  if (typeof item === "string") return { text: item };
  let bin = "";
  for (const b of item) bin += String.fromCharCode(b);
  return { b64: btoa(bin) };
}

function itemOf(value: unknown): Item {
  const v = value as Record<string, unknown> | null;
  if (typeof v === "object" && v !== null && typeof v["text"] === "string") return v["text"];
  if (typeof v === "object" && v !== null && typeof v["b64"] === "string") return fromBase64(v["b64"]);
  throw new RangeError(`a held item ${JSON.stringify(value)}`);
}

/** The device's budget ledger (all use cases of one device share one storage). */
export class BudgetLedger {
  readonly epsilonPerPeriod: number | null;
  readonly overBudget: "hold" | "drop";
  readonly maxHeld: number;

  private constructor(
    readonly storage: BudgetStorage,
    private readonly entries: Map<string, UseCaseBudget>,
    options: BudgetOptions,
  ) {
    this.epsilonPerPeriod = options.epsilonPerPeriod ?? null;
    this.overBudget = options.overBudget ?? "hold";
    this.maxHeld = options.maxHeld ?? 100;
  }

  /** Open the ledger in `storage` (default: memory); DeviceError "budget" if it cannot be read. */
  static async open(storage: BudgetStorage = new MemoryBudgetStorage(), options: BudgetOptions = {}): Promise<BudgetLedger> {
    const { epsilonPerPeriod, overBudget, maxHeld } = options;
    if (overBudget !== undefined && overBudget !== "hold" && overBudget !== "drop") {
      throw new RangeError(`overBudget ${JSON.stringify(overBudget)}: give "hold" or "drop"`);
    }
    if (epsilonPerPeriod !== undefined && !(epsilonPerPeriod >= 0 && Number.isFinite(epsilonPerPeriod))) {
      throw new RangeError(`epsilonPerPeriod ${epsilonPerPeriod}: give a number >= 0`);
    }
    if (maxHeld !== undefined && !(Number.isInteger(maxHeld) && maxHeld >= 0)) throw new RangeError(`maxHeld ${maxHeld}: give an integer >= 0`);
    return new BudgetLedger(storage, await BudgetLedger.read(storage), options);
  }

  private static corrupt(storage: BudgetStorage, why: string): DeviceError {
    return new DeviceError(
      "budget",
      `the budget ledger ${storage.name} ${why}; move it aside only if this device may start its budget afresh, or give the device another ledger`,
    );
  }

  private static async read(storage: BudgetStorage): Promise<Map<string, UseCaseBudget>> {
    const text = await storage.load();
    const entries = new Map<string, UseCaseBudget>();
    if (text === null) return entries;
    let doc: any;
    try {
      doc = JSON.parse(text);
    } catch {
      throw BudgetLedger.corrupt(storage, "is not readable JSON");
    }
    if (typeof doc !== "object" || doc === null || doc["format"] !== BUDGET_FORMAT) {
      throw BudgetLedger.corrupt(storage, `is not an ldpipe device budget ledger (${BUDGET_FORMAT})`);
    }
    try {
      for (const [name, raw] of Object.entries(doc["use_cases"] as Record<string, any>)) {
        const num = (v: unknown): number => {
          if (typeof v !== "number" || !Number.isFinite(v)) throw new RangeError(`${name}: ${JSON.stringify(v)} is not a number`);
          return v;
        };
        entries.set(name, {
          periodStart: num(raw["period_start"]),
          periodEnd: num(raw["period_end"]),
          spentEpsilon: num(raw["spent_epsilon"]),
          reports: num(raw["reports"]),
          held: ((raw["held"] ?? []) as unknown[]).map(itemOf),
        });
      }
    } catch (err) {
      throw BudgetLedger.corrupt(storage, `has an entry this library cannot read (${(err as Error).message})`);
    }
    return entries;
  }

  /** The use case's entry, rolled over to the period of `now` if the stored one ended (held items carry over; spent ε does not). */
  entry(useCase: string, now: number, periodSeconds: number): UseCaseBudget {
    let e = this.entries.get(useCase);
    if (e === undefined) {
      e = { periodStart: 0, periodEnd: 0, spentEpsilon: 0, reports: 0, held: [] };
      this.entries.set(useCase, e);
    }
    if (now >= e.periodEnd) {
      const start = Math.floor(now / periodSeconds) * periodSeconds;
      e.periodStart = start;
      e.periodEnd = start + periodSeconds;
      e.spentEpsilon = 0;
      e.reports = 0;
    }
    return e;
  }

  /** B: the device's setting, or one report's ε₀. */
  budget(epsilon: number): number {
    return this.epsilonPerPeriod ?? epsilon;
  }

  /** Reports the use case may still send in the period of `now`: ⌊(B − spent)/ε₀⌋. */
  allowance(useCase: string, { now, epsilon, periodSeconds }: Period): number {
    const e = this.entry(useCase, now, periodSeconds);
    if (!(epsilon > 0) || !Number.isFinite(epsilon)) return 0; // no finite ε: not accounted, send nothing
    return Math.max(0, Math.floor((this.budget(epsilon) - e.spentEpsilon) / epsilon + SLACK));
  }

  /** Record `reports` reports of ε₀ each in the period of `now`, and save. */
  async spend(useCase: string, reports: number, period: Period): Promise<void> {
    const e = this.entry(useCase, period.now, period.periodSeconds);
    e.spentEpsilon += reports * period.epsilon;
    e.reports += reports;
    await this.save();
  }

  /** Give back the ε of `reports` reports that were never randomized, and save. */
  async refund(useCase: string, reports: number, epsilon: number): Promise<void> {
    const e = this.entries.get(useCase);
    if (e !== undefined && reports > 0) {
      e.spentEpsilon = Math.max(0, e.spentEpsilon - reports * epsilon);
      e.reports = Math.max(0, e.reports - reports);
    }
    await this.save();
  }

  /** The held items, oldest first, removed from the ledger (saved by the next spend or refund). */
  takeHeld(useCase: string): Item[] {
    const e = this.entries.get(useCase);
    if (e === undefined) return [];
    const out = e.held;
    e.held = [];
    return out;
  }

  /** Keep `items` for a later period (`first`: before those already held), up to `maxHeld` in all; returns how many were kept. */
  hold(useCase: string, items: readonly Item[], first = false): number {
    let e = this.entries.get(useCase);
    if (e === undefined) {
      e = { periodStart: 0, periodEnd: 0, spentEpsilon: 0, reports: 0, held: [] };
      this.entries.set(useCase, e);
    }
    const kept = items.slice(0, Math.max(0, this.maxHeld - e.held.length));
    e.held = first ? [...kept, ...e.held] : [...e.held, ...kept];
    return kept.length;
  }

  /** The ledger's text: the Python library's JSON format (ldpipe-device-budget/1). */
  toJSON(): unknown {
    const useCases: Record<string, unknown> = {};
    for (const name of [...this.entries.keys()].sort()) {
      const e = this.entries.get(name)!;
      useCases[name] = {
        period_start: e.periodStart,
        period_end: e.periodEnd,
        spent_epsilon: e.spentEpsilon,
        reports: e.reports,
        held: e.held.map(itemJson),
      };
    }
    return { format: BUDGET_FORMAT, use_cases: useCases };
  }

  /** Write the whole ledger to its storage. */
  async save(): Promise<void> {
    await this.storage.save(JSON.stringify(this.toJSON(), null, 1));
  }
}
