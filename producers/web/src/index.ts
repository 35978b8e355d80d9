/** ldpipe's device SDK for browsers and Node 20 (docs/device-web.md). */
export * from "./bytes.js";
export * from "./hashing.js";
export * from "./payloads.js";
export * from "./randomize.js";
export * from "./envelope.js";
export * from "./tokens.js";
export * from "./upload.js";
export * from "./errors.js";
export * from "./retry.js";
export * from "./config.js";
export * from "./wallet.js";
export * from "./budget.js";
export * from "./device.js";
export * from "./sfp.js";
export * from "./discovery.js";
