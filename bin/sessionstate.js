#!/usr/bin/env node
// Runs the compiled CLI, dist/sessionstate.cjs (`npm run build` makes it; `npm ci` runs the
// build), through a V8 code cache kept beside it in dist/.code-cache: a start with the cache
// skips compiling what the last run compiled, which is a good part of the start-up time.
// The cache is keyed by the bundle's content and the Node version, written 1.5 s after a
// start that had none (once start-up has compiled what it needs), and only ever an
// optimisation: when it is missing, stale or cannot be written, the bundle simply compiles.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import Module, { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Script } from "node:vm";

const bundle = fileURLToPath(new URL("../dist/sessionstate.cjs", import.meta.url));
if (!existsSync(bundle)) {
  process.stderr.write("sessionstate: dist/sessionstate.cjs is missing; run `npm run build` (npm ci runs it) first\n");
  process.exit(1);
}
const source = readFileSync(bundle, "utf8");
const key = createHash("sha256").update(process.version).update(process.arch).update(source).digest("hex").slice(0, 20);
const cacheFile = join(dirname(bundle), ".code-cache", `sessionstate-${key}.bin`);
let cachedData;
try {
  cachedData = readFileSync(cacheFile);
} catch {
  // no cache yet
}
const script = new Script(Module.wrap(source), { filename: bundle, cachedData });
if (cachedData === undefined || script.cachedDataRejected) {
  const write = () => {
    try {
      mkdirSync(dirname(cacheFile), { recursive: true });
      const partial = `${cacheFile}.${process.pid}`;
      writeFileSync(partial, script.createCachedData());
      renameSync(partial, cacheFile);
    } catch {
      // a read-only install: run without the cache
    }
  };
  setTimeout(write, 1500).unref();
}
const module = { exports: {} };
script.runInThisContext().call(module.exports, module.exports, createRequire(bundle), module, bundle, dirname(bundle));
