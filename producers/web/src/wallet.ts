/**
 * A device's Privacy Pass tokens (RFC 9578 §6, type 0x0002, blind RSA), issued through
 * @cloudflare/privacypass-ts: directory (§4) -> challenge (RFC 9577 §2.1, schemas/tokens.md) ->
 * token request with `Authorization: Bearer` -> finalized token, kept in memory by period.
 * The tokens of one `take` are asked for in one request to the issuer's batch endpoint
 * (schemas/tokens.md, "Batches": up to BATCH_LIMIT a request; fewer answered than asked means the
 * quota is spent), or one request per token when the directory names no
 * `ldpipe-batch-request-uri`; as ldpipe.producers.device.wallet does.
 */
import { TokenChallenge, publicVerif } from "@cloudflare/privacypass-ts";
import { DeviceError } from "./errors.js";
import { type RetryPolicy, fetchWithRetries, problemReason } from "./retry.js";
import { TOKEN_RESPONSE_LENGTH, decodeTokenBatch, encodeTokenBatch, redemptionContext, tokenChallenge } from "./tokens.js";

export const DIRECTORY_PATH = "/.well-known/private-token-issuer-directory";
export const REQUEST_MEDIA_TYPE = "application/private-token-request"; // RFC 9578 §6.1
export const BATCH_MEDIA_TYPE = "application/x-ldpipe-token-batch-request"; // schemas/tokens.md, "Batches"
export const BATCH_LIMIT = 64; // token requests per batch: the issuer's MAX_BATCH

function b64url(text: string): Uint8Array {
  const b = atob(text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (text.length % 4)) % 4));
  return Uint8Array.from(b, (c) => c.charCodeAt(0));
}

export class TokenWallet {
  private readonly tokens = new Map<number, Uint8Array[]>();
  private readonly exhausted = new Set<number>();
  private readonly keys = new Map<number, Uint8Array>();
  private requestUrl = "";
  private batchUrl = "";

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
    for (const p of [...this.exhausted]) if (p < period) this.exhausted.delete(p);
    const inHand = this.tokens.get(period) ?? [];
    this.tokens.set(period, inHand);
    const out = inHand.splice(0, Math.min(count, inHand.length));
    if (out.length < count && !this.exhausted.has(period)) {
      const challenge = tokenChallenge(issuerName, await redemptionContext(this.useCase, period), originName);
      try {
        const spki = await this.key(period);
        while (out.length < count) {
          let wanted = 1;
          let tokens: Uint8Array[];
          if (this.batchUrl !== "") {
            wanted = Math.min(count - out.length, BATCH_LIMIT); // one request for up to BATCH_LIMIT tokens
            tokens = await this.fetchBatch(challenge, spki, wanted);
          } else {
            const token = await this.fetchToken(challenge, spki); // an issuer without batches
            tokens = token === null ? [] : [token];
          }
          out.push(...tokens);
          if (tokens.length < wanted) {
            this.exhausted.add(period); // the period's quota is spent
            break;
          }
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
      const batch = (doc as Record<string, unknown>)["ldpipe-batch-request-uri"];
      this.batchUrl = batch ? new URL(String(batch), this.directoryUrl).toString() : "";
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

  /**
   * Up to `count` tokens in one request (schemas/tokens.md, "Batches"): the issuer answers the
   * first k of them, k = what is left of the quota; [] once it is spent.
   */
  private async fetchBatch(challengeBytes: Uint8Array, spki: Uint8Array, count: number): Promise<Uint8Array[]> {
    const challenge = TokenChallenge.deserialize(challengeBytes);
    const clients: publicVerif.Client[] = [];
    const requests: Uint8Array[] = [];
    for (let i = 0; i < count; i++) {
      const client = new publicVerif.Client(publicVerif.BlindRSAMode.PSS); // one client, one blinding state
      requests.push((await client.createTokenRequest(challenge, spki)).serialize());
      clients.push(client);
    }
    const response = await this.post(this.batchUrl, encodeTokenBatch(requests), BATCH_MEDIA_TYPE);
    if (response === null) return [];
    try {
      const answers = decodeTokenBatch(new Uint8Array(await response.arrayBuffer()), TOKEN_RESPONSE_LENGTH, count);
      const tokens: Uint8Array[] = [];
      for (const [i, answer] of answers.entries()) {
        // finalize checks RSASSA-PSS-VERIFY (RFC 9474 §4.4), as the Python wallet's verify_token
        tokens.push((await clients[i]!.finalize(publicVerif.TokenResponse.deserialize(answer))).serialize());
      }
      return tokens;
    } catch (err) {
      throw new DeviceError("issuer", `the token issuer's answer does not make valid tokens: ${(err as Error).message}`);
    }
  }

  /** POST to the issuer: its 200 answer, null for 429 "quota", else a DeviceError. */
  private async post(url: string, body: Uint8Array, mediaType: string): Promise<Response | null> {
    const target = new URL(url);
    target.searchParams.set("use_case", this.useCase);
    let response: Response;
    try {
      response = await fetchWithRetries(
        this.fetcher,
        target.toString(),
        { method: "POST", body, headers: { "content-type": mediaType, authorization: `Bearer ${this.credential}` } },
        this.policy,
      );
    } catch (err) {
      throw new DeviceError("issuer", `cannot reach the token issuer at ${url}: ${(err as Error).message}`);
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
    return response;
  }

  /** One token (RFC 9578 §6.1-6.3), or null once the period's quota is spent. */
  private async fetchToken(challengeBytes: Uint8Array, spki: Uint8Array): Promise<Uint8Array | null> {
    const client = new publicVerif.Client(publicVerif.BlindRSAMode.PSS);
    const request = await client.createTokenRequest(TokenChallenge.deserialize(challengeBytes), spki);
    const response = await this.post(this.requestUrl, request.serialize(), REQUEST_MEDIA_TYPE);
    if (response === null) return null;
    try {
      const token = await client.finalize(publicVerif.TokenResponse.deserialize(new Uint8Array(await response.arrayBuffer())));
      return token.serialize();
    } catch (err) {
      throw new DeviceError("issuer", `the token issuer's answer does not make a valid token: ${(err as Error).message}`);
    }
  }
}
