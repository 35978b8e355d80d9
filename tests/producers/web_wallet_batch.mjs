// Takes tokens with the built TypeScript SDK's TokenWallet (producers/web/dist/ldpipe.js) from a
// real `ldpipe issuer`, for tests/producers/test_web_wallet_batch.py. Reads one JSON object on
// stdin: directory, use_case, credential, period, issuer_name, origin_name, takes (counts), and
// prints, for each take, the tokens (hex) and the POSTs it sent ("<path> <count of requests>").
import { TokenWallet } from '../../producers/web/dist/ldpipe.js';

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString('utf8'));
let posts = [];
const counting = async (url, init) => {
    if (init?.method === 'POST') {
        const body = new Uint8Array(init.body);
        const path = new URL(url).pathname;
        posts.push(path.endsWith('batch-request') ? `${path} ${(body[0] << 8) | body[1]}` : `${path} 1`);
    }
    return fetch(url, init);
};
const policy = { attempts: 3, baseDelay: 0.1, maxDelay: 1, maxRetryAfter: 10 };
const wallet = new TokenWallet(input.directory, input.use_case, input.credential, policy, counting);
const out = [];
for (const count of input.takes) {
    posts = [];
    const tokens = await wallet.take(count, input.period, input.issuer_name, input.origin_name);
    out.push({ tokens: tokens.map((t) => Buffer.from(t).toString('hex')), posts });
}
process.stdout.write(JSON.stringify(out) + '\n');
