/**
 * HTTP with retries: exponential backoff with full jitter, Retry-After honoured (RFC 9110
 * §10.2.3), as ldpipe.producers.device.retry does. A request is sent again after a network
 * failure or an answer that says "later" (408, 429 unless its reason is final, 502, 503, 504).
 */
import { type RandomSource, cryptoRandom, uniformFloat } from "./randomize.js";

export interface RetryPolicy {
  readonly attempts: number;
  readonly baseDelay: number; // seconds
  readonly maxDelay: number;
  readonly maxRetryAfter: number;
  readonly sleep?: (seconds: number) => Promise<void>;
  readonly rng?: RandomSource;
}

export const DEFAULT_RETRY: RetryPolicy = { attempts: 5, baseDelay: 0.2, maxDelay: 30, maxRetryAfter: 120 };

const LATER = new Set([408, 429, 502, 503, 504]);
const FINAL_429 = new Set(["quota", "too_many_reports"]);

/** The jittered delay before retry number `retry` (from 1): uniform in [0, min(max, base·2^(retry-1))]. */
export function backoff(policy: RetryPolicy, retry: number): number {
  return uniformFloat(policy.rng ?? cryptoRandom) * Math.min(policy.maxDelay, policy.baseDelay * 2 ** (retry - 1));
}

/** Retry-After in seconds from `nowMs` (delta-seconds or an HTTP date), or null. */
export function retryAfter(response: Response, nowMs: number = Date.now()): number | null {
  const value = (response.headers.get("retry-after") ?? "").trim();
  if (value === "") return null;
  if (/^[0-9]+$/.test(value)) return Number(value);
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, (when - nowMs) / 1000);
}

/** The reason of an RFC 9457 problem document (`reason`, or the tail of a `urn:ldpipe:` type), or "". */
export async function problemReason(response: Response): Promise<string> {
  if (!(response.headers.get("content-type") ?? "").includes("json")) return "";
  try {
    const doc: unknown = await response.clone().json();
    if (typeof doc !== "object" || doc === null) return "";
    const { reason, type } = doc as { reason?: unknown; type?: unknown };
    if (typeof reason === "string") return reason;
    if (typeof type === "string" && type.startsWith("urn:ldpipe:")) return type.slice(type.lastIndexOf(":") + 1);
  } catch {
    return "";
  }
  return "";
}

const defaultSleep = (s: number): Promise<void> => new Promise((r) => setTimeout(r, s * 1000));

/** The first answer that is not "later", or the last one; throws the last network error. */
export async function fetchWithRetries(
  fetcher: typeof fetch,
  url: string,
  init: RequestInit,
  policy: RetryPolicy,
): Promise<Response> {
  const sleep = policy.sleep ?? defaultSleep;
  for (let attempt = 1; ; attempt++) {
    let response: Response;
    try {
      response = await fetcher(url, init);
    } catch (err) {
      if (attempt >= policy.attempts) throw err;
      await sleep(backoff(policy, attempt));
      continue;
    }
    const later = LATER.has(response.status) && (response.status !== 429 || !FINAL_429.has(await problemReason(response)));
    if (!later || attempt >= policy.attempts) return response;
    let delay = backoff(policy, attempt);
    const asked = retryAfter(response);
    if (asked !== null) {
      if (asked > policy.maxRetryAfter) return response;
      delay = Math.max(delay, asked);
    }
    await response.body?.cancel();
    await sleep(delay);
  }
}
