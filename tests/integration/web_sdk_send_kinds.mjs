// Sends SFP and discovery reports through the built TypeScript device SDK's WebDevice
// (producers/web/dist/ldpipe.js), for tests/integration/test_gateway_discovery.py. Reads one
// JSON object on stdin: gateway, use_case, credential, items (strings), and for a discovery use
// case tag_key {key_id, secret_hex}; prints {"kind", "accepted", "refused", "held", "undelivered"}.
import { WebDevice } from '../../producers/web/dist/ldpipe.js';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const tagKey = input.tag_key
    ? { keyId: input.tag_key.key_id, secret: Uint8Array.from(Buffer.from(input.tag_key.secret_hex, 'hex')) }
    : undefined;
const device = new WebDevice({
    gatewayUrl: input.gateway,
    useCase: input.use_case,
    credential: input.credential,
    ...(tagKey ? { tagKey } : {}),
});
const config = await device.configuration();
const result = await device.send(input.items);
process.stdout.write(JSON.stringify({
    kind: config.kind,
    accepted: result.accepted,
    refused: result.refused,
    held: result.held.length,
    undelivered: result.undelivered,
}) + '\n');
