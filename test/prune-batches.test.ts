/**
 * Retention's batches (design §3.4) as each backend's store reads them — events, and idle cursors: whatever the rows'
 * stamps — not in sequence order after a clock step across a restart — and whatever the
 * cutoffs, every batch holds only expired events, in sequence order, as many as the limit
 * allows, and batch after batch removes exactly the expired events. A small limit makes the
 * batch boundary (2,000 in production) come up in every run.
 */
import fc from "fast-check";
import { afterAll, beforeAll, expect, it } from "vitest";
import { openStorage } from "../src/core/openStorage.js";
import type { WatchCursor } from "../src/core/model.js";
import type { CursorKey, Storage } from "../src/core/storage.js";
import { testBackend, type TestBackend } from "./support/backends.js";

const SESSIONS = ["agent:main:a", "agent:main:b", "agent:ops:c"];
let database: TestBackend;
let storage: Storage;

beforeAll(async () => {
  database = await testBackend();
  storage = await openStorage({ db: database.db, poolSize: 2 });
});
afterAll(async () => {
  await storage?.close();
  await database?.dispose();
});

it("batch after batch, removes exactly the events below the row cutoff or recorded before the age cutoff", async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.record({ session: fc.constantFrom(...SESSIONS), recordedAt: fc.integer({ min: 0, max: 20 }) }), { maxLength: 30 }),
      fc.integer({ min: -1, max: 32 }),
      fc.integer({ min: 0, max: 21 }),
      fc.integer({ min: 1, max: 5 }),
      async (rows, belowOffset, recordedBefore, limit) => {
        // Written through the store (the serving connection is the only writer of its file).
        const stored = await storage.write(async (tx) => {
          const out: { sequence: number; recordedAt: number }[] = [];
          for (const r of rows) {
            const draft = {
              session: { agentId: r.session.split(":")[1]!, sessionKey: r.session },
              kind: "goal_changed" as const,
              actorType: "agent" as const,
              actorId: "",
              runId: "",
              occurredAt: r.recordedAt,
              summary: "x",
              payload: {},
              watcherKeys: [],
            };
            out.push({ sequence: await tx.log.insertEvent(draft, r.recordedAt), recordedAt: r.recordedAt });
          }
          return out;
        });
        const first = stored[0]?.sequence ?? 1;
        const below = first + belowOffset;
        const expired = stored.filter((s) => s.sequence < below || s.recordedAt < recordedBefore).map((s) => s.sequence);
        const removed: number[] = [];
        for (;;) {
          const batch = await storage.read(async (tx) => tx.log.expiredEvents(below, recordedBefore, limit));
          const sequences = batch.map((e) => e.sequence);
          const left = expired.filter((s) => !removed.includes(s));
          expect(sequences.length).toBe(Math.min(limit, left.length));
          expect(sequences.every((s) => left.includes(s))).toBe(true);
          expect(sequences).toEqual([...sequences].sort((x, y) => x - y));
          if (sequences.length === 0) break;
          await storage.write(async (tx) => tx.log.deleteEvents(sequences), { lock: batch.map((e) => e.session) });
          removed.push(...sequences);
          if (sequences.length < limit) break;
        }
        expect(removed.sort((x, y) => x - y)).toEqual(expired);
        // What is left goes before the next run.
        const rest = stored.map((s) => s.sequence).filter((q) => !removed.includes(q));
        if (rest.length > 0) await storage.write(async (tx) => tx.log.deleteEvents(rest));
      },
    ),
    { numRuns: database.backend === "postgres" ? 25 : 100 },
  );
});

it("the idle-cursor sweep, step after step, removes exactly the cursors untouched before the cutoff, each step within its keys", async () => {
  const keyOf = (c: CursorKey) => `${c.watcherKey}\u0000${c.targetAgentId}\u0000${c.targetKey}`;
  await fc.assert(
    fc.asyncProperty(
      fc.uniqueArray(
        fc.record({ watcher: fc.integer({ min: 0, max: 6 }), agent: fc.constantFrom("main", "ops"), target: fc.integer({ min: 0, max: 9 }), updatedAt: fc.integer({ min: 0, max: 20 }) }),
        { maxLength: 30, selector: (c) => `${c.watcher}/${c.agent}/${c.target}` },
      ),
      fc.integer({ min: 0, max: 21 }),
      fc.integer({ min: 1, max: 6 }),
      async (rows, updatedBefore, scan) => {
        const cursors: WatchCursor[] = rows.map((r) => ({
          watcherKey: `agent:main:w${r.watcher}`,
          targetAgentId: r.agent,
          targetKey: `agent:${r.agent}:t${r.target}`,
          lastSeen: 0,
          notified: 0,
          material: 0,
          provenance: "explicit",
          updatedAt: r.updatedAt,
        }));
        await storage.write(async (tx) => {
          for (const c of cursors) await tx.cursors.insertCursor(c);
        });
        // The model: the stored cursors in key order (the backends compare keys bytewise).
        let model = [...cursors].sort((a, b) => (keyOf(a) < keyOf(b) ? -1 : keyOf(a) > keyOf(b) ? 1 : 0));
        let after: CursorKey | undefined;
        let steps = 0;
        do {
          const from = after ? keyOf(after) : "";
          const window = model.filter((c) => keyOf(c) > from).slice(0, scan);
          const step = await storage.write(async (tx) => tx.cursors.expireCursors(updatedBefore, after, scan));
          expect(step.removed).toBe(window.filter((c) => c.updatedAt < updatedBefore).length);
          expect(step.last && keyOf(step.last)).toBe(window.length === scan ? keyOf(window[scan - 1]) : undefined);
          model = model.filter((c) => !(window.includes(c) && c.updatedAt < updatedBefore));
          after = step.last;
          steps++;
        } while (after);
        expect(steps).toBe(Math.floor(cursors.length / scan) + 1);
        const kept = await storage.read(async (tx) => {
          const found: WatchCursor[] = [];
          for (const c of cursors) {
            const stored = await tx.cursors.cursor(c.watcherKey, { agentId: c.targetAgentId, sessionKey: c.targetKey });
            if (stored) found.push(stored);
          }
          return found;
        });
        expect(kept.map(keyOf).sort()).toEqual(cursors.filter((c) => c.updatedAt >= updatedBefore).map(keyOf).sort());
        // What is left goes before the next run.
        await storage.write(async (tx) => {
          for (const c of kept) await tx.cursors.deleteCursor(c.watcherKey, { agentId: c.targetAgentId, sessionKey: c.targetKey });
        });
      },
    ),
    { numRuns: database.backend === "postgres" ? 25 : 100 },
  );
});
