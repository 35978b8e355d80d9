// An independent Oblivious HTTP peer for ldpipe's interop tests (tests/interop/test_ohttp_interop.py):
// RFC 9292 messages by bhttp-js, RFC 9180 HPKE by @hpke/core, and RFC 9458's framing and response
// key schedule written here from the RFC with node:crypto. Nothing of ldpipe's code is used.
//
//   node peer.mjs client GATEWAY_URL AEAD_ID    fetch GATEWAY_URL/ohttp-keys, send an encapsulated
//                                               POST https://gateway.example/v1/echo through /ohttp and
//                                               print the decapsulated response as JSON
//   node peer.mjs gateway < JSON                open the encapsulated request in the JSON
//                                               ({skR, pkR, request}, hex) like a gateway, answer it,
//                                               print {method, url, headers, body, response} as JSON
import { Aes128Gcm, CipherSuite, DhkemX25519HkdfSha256, HkdfSha256 } from "@hpke/core";
import { Chacha20Poly1305 } from "@hpke/chacha20poly1305";
import { BHttpDecoder, BHttpEncoder } from "bhttp-js";
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from "node:crypto";

const REQUEST_LABEL = Buffer.from("message/bhttp request");
const RESPONSE_LABEL = Buffer.from("message/bhttp response");
const AEADS = {
  1: { make: () => new Aes128Gcm(), node: "aes-128-gcm", nk: 16, nn: 12 },
  3: { make: () => new Chacha20Poly1305(), node: "chacha20-poly1305", nk: 32, nn: 12 },
};

const hex = (b) => Buffer.from(b).toString("hex");
const unhex = (s) => new Uint8Array(Buffer.from(s, "hex"));

function suiteFor(aeadId) {
  const aead = AEADS[aeadId];
  if (!aead) throw new Error(`unsupported AEAD ${aeadId}`);
  return new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: aead.make() });
}

// RFC 9458 section 3.1, the first configuration of an application/ohttp-keys list (section 3.2)
function parseFirstConfig(list) {
  const buf = Buffer.from(list);
  const length = buf.readUInt16BE(0);
  const config = buf.subarray(2, 2 + length);
  const keyId = config[0];
  const kemId = config.readUInt16BE(1);
  if (kemId !== 0x0020) throw new Error(`unexpected KEM ${kemId}`);
  const publicKey = config.subarray(3, 35);
  const algorithmsLength = config.readUInt16BE(35);
  const algorithms = [];
  for (let at = 37; at < 37 + algorithmsLength; at += 4) {
    algorithms.push({ kdfId: config.readUInt16BE(at), aeadId: config.readUInt16BE(at + 2) });
  }
  return { keyId, kemId, publicKey, algorithms };
}

function header(keyId, aeadId) {
  const h = Buffer.alloc(7);
  h.writeUInt8(keyId, 0);
  h.writeUInt16BE(0x0020, 1);
  h.writeUInt16BE(0x0001, 3);
  h.writeUInt16BE(aeadId, 5);
  return h;
}

// RFC 9458 section 4.4: key and nonce from Extract(enc || response_nonce, secret)
function responseKeys(secret, enc, nonce, aeadId) {
  const { nk, nn } = AEADS[aeadId];
  const salt = Buffer.concat([Buffer.from(enc), Buffer.from(nonce)]);
  return {
    key: Buffer.from(hkdfSync("sha256", secret, salt, "key", nk)),
    iv: Buffer.from(hkdfSync("sha256", secret, salt, "nonce", nn)),
  };
}

function seal(aeadId, key, iv, plaintext) {
  const cipher = createCipheriv(AEADS[aeadId].node, key, iv, { authTagLength: 16 });
  return Buffer.concat([cipher.update(plaintext), cipher.final(), cipher.getAuthTag()]);
}

function open(aeadId, key, iv, sealed) {
  const decipher = createDecipheriv(AEADS[aeadId].node, key, iv, { authTagLength: 16 });
  decipher.setAuthTag(sealed.subarray(sealed.length - 16));
  return Buffer.concat([decipher.update(sealed.subarray(0, sealed.length - 16)), decipher.final()]);
}

async function client(gateway, aeadId) {
  const keys = await fetch(`${gateway}/ohttp-keys`);
  if (keys.headers.get("content-type") !== "application/ohttp-keys") throw new Error("keys media type");
  const config = parseFirstConfig(new Uint8Array(await keys.arrayBuffer()));
  if (!config.algorithms.some((a) => a.kdfId === 1 && a.aeadId === aeadId)) throw new Error("suite not offered");
  const suite = suiteFor(aeadId);
  const hdr = header(config.keyId, aeadId);
  const info = Buffer.concat([REQUEST_LABEL, Buffer.from([0]), hdr]);
  const sender = await suite.createSenderContext({
    recipientPublicKey: await suite.kem.deserializePublicKey(config.publicKey),
    info,
  });
  // no query string: bhttp-js 0.2.1 encodes the URL's pathname only and drops the query (RFC 9292
  // section 3.4 puts the whole ":path", query included, in the path field)
  const inner = new Request("https://gateway.example/v1/echo", {
    method: "POST",
    headers: { "content-type": "application/octet-stream", "x-peer": "bhttp-js" },
    body: "reports from node",
  });
  const bhttp = await new BHttpEncoder().encodeRequest(inner);
  const sealed = Buffer.from(await sender.seal(bhttp));
  const secret = Buffer.from(await sender.export(RESPONSE_LABEL, Math.max(AEADS[aeadId].nk, AEADS[aeadId].nn)));
  const body = Buffer.concat([hdr, Buffer.from(sender.enc), sealed]);
  const answer = await fetch(`${gateway}/ohttp`, {
    method: "POST",
    headers: { "content-type": "message/ohttp-req" },
    body,
  });
  if (answer.status !== 200) throw new Error(`gateway answered ${answer.status}: ${await answer.text()}`);
  if (answer.headers.get("content-type") !== "message/ohttp-res") throw new Error("response media type");
  const encapsulated = Buffer.from(await answer.arrayBuffer());
  const nonceLength = Math.max(AEADS[aeadId].nk, AEADS[aeadId].nn);
  const { key, iv } = responseKeys(secret, sender.enc, encapsulated.subarray(0, nonceLength), aeadId);
  const plain = open(aeadId, key, iv, encapsulated.subarray(nonceLength));
  const response = new BHttpDecoder().decodeResponse(plain);
  return {
    status: response.status,
    headers: Object.fromEntries(response.headers.entries()),
    body: await response.text(),
  };
}

async function gateway(input) {
  const data = JSON.parse(input);
  const wire = Buffer.from(unhex(data.request));
  const hdr = wire.subarray(0, 7);
  const aeadId = hdr.readUInt16BE(5);
  const suite = suiteFor(aeadId);
  const enc = wire.subarray(7, 39);
  const recipient = await suite.createRecipientContext({
    recipientKey: {
      privateKey: await suite.kem.deserializePrivateKey(unhex(data.skR)),
      publicKey: await suite.kem.deserializePublicKey(unhex(data.pkR)),
    },
    enc,
    info: Buffer.concat([REQUEST_LABEL, Buffer.from([0]), hdr]),
  });
  const plain = await recipient.open(wire.subarray(39));
  const request = new BHttpDecoder().decodeRequest(plain);
  const seen = {
    method: request.method,
    url: request.url,
    headers: Object.fromEntries(request.headers.entries()),
    body: await request.text(),
  };
  const response = new Response(`js saw ${seen.body.length} bytes`, {
    status: 202,
    headers: { "content-type": "text/plain", "x-peer": "bhttp-js" },
  });
  const encoded = await new BHttpEncoder().encodeResponse(response);
  const nonceLength = Math.max(AEADS[aeadId].nk, AEADS[aeadId].nn);
  const secret = Buffer.from(await recipient.export(RESPONSE_LABEL, nonceLength));
  const nonce = randomBytes(nonceLength);
  const { key, iv } = responseKeys(secret, enc, nonce, aeadId);
  return { ...seen, response: hex(Buffer.concat([nonce, seal(aeadId, key, iv, encoded)])) };
}

async function main() {
  const [mode, ...args] = process.argv.slice(2);
  let result;
  if (mode === "client") {
    result = await client(args[0], Number(args[1] ?? 1));
  } else if (mode === "gateway") {
    const chunks = [];
    for await (const chunk of process.stdin) chunks.push(chunk);
    result = await gateway(Buffer.concat(chunks).toString());
  } else {
    throw new Error("usage: node peer.mjs client URL [AEAD_ID] | gateway < JSON");
  }
  process.stdout.write(JSON.stringify(result) + "\n");
}

main().catch((error) => {
  process.stderr.write(`${error.stack ?? error}\n`);
  process.exit(1);
});
