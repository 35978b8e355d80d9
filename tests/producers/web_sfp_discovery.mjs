// Makes SFP report pairs, discovery reports and normalized items with the TypeScript SDK's bundle
// (producers/web/dist/ldpipe.js) for tests/producers/test_web_sfp_discovery.py. Request on stdin
// (JSON), answer on stdout (JSON, bytes in hex). Randomness: a seeded xoshiro128** (tests only).
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const bundle = new URL("../../producers/web/dist/ldpipe.js", import.meta.url);
const sdk = await import(fileURLToPath(bundle));
const request = JSON.parse(readFileSync(0, "utf8"));

function seeded(seed) {
  // xoshiro128** in 32-bit arithmetic (fast enough for the cms bit vectors), seeded by splitmix32
  let x = seed >>> 0;
  const next32 = () => {
    x = (x + 0x9e3779b9) >>> 0;
    let z = x;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
  const s = new Uint32Array([next32(), next32(), next32(), next32()]);
  const rotl = (v, k) => ((v << k) | (v >>> (32 - k))) >>> 0;
  const word = () => {
    const out = Math.imul(rotl(Math.imul(s[1], 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1] << 9) >>> 0;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return out;
  };
  return {
    fill(bytes) {
      for (let i = 0; i < bytes.length; i += 4) {
        const w = word();
        for (let b = 0; b < 4 && i + b < bytes.length; b++) bytes[i + b] = (w >>> (8 * b)) & 0xff;
      }
    },
  };
}

const key = (k) => (k == null ? undefined : { keyId: k.key_id, raw: sdk.fromHex(k.public_key_hex) });
const clock = () => request.now;
const answer = {};

if (request.sfp) {
  const r = request.sfp;
  const client = await sdk.SfpClient.create(r.settings);
  const rng = seeded(r.seed);
  const target = {
    useCase: r.use_case,
    epoch: r.epoch,
    analyzerKey: key(r.analyzer_key),
    ...(r.shuffler_key ? { shufflerKey: key(r.shuffler_key), timePrecisionSeconds: r.time_precision_seconds } : {}),
  };
  const words = [];
  const fragments = [];
  for (const word of r.words) {
    const sealed = await client.seal(word, target, { rng, clock });
    words.push(sdk.toHex(sealed.word));
    fragments.push(sdk.toHex(sealed.fragment));
  }
  answer.sfp = { words, fragments };
}

if (request.discovery) {
  const r = request.discovery;
  const client = new sdk.DiscoveryClient({
    useCase: r.use_case,
    epoch: r.epoch,
    rules: r.rules,
    serverKey: key(r.server_key),
    auxKey: key(r.aux_key),
    tagKey: { keyId: r.tag_key.key_id, secret: sdk.fromHex(r.tag_key.secret_hex) },
    ...(r.shuffler_key ? { shufflerKey: key(r.shuffler_key), timePrecisionSeconds: r.time_precision_seconds } : {}),
  });
  const reports = [];
  for (const item of r.items) reports.push(sdk.toHex(await client.encode(item, { clock })));
  answer.discovery = reports;
}

if (request.normalize) {
  answer.normalize = request.normalize.map(({ input, rules }) => {
    try {
      return { output: sdk.normalizeItem(input, rules) };
    } catch (err) {
      if (err instanceof sdk.DiscoveryError) return { reason: err.reason };
      throw err;
    }
  });
}

if (request.gateway_documents) {
  // the gateway's documents of an SFP use case's halves, read as a WebDevice reads them, beside
  // the SfpClient of the same settings: which randomizer each builds
  const r = request.gateway_documents;
  const client = await sdk.SfpClient.create(r.settings);
  const described = (m) => ({ mechanism: m.mechanism, epsilon: m.epsilon, seed: String(m.family.seed), k: m.family.k, m: m.family.m });
  const documents = {};
  for (const [name, body] of Object.entries(r.bodies)) {
    documents[name] = described((await sdk.parseConfiguration(body, null)).randomizer);
  }
  answer.gateway_documents = { documents, word: described(client.word), fragment: described(client.fragment), fragment_rows: client.fragmentRows };
}

process.stdout.write(JSON.stringify(answer));
