// Sends reports through the built TypeScript device SDK (producers/web/dist/ldpipe.js), for
// tests/integration/test_web_sdk.py. Reads one JSON object on stdin:
//   gateway, use_case, credential, items (strings), seed (the randomizer's fixed stream)
// and prints {"accepted", "refused", "held", "undelivered", "etag_kept"}.
import { WebDevice } from '../../producers/web/dist/ldpipe.js';
import { seeded } from '../browser/page/seeded.mjs';

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
