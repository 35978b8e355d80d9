import assert from "node:assert/strict";
import { test } from "node:test";
import { redemptionContext, toHex, tokenChallenge } from "../src/index.js";
import { vectors } from "./vectors.js";

test("redemption context and TokenChallenge match schemas/vectors/tokens.json", async () => {
  for (const c of vectors("tokens").vectors) {
    const ctx = await redemptionContext(c.use_case, c.period);
    assert.equal(toHex(ctx), c.redemption_context);
    assert.equal(toHex(tokenChallenge(c.issuer_name, ctx, c.origin_info)), c.token_challenge);
  }
});
