/**
 * The operator console in a real browser: Debian's Chromium driven by playwright-core against
 * a real server (a token file, real sessions written through the RPCs), the page served by the
 * server itself at /console and reading everything through the generated client.
 *
 * With SESSIONSTATE_SCREENSHOTS=1 the main views are written to docs/images/console-*.png.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { writeFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { ActorType, EventKind } from "../../gen/sessionstate/v1/event_pb.js";
import { SessionKind } from "../../gen/sessionstate/v1/session_pb.js";
import { AdminService } from "../../gen/sessionstate/v1/admin_pb.js";
import { generateSecret, hashSecret, TokenFile } from "../../src/server/auth/tokens.js";
import { clientsFor, startTestServer, tempDir, transportFor, type TestServer } from "../support/harness.js";

const CHROMIUM = "/usr/bin/chromium";
const SCREENSHOTS = process.env.SESSIONSTATE_SCREENSHOTS === "1";
const IMAGES = join(import.meta.dirname, "../../docs/images");

const SECRETS = { admin: generateSecret(), reader: generateSecret(), ops: generateSecret() };
const PARENT = "agent:main:main";
const CHILD = "agent:main:subagent:research";
const OPS_MAIN = "agent:ops:main";
const OPS_CHILD = "agent:ops:subagent:deploy";

let t: TestServer;
let context: BrowserContext;
/** Uncaught errors of any page: each test ends asserting there were none. */
const pageErrors: string[] = [];
const dir = tempDir("sessionstate-console-");
const admin = () => clientsFor(t.url, "connect", { token: SECRETS.admin });

async function human(sessionKey: string, summary: string) {
  const res = await admin().state.appendEvents({
    events: [{ session: { sessionKey }, kind: EventKind.HUMAN_DIRECT_MESSAGE, actorType: ActorType.HUMAN, summary, payload: { channel: "telegram" } }],
  });
  return Number(res.results[0].sequence);
}

/** A new tab (its own sessionStorage) on the console, signed in with `secret`. */
async function openConsole(secret: string, hash = ""): Promise<Page> {
  const page = await context.newPage();
  page.on("pageerror", (err) => pageErrors.push(String(err)));
  // A CSP violation (an inline style or script, another origin) is reported on the console.
  page.on("console", (msg) => {
    if (/Content Security Policy|Refused to/i.test(msg.text())) pageErrors.push(msg.text());
  });
  await page.goto(`${t.url}/console/${hash}`);
  await page.locator('input[name="token"]').fill(secret);
  await page.locator('button[type="submit"]').click();
  await page.locator('[data-testid="who"]').waitFor();
  await page.locator('[data-testid="live-status"]', { hasText: /^live$/ }).waitFor();
  return page;
}

async function done(page: Page): Promise<void> {
  await page.close();
  expect(pageErrors).toEqual([]);
}

async function shot(page: Page, name: string): Promise<void> {
  if (!SCREENSHOTS) return;
  mkdirSync(IMAGES, { recursive: true });
  writeFileSync(join(IMAGES, `console-${name}.png`), await page.screenshot({ fullPage: true }));
}

beforeAll(async () => {
  const tokens = join(dir.path, "tokens.json");
  writeFileSync(
    tokens,
    JSON.stringify({
      tokens: [
        { name: "ops-admin", role: "admin", sha256: hashSecret(SECRETS.admin) },
        { name: "dashboard", role: "reader", sha256: hashSecret(SECRETS.reader) },
        { name: "ops-dashboard", role: "reader", agent_ids: ["ops"], sha256: hashSecret(SECRETS.ops) },
      ],
    }),
  );
  t = await startTestServer({ tokens: TokenFile.load(tokens) });
  const c = admin();
  for (const [main, child, label] of [
    [PARENT, CHILD, "research the outage"],
    [OPS_MAIN, OPS_CHILD, "deploy the fix"],
  ]) {
    await c.sessions.upsertSession({ session: { sessionKey: main }, kind: SessionKind.MAIN, model: "gpt-5", label: "front desk" });
    // The spawn seeds the parent's cursor on the child (design §3.1).
    await c.sessions.spawnSession({ parent: { sessionKey: main }, childSessionKey: child, kind: SessionKind.OTHER, label, model: "gpt-5-mini" });
  }
  await human(OPS_CHILD, "operator asked for a rollback plan");
  context = await chromium.launchPersistentContext(join(dir.path, "chromium-profile"), {
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1280, height: 860 },
  });
});

afterAll(async () => {
  await context?.close();
  await t?.stop();
  dir.remove();
});

describe("the console in Chromium", () => {
  it("shows the tree of sessions: a spawned child under its parent", async () => {
    const page = await openConsole(SECRETS.reader);
    const child = page.locator(`[data-testid="tree-row"][data-key="${CHILD}"]`);
    await child.waitFor();
    expect(await child.getAttribute("data-depth")).toBe("1");
    // The child's row follows its parent's, in the parent's agent.
    const rows = await page.locator('[data-testid="tree-agent"][data-agent="main"] [data-testid="tree-row"]').evaluateAll((els) =>
      els.map((e) => [e.getAttribute("data-key"), e.getAttribute("data-depth")]),
    );
    expect(rows).toEqual([
      [PARENT, "0"],
      [CHILD, "1"],
    ]);
    await shot(page, "tree");
    await done(page);
  });

  it("follows the child's timeline live and the parent's watcher row through the notice and its ack", async () => {
    const page = await openConsole(SECRETS.reader, `#/session?agent=main&key=${encodeURIComponent(CHILD)}`);
    const watcher = page.locator(`[data-testid="watcher-row"][data-key="${PARENT}"]`);
    await watcher.waitFor();
    expect(await watcher.getAttribute("data-pending")).toBe("false");

    const summary = "human wrote in telegram while the child worked";
    const sequence = await human(CHILD, summary);
    const row = page.locator(`[data-testid="timeline-row"][data-seq="${sequence}"]`);
    // Within 2 s and without a reload (the bound; the stream reads every 0.5 s): the
    // activity stream wakes the page, which reads changesSince.
    await row.waitFor({ timeout: 2000 });
    expect(await row.textContent()).toContain(summary);

    await page.locator(`[data-testid="watcher-row"][data-key="${PARENT}"][data-pending="true"]`).waitFor({ timeout: 5000 });
    expect(await watcher.textContent()).toContain("pending since");
    await shot(page, "session");

    const acked = await admin().watch.ackNotices({ watcherSessionKey: PARENT, acks: [{ targetSessionKey: CHILD }] });
    expect(acked.results[0].acked).toBe(true);
    await page.locator(`[data-testid="watcher-row"][data-key="${PARENT}"][data-pending="false"]`).waitFor({ timeout: 5000 });
    await done(page);
  });

  it("shows the live view: rates from the service's counters, the streams with their lag, the job leaders", async () => {
    // A Gateway's notice stream, to be listed.
    const abort = new AbortController();
    const stream = admin().watch.streamNotices({ agentId: "main" }, { signal: abort.signal });
    const reading = (async () => {
      try {
        for await (const _ of stream) void _;
      } catch {
        // ended by the abort
      }
    })();
    const page = await openConsole(SECRETS.reader, "#/live");
    await page.locator('[data-testid="stream-row"][data-kind="notices"]').waitFor();
    await page.locator('[data-testid="leader-row"]', { hasText: "prune" }).waitFor();
    // A few seconds of traffic for the chart (longer when the screenshot is taken, so it shows a line).
    const bursts = SCREENSHOTS ? 40 : 6;
    for (let i = 0; i < bursts; i++) {
      for (let j = 0; j <= i % 5; j++) await human(j % 2 === 0 ? CHILD : OPS_CHILD, `burst ${i}.${j}`);
      await new Promise((r) => setTimeout(r, 300));
    }
    await page.locator('[data-testid="feed-event"]', { hasText: `burst ${bursts - 1}.0` }).waitFor({ timeout: 5000 });
    await page.locator('[data-testid="counters"]').waitFor();
    await shot(page, "live");
    abort.abort();
    await reading;
    await done(page);
  });

  it("a reader token for agent ops sees nothing of agent main", async () => {
    const page = await openConsole(SECRETS.ops);
    await page.locator(`[data-testid="tree-row"][data-key="${OPS_CHILD}"]`).waitFor();
    await human(CHILD, "main activity that ops must not see");
    await human(OPS_CHILD, "ops activity");
    await page.goto(`${t.url}/console/#/live`);
    // A reload of the same tab keeps its sessionStorage token.
    await page.locator('[data-testid="feed-event"]', { hasText: "ops activity" }).waitFor({ timeout: 5000 });
    await page.goto(`${t.url}/console/#/`);
    await page.locator(`[data-testid="tree-row"][data-key="${OPS_CHILD}"]`).waitFor();
    const text = (await page.locator("body").innerText()) + (await page.content());
    expect(text).not.toContain("agent:main");
    expect(await page.locator('[data-testid="tree-agent"]').evaluateAll((els) => els.map((e) => e.getAttribute("data-agent")))).toEqual(["ops"]);
    // The main session's own page: every read refused, nothing shown but the refusal.
    await page.goto(`${t.url}/console/#/session?agent=main&key=${encodeURIComponent(CHILD)}`);
    await page.locator(".error", { hasText: "permission_denied" }).first().waitFor();
    expect(await page.locator('[data-testid="timeline-row"], [data-testid="watcher-row"]').count()).toBe(0);
    await done(page);
  });

  it("and the RPCs refuse that token every read of agent main", async () => {
    const ops = clientsFor(t.url, "connect", { token: SECRETS.ops });
    const opsAdmin = createClient(AdminService, transportFor(t.url, "connect", { token: SECRETS.ops }));
    const denied = async (call: Promise<unknown>) => {
      const err = await call.then(() => undefined, (e: unknown) => ConnectError.from(e));
      expect(err?.code, err?.rawMessage).toBe(Code.PermissionDenied);
    };
    await denied(ops.sessions.listSessions({}));
    await denied(ops.sessions.listSessions({ agentId: "main" }));
    await denied(ops.state.getStatus({ session: { sessionKey: CHILD }, changesSince: 0n }));
    await denied(ops.watch.listWatchCursors({ selector: { case: "watcherSessionKey", value: PARENT } }));
    await denied(opsAdmin.listCursors({}));
    await denied(opsAdmin.listCursors({ agentIds: ["ops", "main"] }));
    await denied(opsAdmin.getCounters({}));
    await denied(opsAdmin.getInboxBacklog({ session: { sessionKey: PARENT } }));
    await denied((async () => {
      for await (const _ of opsAdmin.watchActivity({})) void _;
    })());
    // /metrics covers every agent too.
    const metrics = (secret: string) => fetch(`${t.url}/metrics`, { headers: { authorization: `Bearer ${secret}` } });
    expect((await metrics(SECRETS.ops)).status).toBe(403);
    expect((await metrics(SECRETS.reader)).status).toBe(200);
    // What it may read is only its own agent's.
    const listed = await ops.sessions.listSessions({ agentId: "ops" });
    expect(listed.sessions.map((s) => s.sessionKey).sort()).toEqual([OPS_MAIN, OPS_CHILD]);
    const cursors = await opsAdmin.listCursors({ agentIds: ["ops"] });
    expect(cursors.cursors.map((c) => c.cursor!.watcherSessionKey)).toEqual([OPS_MAIN]);
    const me = await opsAdmin.whoAmI({});
    expect({ name: me.tokenName, role: me.role, agents: me.agentIds }).toEqual({ name: "ops-dashboard", role: "reader", agents: ["ops"] });
  });
});

describe("the console without a token file", () => {
  it("opens on loopback without asking for a token, like the rest of the service", async () => {
    const open = await startTestServer();
    try {
      await open.sessions.upsertSession({ session: { sessionKey: PARENT }, kind: SessionKind.MAIN });
      const page = await context.newPage();
      page.on("pageerror", (err) => pageErrors.push(String(err)));
      await page.goto(`${open.url}/console/`);
      await page.locator(`[data-testid="tree-row"][data-key="${PARENT}"]`).waitFor();
      expect(await page.locator('input[name="token"]').count()).toBe(0);
      expect(await page.locator('[data-testid="who"]').textContent()).toContain("no authentication (loopback)");
      await done(page);
    } finally {
      await open.stop();
    }
  });
});

describe("the console's files", () => {
  const get = (path: string, init?: RequestInit) => fetch(`${t.url}${path}`, init);

  it("are served with a strict CSP, nosniff, no-cache for the page and immutable hashed assets", async () => {
    const redirect = await get("/console", { redirect: "manual" });
    expect(redirect.status).toBe(308);
    expect(redirect.headers.get("location")).toBe("/console/");
    const page = await get("/console/");
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(page.headers.get("cache-control")).toBe("no-cache");
    const csp = page.headers.get("content-security-policy") ?? "";
    expect(csp).toContain("default-src 'self'");
    expect(csp).toContain("frame-ancestors 'none'");
    expect(csp).not.toContain("unsafe-inline");
    expect(csp).not.toContain("unsafe-eval");
    expect(page.headers.get("x-content-type-options")).toBe("nosniff");
    const html = await page.text();
    // No inline script or style: every script and stylesheet is a file of its own.
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/);
    expect(html).not.toMatch(/<style|style=/);
    const assets = [...html.matchAll(/(?:src|href)="(assets\/[^"]+)"/g)].map((m) => m[1]);
    expect(assets.length).toBe(2);
    for (const asset of assets) {
      const res = await get(`/console/${asset}`);
      expect(res.status).toBe(200);
      expect(res.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
      expect(res.headers.get("x-content-type-options")).toBe("nosniff");
      const again = await get(`/console/${asset}`, { headers: { "if-none-match": res.headers.get("etag")! } });
      expect(again.status).toBe(304);
    }
  });

  it("refuse traversal, unknown names and methods other than GET and HEAD", async () => {
    for (const path of [
      "/console/../package.json",
      "/console/assets/../../package.json",
      "/console/%2e%2e/%2e%2e/package.json",
      "/console/assets/%2e%2e%2findex.html",
      "/console/assets/..%2f..%2fsessionstate.cjs",
      "/console/index.html/",
      "/console/assets/",
      "/console/nothing.js",
    ]) {
      const res = await get(path);
      // fetch normalises plain "../" itself; what reaches the server is either outside /console (404) or not a served name.
      expect(res.status, path).toBe(404);
      expect(await res.text()).not.toContain('"name"');
    }
    for (const method of ["POST", "PUT", "DELETE", "PATCH"]) {
      const res = await get("/console/", { method });
      expect(res.status, method).toBe(405);
      expect(res.headers.get("allow")).toBe("GET, HEAD");
    }
    const head = await get("/console/", { method: "HEAD" });
    expect(head.status).toBe(200);
    expect(await head.text()).toBe("");
  });
});
