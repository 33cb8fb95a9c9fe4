/**
 * Retention's batches (SPEC §3.4) as each backend's store reads them: whatever the rows'
 * stamps — not in sequence order after a clock step across a restart — and whatever the
 * cutoffs, every batch holds only expired events, in sequence order, as many as the limit
 * allows, and batch after batch removes exactly the expired events. A small limit makes the
 * batch boundary (2,000 in production) come up in every run.
 */
import fc from "fast-check";
import { afterAll, beforeAll, expect, it } from "vitest";
import { openStorage } from "../src/core/openStorage.js";
import type { Storage } from "../src/core/storage.js";
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
