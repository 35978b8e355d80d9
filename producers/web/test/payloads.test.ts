import assert from "node:assert/strict";
import { test } from "node:test";
import { PayloadError, type Report, encodePayload, fromHex, toHex } from "../src/index.js";
import { vectors } from "./vectors.js";

const v = vectors("payloads");

function report(mechanism: string, row: number, values: any[], m: number): Report {
  switch (mechanism) {
    case "cms":
    case "oue":
      return { mechanism, row, bits: Uint8Array.from(values as number[]) };
    case "hcms":
      return { mechanism, row, column: values[0], sign: values[1] };
    case "gcms":
    case "ocms":
      return { mechanism, row, indices: values };
    default:
      void m;
      return { mechanism: "rrcms", row, value: values[0] };
  }
}

test("every valid payload in schemas/vectors/payloads.json encodes byte for byte", () => {
  let n = 0;
  for (const set of v.parameter_sets) {
    for (const c of set.valid) {
      const r = report(set.mechanism, c.row, c.values, set.m);
      assert.equal(toHex(encodePayload(r, set.k, set.m)), c.payload_hex, `${set.mechanism} ${c.name}`);
      assert.equal(encodePayload(r, set.k, set.m).length, set.record_length);
      n++;
    }
  }
  assert.ok(n > 20, `only ${n} vectors`);
});

test("the encoder refuses what the rules refuse", () => {
  const err = (reason: string) => (e: unknown) => e instanceof PayloadError && e.reason === reason;
  assert.throws(() => encodePayload({ mechanism: "hcms", row: 16, column: 0, sign: 1 }, 16, 16), err("row_out_of_range"));
  assert.throws(() => encodePayload({ mechanism: "hcms", row: 0, column: 16, sign: 1 }, 16, 16), err("index_out_of_range"));
  assert.throws(() => encodePayload({ mechanism: "gcms", row: 0, indices: [7, 4, 30] }, 16, 32), err("indices_not_ascending"));
  assert.throws(() => encodePayload({ mechanism: "cms", row: 2, bits: fromHex("b319") }, 4, 12), err("nonzero_padding"));
  assert.equal(toHex(encodePayload({ mechanism: "cms", row: 2, bits: fromHex("b309") }, 4, 12)), "010102000000b309");
});
