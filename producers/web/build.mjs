// Builds the ESM bundles (dist/ldpipe.js for browsers and Node 20; dist/ldpipe-node.mjs, the same
// with the Node-only file storage of the budget ledger), the conformance adapter
// (dist/conformance.mjs) and the tests (dist/test/*.test.mjs).
import { build } from "esbuild";
import { readdirSync } from "node:fs";

const common = { bundle: true, format: "esm", target: "es2022", sourcemap: true, logLevel: "warning" };
await build({ ...common, entryPoints: ["src/index.ts"], outfile: "dist/ldpipe.js", platform: "browser", minify: true });
await build({ ...common, entryPoints: ["src/node.ts"], outfile: "dist/ldpipe-node.mjs", platform: "node" });
await build({ ...common, entryPoints: ["tools/conformance.ts"], outfile: "dist/conformance.mjs", platform: "node" });
const tests = readdirSync("test").filter((f) => f.endsWith(".test.ts")).map((f) => `test/${f}`);
await build({
  ...common,
  entryPoints: tests,
  outdir: "dist/test",
  platform: "node",
  outExtension: { ".js": ".mjs" },
});
