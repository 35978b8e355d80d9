import assert from "node:assert/strict";
import { test } from "node:test";
import { encodeBatch, fromHex, parseAnswer, toHex } from "../src/index.js";
import { vectors } from "./vectors.js";

const v = vectors("upload");

test("every valid batch in schemas/vectors/upload.json encodes byte for byte", () => {
  for (const c of v.valid) {
    const reports = c.reports.map((r: any) => ({ token: fromHex(r.token_hex), envelope: fromHex(r.envelope_hex) }));
    assert.equal(toHex(encodeBatch(reports)), c.batch_hex, c.name);
  }
});

test("the gateway's answers parse", () => {
  const [all, one] = v.answers.map((a: any) => parseAnswer(a.json));
  assert.equal(all.accepted, 3);
  assert.deepEqual(one.refused.map((r: any) => [r.index, r.reason]), [[1, "too_old"]]);
});
