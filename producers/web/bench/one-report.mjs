// One report of the TypeScript SDK against bare @hpke/core seals, in one Node process
// (benchmarks/one_report.py runs it and prints its figures; docs/benchmarks.md).
//   node producers/web/bench/one-report.mjs [--n 4000] [--repeats 5] [--slice 200]
// Prints one JSON line: CPU microseconds per report of every case (best of the rounds).
// CMS, eps = 4, k = 1,024, m = 1,024, as benchmarks/one_report.py; the device cases call the
// SDK's Randomizer, encodePayload, sealInner and sealOuter as WebDevice.seal does.
import { Chacha20Poly1305 } from "@hpke/chacha20poly1305";
import { CipherSuite, HkdfSha256 } from "@hpke/core";
import { DhkemX25519HkdfSha256 } from "@hpke/dhkem-x25519";
import { Randomizer, encodePayload, innerHeader, outerHeader, roundTime, sealInner, sealOuter } from "../dist/ldpipe.js";

const arg = (name, fallback) => {
  const at = process.argv.indexOf(`--${name}`);
  return at > 0 ? Number(process.argv[at + 1]) : fallback;
};
const n = arg("n", 4000);
const repeats = arg("repeats", 5);
const slice = arg("slice", 200);

const suite = new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: new Chacha20Poly1305() });
const raw = async (pair) => new Uint8Array(await suite.kem.serializePublicKey(pair.publicKey));
const analyzerPair = await suite.kem.generateKeyPair();
const shufflerPair = await suite.kem.generateKeyPair();
const analyzer = { keyId: 1, raw: await raw(analyzerPair) };
const shuffler = { keyId: 9, raw: await raw(shufflerPair) };
const randomizer = await Randomizer.create("cms", 4, String(2n ** 63n + 5n), 1024, 1024);
const items = ["😀", "😂", "❤️", "👍", "🙏", "😍", "🎉", "🔥"];
const payload = encodePayload(await randomizer.randomize(items[0]), 1024, 1024);
const time = roundTime(Date.now() / 1000, 3600);
const innerInfo = innerHeader("emoji", 1, 1, 2);
const outerInfo = outerHeader("emoji", 9, new Uint8Array(16), time);
const recipient = analyzerPair.publicKey;
const second = shufflerPair.publicKey;

const cases = {
  "bare seal": async () => {
    for (let i = 0; i < slice; i++) await suite.seal({ recipientPublicKey: recipient, info: innerInfo }, payload);
  },
  "bare two seals": async () => {
    for (let i = 0; i < slice; i++) {
      const { enc, ct } = await suite.seal({ recipientPublicKey: recipient, info: innerInfo }, payload);
      const inner = new Uint8Array(innerInfo.length + enc.byteLength + ct.byteLength);
      inner.set(innerInfo);
      inner.set(new Uint8Array(enc), innerInfo.length);
      inner.set(new Uint8Array(ct), innerInfo.length + enc.byteLength);
      await suite.seal({ recipientPublicKey: second, info: outerInfo }, inner);
    }
  },
  "device, single layer": async (start) => {
    for (let i = 0; i < slice; i++) {
      const report = await randomizer.randomize(items[(start + i) % items.length]);
      await sealInner(encodePayload(report, 1024, 1024), "emoji", 1, analyzer, { version: 1 });
    }
  },
  "device, nested": async (start) => {
    for (let i = 0; i < slice; i++) {
      const report = await randomizer.randomize(items[(start + i) % items.length]);
      const inner = await sealInner(encodePayload(report, 1024, 1024), "emoji", 1, analyzer);
      await sealOuter(inner, "emoji", shuffler, roundTime(Date.now() / 1000, 3600));
    }
  },
  "randomize + encode": async (start) => {
    for (let i = 0; i < slice; i++) encodePayload(await randomizer.randomize(items[(start + i) % items.length]), 1024, 1024);
  },
};

const names = Object.keys(cases);
for (const name of names) await cases[name](0); // warm up
const best = Object.fromEntries(names.map((name) => [name, Infinity]));
for (let round = 0; round < repeats; round++) {
  const totals = Object.fromEntries(names.map((name) => [name, 0]));
  for (let index = 0, start = 0; start < n; index++, start += slice) {
    const shift = index % names.length;
    for (const name of [...names.slice(shift), ...names.slice(0, shift)]) {
      const before = process.cpuUsage();
      await cases[name](start);
      const used = process.cpuUsage(before);
      totals[name] += used.user + used.system;
    }
  }
  for (const name of names) best[name] = Math.min(best[name], totals[name]);
}
const usPerReport = Object.fromEntries(names.map((name) => [name, best[name] / n]));
console.log(JSON.stringify({ node: process.version, n, repeats, us_per_report: usPerReport }));
