#!/usr/bin/env node
// Runs the compiled CLI (dist/sessionstate.js, made by `npm run build`; `npm ci` builds it).
import { existsSync } from "node:fs";

const bundle = new URL("../dist/sessionstate.js", import.meta.url);
if (!existsSync(bundle)) {
  process.stderr.write("sessionstate: dist/sessionstate.js is missing; run `npm run build` (npm ci runs it) first\n");
  process.exit(1);
}
await import(bundle.href);
