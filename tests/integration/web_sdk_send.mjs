// Sends reports through the built TypeScript device SDK (producers/web/dist/ldpipe.js), for
// tests/integration/test_web_sdk.py. Reads one JSON object on stdin:
//   gateway, use_case, credential, items (strings), seed (the randomizer's fixed stream)
// and prints {"accepted", "refused", "held", "undelivered", "etag_kept"}.
import { WebDevice } from '../../producers/web/dist/ldpipe.js';

/** splitmix64: the randomizer's noise is seeded so that the test's estimates are fixed. */
function seeded(seed) {
    let s = BigInt(seed);
    const M = 0xffffffffffffffffn;
    return {
        fill(bytes) {
            const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
            let i = 0;
            for (; i + 8 <= bytes.length; i += 8) view.setBigUint64(i, next(), true);
            if (i < bytes.length) {
                const last = next();
                for (let j = 0; i < bytes.length; i++, j++) bytes[i] = Number((last >> BigInt(8 * j)) & 0xffn);
            }
        },
    };
    function next() {
        s = (s + 0x9e3779b97f4a7c15n) & M;
        let z = s;
        z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
        z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
        return z ^ (z >> 31n);
    }
}

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const device = new WebDevice({
    gatewayUrl: input.gateway,
    useCase: input.use_case,
    credential: input.credential,
    rng: seeded(input.seed),
});
const config = await device.configuration();
const result = await device.send(input.items);
const again = await device.configuration(true); // If-None-Match: a 304 keeps the same object
process.stdout.write(JSON.stringify({
    accepted: result.accepted,
    refused: result.refused,
    held: result.held.length,
    undelivered: result.undelivered,
    etag_kept: again === config,
    seed: config.hashSeed.toString(),
}) + '\n');
