/**
 * How commits reach the WAL file. SQLite writes each frame of a commit with two write calls
 * (its header, then the page); under many small commits those calls are a good part of what
 * a COMMIT costs (docs/decisions/018-wal-writes.md). `gathered` (the default) loads
 * walcoalesce (native/walcoalesce.c, compiled into dist/ by the build), a VFS that hands a
 * commit's frames to the file system in one call, in the same order and before SQLite
 * publishes them, so readers, the checkpointer and crash recovery see exactly what they saw
 * before, and a commit whose write failed never reaches the file. `direct` leaves SQLite's
 * own VFS in place.
 *
 * The VFS becomes the process's default for every connection opened after it, so the choice
 * is made once per process: once gathered, always gathered.
 */
import Database from "better-sqlite3";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export type WalWrites = "gathered" | "direct";

export interface WalWritesState {
  /** What this process does now. */
  mode: WalWrites;
  /** The library loaded (gathered). */
  library?: string;
  /** Why gathering was asked for and is not in effect (no library built, load failed). */
  fallback?: string;
}

let loaded: WalWritesState | undefined;

/**
 * The library as the build leaves it, without its suffix (SQLite adds .so or .dylib): next
 * to the bundle (dist/), or in dist/ of the checkout when running from source.
 */
export function walLibraryPath(): string {
  // In the CommonJS bundle import.meta is empty and __dirname is dist/.
  const here = import.meta.url as string | undefined;
  return here ? fileURLToPath(new URL("../../../dist/walcoalesce", here)) : join(__dirname, "walcoalesce");
}

/** What this process does now, without loading anything. */
export function walWritesInEffect(): WalWrites {
  return loaded?.mode ?? "direct";
}

/** Asks for `mode`; returns what is in effect. Gathering, once loaded, stays for the process. */
export function useWalWrites(mode: WalWrites = "gathered", library = walLibraryPath()): WalWritesState {
  if (loaded) return loaded;
  if (mode === "direct") return { mode: "direct" };
  const file = `${library}.${process.platform === "darwin" ? "dylib" : "so"}`;
  if (!existsSync(file)) {
    return { mode: "direct", fallback: `${file} is not built (the build needs a C compiler: npm run build -- native)` };
  }
  const db = new Database(":memory:");
  try {
    db.loadExtension(library);
  } catch (err) {
    return { mode: "direct", fallback: `${file} could not be loaded: ${err instanceof Error ? err.message : String(err)}` };
  } finally {
    db.close();
  }
  loaded = { mode: "gathered", library: file };
  return loaded;
}
