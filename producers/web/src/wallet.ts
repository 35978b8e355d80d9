/**
 * A device's Privacy Pass tokens (RFC 9578 §6, type 0x0002, blind RSA), issued through
 * @cloudflare/privacypass-ts: directory (§4) -> challenge (RFC 9577 §2.1, schemas/tokens.md) ->
 * token request with `Authorization: Bearer` -> finalized token, kept in memory by period.
 */
import { TokenChallenge, publicVerif } from "@cloudflare/privacypass-ts";
import { DeviceError } from "./errors.js";
import { type RetryPolicy, fetchWithRetries, problemReason } from "./retry.js";
import { redemptionContext, tokenChallenge } from "./tokens.js";

export const DIRECTORY_PATH = "/.well-known/private-token-issuer-directory";
export const REQUEST_MEDIA_TYPE = "application/private-token-request";

function b64url(text: string): Uint8Array {
  const b = atob(text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (text.length % 4)) % 4));
  return Uint8Array.from(b, (c) => c.charCodeAt(0));
}

export class TokenWallet {
  private readonly tokens = new Map<number, Uint8Array[]>();
  private readonly exhausted = new Set<number>();
  private readonly keys = new Map<number, Uint8Array>();
  private requestUrl = "";

  constructor(
    readonly directoryUrl: string,
    readonly useCase: string,
    private readonly credential: string,
    private readonly policy: RetryPolicy,
    private readonly fetcher: typeof fetch,
  ) {}

  held(period: number): number {
    return this.tokens.get(period)?.length ?? 0;
  }

  /** Up to `count` tokens of `period`: those in hand, then new ones until the quota is spent. */
  async take(count: number, period: number, issuerName: string, originName: string): Promise<Uint8Array[]> {
    for (const p of [...this.tokens.keys()]) if (p < period) this.tokens.delete(p);
    const inHand = this.tokens.get(period) ?? [];
    this.tokens.set(period, inHand);
    const out = inHand.splice(0, Math.min(count, inHand.length));
    if (out.length < count && !this.exhausted.has(period)) {
      const challenge = tokenChallenge(issuerName, await redemptionContext(this.useCase, period), originName);
      try {
        const spki = await this.key(period);
        while (out.length < count) {
          const token = await this.fetchToken(challenge, spki);
          if (token === null) {
            this.exhausted.add(period);
            break;
          }
          out.push(token);
        }
      } catch (err) {
        this.giveBack(period, out); // signed and counted by the issuer: keep them
        throw err;
      }
    }
    return out;
  }

  /** Tokens that were not spent (their reports never reached the reports topic). */
  giveBack(period: number, tokens: Uint8Array[]): void {
    const list = this.tokens.get(period) ?? [];
    list.push(...tokens);
    this.tokens.set(period, list);
  }

  private async key(period: number): Promise<Uint8Array> {
    if (!this.keys.has(period)) await this.readDirectory();
    const key = this.keys.get(period);
    if (key === undefined) {
      throw new DeviceError(
        "issuer",
        `the issuer's directory ${this.directoryUrl} has no key of use case ${JSON.stringify(this.useCase)} for period ${period}; check the device's clock and that the issuer serves this use case`,
      );
    }
    return key;
  }

  private async readDirectory(): Promise<void> {
    let response: Response;
    try {
      response = await fetchWithRetries(this.fetcher, this.directoryUrl, {}, this.policy);
    } catch (err) {
      throw new DeviceError("issuer", `cannot reach the token issuer at ${this.directoryUrl}: ${(err as Error).message}`);
    }
    if (response.status !== 200) {
      throw new DeviceError("issuer", `the token issuer's directory ${this.directoryUrl} answered ${response.status}; check the issuer URL`);
    }
    try {
      const doc = (await response.json()) as { "issuer-request-uri": string; "token-keys": Array<Record<string, unknown>> };
      this.requestUrl = new URL(String(doc["issuer-request-uri"]), this.directoryUrl).toString();
      for (const entry of doc["token-keys"]) {
        if (entry["use-case"] === this.useCase && Number(entry["token-type"]) === 2) {
          this.keys.set(Number(entry["period"]), b64url(String(entry["token-key"])));
        }
      }
    } catch (err) {
      throw new DeviceError(
        "issuer",
        `${this.directoryUrl} is not an RFC 9578 issuer directory with ldpipe's use-case and period fields (${(err as Error).message})`,
      );
    }
  }

  /** One token (RFC 9578 §6.1-6.3), or null once the period's quota is spent. */
  private async fetchToken(challengeBytes: Uint8Array, spki: Uint8Array): Promise<Uint8Array | null> {
    const client = new publicVerif.Client(publicVerif.BlindRSAMode.PSS);
    const request = await client.createTokenRequest(TokenChallenge.deserialize(challengeBytes), spki);
    const url = new URL(this.requestUrl);
    url.searchParams.set("use_case", this.useCase);
    let response: Response;
    try {
      response = await fetchWithRetries(
        this.fetcher,
        url.toString(),
        {
          method: "POST",
          body: request.serialize(),
          headers: { "content-type": REQUEST_MEDIA_TYPE, authorization: `Bearer ${this.credential}` },
        },
        this.policy,
      );
    } catch (err) {
      throw new DeviceError("issuer", `cannot reach the token issuer at ${this.requestUrl}: ${(err as Error).message}`);
    }
    if (response.status === 429 && (await problemReason(response)) === "quota") return null;
    if (response.status === 401) {
      throw new DeviceError(
        "unauthorized",
        "the token issuer does not accept this device's credential; provision one with `ldpipe issuer credentials add`",
      );
    }
    if (response.status !== 200) {
      const reason = (await problemReason(response)) || "no reason given";
      throw new DeviceError("issuer", `the token issuer answered ${response.status} (${reason}) to a token request for ${JSON.stringify(this.useCase)}`);
    }
    try {
      const token = await client.finalize(publicVerif.TokenResponse.deserialize(new Uint8Array(await response.arrayBuffer())));
      return token.serialize();
    } catch (err) {
      throw new DeviceError("issuer", `the token issuer's answer does not make a valid token: ${(err as Error).message}`);
    }
  }
}
