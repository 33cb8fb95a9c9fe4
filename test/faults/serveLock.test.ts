/**
 * One serving process per SQLite file (design §7.1), whatever name the file is opened by: real
 * `sessionstate serve` processes on one file through a hard link (in another folder, so a
 * lock beside each name would not meet), a symbolic link to the file and one to its folder.
 * Each second server exits with code 2 naming the holder's PID and the name it serves by;
 * the first one keeps serving. Once it is gone by kill -9, its write-ahead log is under its
 * name, so another name is refused until that name served the file again; after a clean stop
 * any name serves it.
 */
import { linkSync, mkdirSync, readdirSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { clientsFor, tempDir } from "../support/harness.js";
import { killAllServerProcesses, serveUntilExit, startServerProcess } from "./support/serverProcess.js";

const dirs: { remove(): void }[] = [];
afterAll(() => {
  killAllServerProcesses();
  for (const d of dirs) d.remove();
});

function layout() {
  const dir = tempDir("sessionstate-lock-");
  dirs.push(dir);
  const home = join(dir.path, "home");
  const elsewhere = join(dir.path, "elsewhere");
  const locks = join(dir.path, "locks");
  mkdirSync(home);
  mkdirSync(elsewhere);
  return { home, elsewhere, locks, db: join(home, "state.db") };
}

describe("a second server on the same file under another name", () => {
  it("through a hard link in another folder, a symlink to the file and one to its folder: refused, naming the holder", async () => {
    const l = layout();
    const lockDir = ["--serve-lock-dir", l.locks];
    const first = await startServerProcess({ port: "any", db: l.db, args: lockDir });
    const c = clientsFor(first.url, "grpc");
    await c.sessions.upsertSession({ session: { sessionKey: "agent:main:main" } });

    const hard = join(l.elsewhere, "hard.db");
    linkSync(l.db, hard);
    const viaFile = join(l.elsewhere, "soft.db");
    symlinkSync(l.db, viaFile);
    const viaFolder = join(l.elsewhere, "folder");
    symlinkSync(l.home, viaFolder);

    for (const name of [hard, viaFile, join(viaFolder, "state.db")]) {
      const second = await serveUntilExit(["--db", name, ...lockDir]);
      expect(second.code, second.output).toBe(2);
      expect(second.output).toContain(
        `database "${name}" is already served by another process (PID ${first.pid}) as "${l.db}", the same file under another name (a hard link or a symbolic link)`,
      );
      expect(second.output).toContain("postgres://");
    }
    // The first server is untouched and still serves.
    await c.sessions.upsertSession({ session: { sessionKey: "agent:main:other" } });

    // Gone by kill -9: the locks went with it. Its write-ahead log is named after the name it
    // served by, so the hard link is refused until the file was served by that name again.
    await first.kill9();
    const early = await serveUntilExit(["--db", hard, ...lockDir]);
    expect(early.code, early.output).toBe(2);
    expect(early.output).toContain(`database "${hard}" is the file last served as "${l.db}", by a process that did not stop cleanly`);
    expect(early.output).toContain(`Serve it as "${l.db}" once`);
    // Refused again: the refusal left the crashed holder's entry as it was.
    expect((await serveUntilExit(["--db", hard, ...lockDir])).code).toBe(2);
    const recovered = await startServerProcess({ port: "any", db: l.db, args: lockDir });
    const r = clientsFor(recovered.url, "grpc");
    expect((await r.sessions.getSession({ session: { sessionKey: "agent:main:other" } })).session?.sessionKey).toBe("agent:main:other");
    expect(await recovered.stop()).toBe(0);

    // After a clean stop any name serves it, with everything acknowledged.
    const again = await startServerProcess({ port: "any", db: hard, args: lockDir });
    const a = clientsFor(again.url, "grpc");
    expect((await a.sessions.getSession({ session: { sessionKey: "agent:main:other" } })).session?.sessionKey).toBe("agent:main:other");
    // Now the original name is the second one.
    const original = await serveUntilExit(["--db", l.db, ...lockDir]);
    expect(original.code).toBe(2);
    expect(original.output).toContain(`database "${l.db}" is already served by another process (PID ${again.pid}) as "${hard}"`);
    // A clean stop removes its lock by inode; the directory is left empty.
    expect(await again.stop()).toBe(0);
    expect(readdirSync(l.locks).filter((f) => f.endsWith(".serve-lock"))).toEqual([]);
  });

  it("with the default lock directory (one per user in the temporary directory) too", async () => {
    const l = layout();
    const first = await startServerProcess({ port: "any", db: l.db });
    try {
      const hard = join(l.elsewhere, "hard.db");
      linkSync(l.db, hard);
      const second = await serveUntilExit(["--db", hard]);
      expect(second.code, second.output).toBe(2);
      expect(second.output).toContain(`(PID ${first.pid}) as "${l.db}"`);
    } finally {
      await first.stop();
    }
  });
});
