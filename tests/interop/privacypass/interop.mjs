// ldpipe's Privacy Pass tokens against Cloudflare's implementation (@cloudflare/privacypass-ts),
// driven by tests/interop/test_privacypass.py. Reads one JSON object on stdin:
//   challenge        hex TokenChallenge (RFC 9577 §2.1.1) that ldpipe built
//   private_key_pem  (optional) an issuer key ldpipe made (PKCS #8): for part (a)
//   directory_url    (optional) ldpipe issuer's /.well-known/private-token-issuer-directory
//   use_case, period (with directory_url) which key of the directory to use
//   request_url, spki_hex (without directory_url) where to POST token requests, and the key
//   authorization    (optional) the Authorization header for the token request
// and prints one JSON object:
//   a: privacypass-ts both issues and finalizes a token with ldpipe's key: {token, spki}
//   b: privacypass-ts's client asks ldpipe's issuer over HTTP (its own sendTokenRequest),
//      finalizes and verifies the token with privacypass-ts's Origin: {token, verified}
import { TokenChallenge, publicVerif, sendTokenRequest, util } from '@cloudflare/privacypass-ts';

const { BlindRSAMode, Client, Issuer, Origin, TokenResponse, getPublicKeyBytes } = publicVerif;
const MODE = BlindRSAMode.PSS; // RSABSSA-SHA384-PSS-Deterministic, salt 48 (RFC 9578 §6)
const RSA = { name: 'RSA-PSS', hash: 'SHA-384' };

const hex = (bytes) => Buffer.from(bytes).toString('hex');
const unhex = (text) => new Uint8Array(Buffer.from(text, 'hex'));
const b64url = (text) => new Uint8Array(Buffer.from(text, 'base64url'));

async function readStdin() {
    const chunks = [];
    for await (const chunk of process.stdin) chunks.push(chunk);
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

function pemToDer(pem) {
    const body = pem.replace(/-----[^-]+-----/g, '').replace(/\s+/g, '');
    return new Uint8Array(Buffer.from(body, 'base64'));
}

async function keysFromPem(pem) {
    const privateKey = await crypto.subtle.importKey('pkcs8', pemToDer(pem), RSA, true, ['sign']);
    const jwk = await crypto.subtle.exportKey('jwk', privateKey);
    const publicJwk = { kty: jwk.kty, n: jwk.n, e: jwk.e, alg: jwk.alg, ext: true };
    const publicKey = await crypto.subtle.importKey('jwk', publicJwk, RSA, true, ['verify']);
    return { privateKey, publicKey };
}

async function partA(input, challenge) {
    const { privateKey, publicKey } = await keysFromPem(input.private_key_pem);
    const spki = await getPublicKeyBytes(publicKey);
    const issuer = new Issuer(MODE, challenge.issuerName, privateKey, publicKey);
    const client = new Client(MODE);
    const request = await client.createTokenRequest(challenge, spki);
    const response = await issuer.issue(request);
    const token = await client.finalize(response);
    if (!(await new Origin(MODE).verify(token, publicKey))) {
        throw new Error('privacypass-ts does not verify its own token');
    }
    return { token: hex(token.serialize()), spki: hex(spki) };
}

async function issuerKey(input) {
    if (!input.directory_url) {
        return { spki: unhex(input.spki_hex), requestUrl: input.request_url };
    }
    const res = await fetch(input.directory_url);
    if (res.status !== 200) throw new Error(`directory: HTTP ${res.status}`);
    const directory = await res.json();
    const key = directory['token-keys'].find(
        (k) => k['token-type'] === 2 && k['use-case'] === input.use_case && k.period === input.period,
    );
    if (!key) throw new Error(`directory has no key for ${input.use_case} period ${input.period}`);
    const requestUrl = new URL(directory['issuer-request-uri'], input.directory_url);
    requestUrl.searchParams.set('use_case', input.use_case);
    return { spki: b64url(key['token-key']), requestUrl: requestUrl.toString() };
}

async function partB(input, challenge) {
    const { spki, requestUrl } = await issuerKey(input);
    const client = new Client(MODE);
    const request = await client.createTokenRequest(challenge, spki);
    const headers = new Headers();
    if (input.authorization) headers.append('Authorization', input.authorization);
    const responseBytes = await sendTokenRequest(request.serialize(), requestUrl, headers);
    const token = await client.finalize(TokenResponse.deserialize(responseBytes));
    const spkiEnc = util.convertRSASSAPSSToEnc(spki);
    const publicKey = await crypto.subtle.importKey('spki', spkiEnc, RSA, true, ['verify']);
    const verified = await new Origin(MODE).verify(token, publicKey);
    return { token: hex(token.serialize()), verified, spki: hex(spki) };
}

const input = await readStdin();
const challenge = TokenChallenge.deserialize(unhex(input.challenge));
const output = {};
if (input.private_key_pem) output.a = await partA(input, challenge);
if (input.directory_url || input.request_url) output.b = await partB(input, challenge);
process.stdout.write(JSON.stringify(output) + '\n');
