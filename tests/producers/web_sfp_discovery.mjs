// Makes SFP report pairs, discovery reports and normalized items with the TypeScript SDK's bundle
// (producers/web/dist/ldpipe.js) for tests/producers/test_web_sfp_discovery.py. Request on stdin
// (JSON), answer on stdout (JSON, bytes in hex). Randomness: a seeded splitmix64 (tests only).
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const bundle = new URL("../../producers/web/dist/ldpipe.js", import.meta.url);
const sdk = await import(fileURLToPath(bundle));
const request = JSON.parse(readFileSync(0, "utf8"));

function seeded(seed) {
  let s = BigInt(seed);
  return {
    fill(bytes) {
      for (let i = 0; i < bytes.length; i += 8) {
        s = (s + 0x9e3779b97f4a7c15n) & 0xffffffffffffffffn;
        let z = s;
        z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & 0xffffffffffffffffn;
        z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & 0xffffffffffffffffn;
        z ^= z >> 31n;
        for (let b = 0; b < 8 && i + b < bytes.length; b++) bytes[i + b] = Number((z >> BigInt(8 * b)) & 0xffn);
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

process.stdout.write(JSON.stringify(answer));
