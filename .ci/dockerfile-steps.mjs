#!/usr/bin/env node
/**
 * Runs the steps of a Dockerfile on this machine, without Docker: CI has no Docker daemon, and
 * hadolint, the usual Dockerfile linter, is not packaged by Debian. So the file is checked by
 * doing what it says, against the packed server, and then by running the image's command:
 *
 *   node .ci/dockerfile-steps.mjs deploy/Dockerfile CONTEXT_DIR     (CONTEXT_DIR holds the tarball)
 *
 * Every stage runs in one scratch folder that stands in for the image's file system: the
 * absolute paths the image owns (/opt/, /var/lib/, /etc/sessionstate, /tmp/) are moved under
 * it, in RUN commands, ENV values, WORKDIR, COPY and the command; every other path (/usr/bin,
 * the compiler, npm's cache) is the host's. RUN runs with `sh -c` in the stage's WORKDIR with
 * its ENV (npm prefers its cache: `npm_config_prefer_offline`). USER is not switched.
 *
 * Then, as `docker run` would: a token file where SESSIONSTATE_TOKENS points (the operator
 * mounts one), ENTRYPOINT + CMD started with the last stage's ENV, except SESSIONSTATE_HOST=127.0.0.1 and
 * SESSIONSTATE_PORT=0 (this host may have 8080 taken); the HEALTHCHECK command until it
 * passes; a call without a token (401) and with one (200); SIGTERM, which must end it with 0.
 * Exit 0 when all of that held; 1, with what failed, otherwise.
 */
import { spawn, spawnSync } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";

const [dockerfile, context] = process.argv.slice(2);
if (!dockerfile || !context) {
  process.stderr.write("usage: node .ci/dockerfile-steps.mjs DOCKERFILE CONTEXT_DIR\n");
  process.exit(2);
}

const root = mkdtempSync(join(tmpdir(), "dockerfile-steps-"));
const RELOCATED = ["/opt/", "/var/lib/", "/etc/sessionstate", "/tmp/"];
/** A path (or a command's text) with the image's own absolute paths moved under the scratch root. */
const relocate = (text) =>
  text.replace(new RegExp(`(^|[\\s"'=:(\`])(${RELOCATED.map((p) => p.replace(/\//g, "\\/")).join("|")})`, "g"), (_, before, path) => `${before}${root}${path}`);
const say = (line) => process.stdout.write(`dockerfile-steps: ${line}\n`);

/** The instructions: continuation lines joined, comments and parser directives dropped. */
function instructions(text) {
  const out = [];
  let pending = "";
  for (const raw of text.split("\n")) {
    const line = raw.trimEnd();
    if (/^\s*#/.test(line)) continue;
    if (line.endsWith("\\")) {
      pending += line.slice(0, -1) + " ";
      continue;
    }
    const whole = (pending + line).trim();
    pending = "";
    if (whole === "") continue;
    const m = /^(\w+)\s+([\s\S]*)$/.exec(whole);
    if (!m) throw new Error(`cannot read the instruction "${whole}"`);
    out.push({ keyword: m[1].toUpperCase(), args: m[2].trim() });
  }
  return out;
}

/** `${NAME}` and `$NAME` from `vars`. */
const expand = (text, vars) => text.replace(/\$\{(\w+)\}|\$(\w+)/g, (all, a, b) => vars[a ?? b] ?? all);

/** KEY=value pairs (values may be quoted), or the old `KEY value` form. */
function pairs(args) {
  if (!/^\w+=/.test(args)) {
    const [key, ...rest] = args.split(/\s+/);
    return [[key, rest.join(" ")]];
  }
  const found = [];
  const re = /(\w+)=("(?:[^"\\]|\\.)*"|\S*)/g;
  for (let m; (m = re.exec(args)); ) found.push([m[1], m[2].startsWith('"') ? JSON.parse(m[2]) : m[2]]);
  return found;
}

/** The exec form (a JSON array) or the shell form of a command. */
const commandOf = (args) => (args.startsWith("[") ? JSON.parse(args) : ["/bin/sh", "-c", args]);

function fail(message) {
  process.stderr.write(`dockerfile-steps: FAILED: ${message}\n`);
  process.exitCode = 1;
  throw new Error(message);
}

async function main() {
  const globalArgs = {};
  let stage;
  for (const { keyword, args } of instructions(readFileSync(dockerfile, "utf8"))) {
    if (keyword === "ARG") {
      const [key, value] = args.includes("=") ? [args.slice(0, args.indexOf("=")), args.slice(args.indexOf("=") + 1)] : [args, ""];
      (stage ? stage.env : globalArgs)[key] ??= value;
      continue;
    }
    if (keyword === "FROM") {
      const [image, , name] = expand(args, globalArgs).split(/\s+/);
      stage = { image, name, env: {}, workdir: "/", run: {} };
      say(`FROM ${image}${name ? ` AS ${name}` : ""} (this host's Node ${process.version} stands in for the image's)`);
      continue;
    }
    if (!stage) fail(`${keyword} before FROM`);
    switch (keyword) {
      case "ENV":
        for (const [key, value] of pairs(args)) stage.env[key] = relocate(expand(value, stage.env));
        break;
      case "WORKDIR":
        stage.workdir = resolve(stage.workdir, expand(args, stage.env));
        mkdirSync(relocate(stage.workdir), { recursive: true });
        break;
      case "COPY": {
        const words = args.split(/\s+/);
        const from = words.find((w) => w.startsWith("--from="));
        const paths = words.filter((w) => !w.startsWith("--"));
        const dest = relocate(resolve(stage.workdir, paths.pop()));
        for (const src of paths) {
          if (from) {
            // Every stage shares the scratch root: a copy between stages is already in place.
            const source = relocate(src);
            if (resolve(source) !== resolve(dest)) cpSync(source, dest, { recursive: true });
            continue;
          }
          const pattern = new RegExp(`^${src.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, "[^/]*").replace(/\?/g, "[^/]")}$`);
          const matches = readdirSync(context).filter((f) => pattern.test(f));
          if (matches.length !== 1) fail(`COPY ${src}: expected one file in ${context}, found ${matches.length}`);
          mkdirSync(dest.endsWith("/") ? dest : dirname(dest), { recursive: true });
          cpSync(join(context, matches[0]), dest, { recursive: true });
        }
        say(`COPY ${args}`);
        break;
      }
      case "RUN": {
        say(`RUN ${args}`);
        const [file, ...argv] = commandOf(args).map(relocate);
        const result = spawnSync(file, argv, {
          cwd: relocate(stage.workdir),
          env: { ...process.env, ...stage.env, npm_config_prefer_offline: "true" },
          stdio: "inherit",
        });
        if (result.status !== 0) fail(`RUN ${args}: exit ${result.status ?? result.signal}`);
        break;
      }
      case "USER":
      case "VOLUME":
      case "EXPOSE":
        say(`${keyword} ${args} (noted)`);
        stage.run[keyword] = args;
        break;
      case "HEALTHCHECK":
        stage.run.HEALTHCHECK = commandOf(args.slice(args.indexOf("CMD") + 3).trim());
        break;
      case "ENTRYPOINT":
      case "CMD":
        stage.run[keyword] = commandOf(args);
        break;
      default:
        fail(`${keyword}: not an instruction this runner knows`);
    }
  }
  await runImage(stage);
}

/** `docker run` of the last stage, then the health check, two calls and a graceful stop. */
async function runImage(stage) {
  const command = [...(stage.run.ENTRYPOINT ?? []), ...(stage.run.CMD ?? [])].map(relocate);
  if (command.length === 0) fail("the image has no ENTRYPOINT or CMD");
  const env = { ...process.env, ...stage.env, SESSIONSTATE_HOST: "127.0.0.1", SESSIONSTATE_PORT: "0" };
  const [file, ...argv] = command;

  // The token file the operator mounts, made with the image's own CLI.
  const cli = command.slice(0, command.indexOf(command.find((a) => a.endsWith("sessionstate.js"))) + 1);
  const made = spawnSync(cli[0], [...cli.slice(1), "token", "create", "--name", "ci", "--role", "admin", "--json"], { env, encoding: "utf8" });
  if (made.status !== 0) fail(`token create: ${made.stderr}`);
  const { secret, entry } = JSON.parse(made.stdout);
  if (env.SESSIONSTATE_TOKENS) {
    mkdirSync(dirname(env.SESSIONSTATE_TOKENS), { recursive: true });
    writeFileSync(env.SESSIONSTATE_TOKENS, JSON.stringify({ tokens: [entry] }), { mode: 0o640 });
  }

  say(`run: ${command.join(" ")}`);
  const child = spawn(file, argv, { env, stdio: ["ignore", "pipe", "inherit"] });
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve(code ?? signal)));
  try {
    const url = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("no `serving` log line within 30 s")), 30_000);
      createInterface({ input: child.stdout }).on("line", (line) => {
        process.stdout.write(`  | ${line}\n`);
        try {
          const entry = JSON.parse(line);
          if (entry.msg === "serving") {
            clearTimeout(timer);
            resolve(entry.url);
          }
        } catch {
          // not JSON: shown above
        }
      });
      void exited.then((code) => reject(new Error(`the server exited (${code}) before serving`)));
    }).catch((err) => fail(err.message));
    const port = new URL(url).port;

    if (stage.run.HEALTHCHECK) {
      const [hc, ...hcArgs] = stage.run.HEALTHCHECK.map(relocate);
      let passed = false;
      for (let attempt = 0; attempt < 30 && !passed; attempt++) {
        passed = spawnSync(hc, hcArgs, { env: { ...env, SESSIONSTATE_PORT: port }, stdio: "inherit" }).status === 0;
        if (!passed) await new Promise((r) => setTimeout(r, 500));
      }
      if (!passed) fail("the HEALTHCHECK command did not pass");
      say("HEALTHCHECK passed");
    }

    const upsert = (headers) =>
      fetch(`${url}/sessionstate.v1.SessionService/UpsertSession`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: JSON.stringify({ session: { sessionKey: "agent:ci:main" }, kind: "SESSION_KIND_MAIN" }),
      }).then((r) => r.status);
    const without = await upsert({});
    const withToken = await upsert({ authorization: `Bearer ${secret}` });
    if (without !== 401 || withToken !== 200) fail(`UpsertSession answered ${without} without a token (want 401) and ${withToken} with one (want 200)`);
    say("UpsertSession: 401 without a token, 200 with one");

    child.kill("SIGTERM");
    const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r("no exit within 30 s"), 30_000))]);
    if (code !== 0) fail(`SIGTERM: the server ended with ${code}, not 0`);
    say("SIGTERM: stopped with exit 0");
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  }
}

main()
  .then(() => say("ok"))
  .catch((err) => {
    if (process.exitCode !== 1) process.stderr.write(`dockerfile-steps: FAILED: ${err.stack ?? err}\n`);
    process.exitCode = 1;
  })
  .finally(() => rmSync(root, { recursive: true, force: true }));
