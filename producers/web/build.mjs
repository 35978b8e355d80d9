// Builds the ESM bundle (dist/ldpipe.js, for browsers and Node 20) and the tests (dist/test/*.test.js).
import { build } from "esbuild";
import { readdirSync } from "node:fs";

const common = { bundle: true, format: "esm", target: "es2022", sourcemap: true, logLevel: "warning" };
await build({ ...common, entryPoints: ["src/index.ts"], outfile: "dist/ldpipe.js", platform: "browser", minify: true });
const tests = readdirSync("test").filter((f) => f.endsWith(".test.ts")).map((f) => `test/${f}`);
await build({
  ...common,
  entryPoints: tests,
  outdir: "dist/test",
  platform: "node",
  outExtension: { ".js": ".mjs" },
});
