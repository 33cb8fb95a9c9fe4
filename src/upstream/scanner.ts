/**
 * Incremental scanner for one upstream JSONL transcript.
 *
 * Each call reads forward from a byte-offset marker, classifies every
 * COMPLETE line (one ending in "\n") with the rule of ./classify.ts and
 * returns the items plus the marker to pass to the next call. No network, no
 * whole-file reads: a FileHandle and one reusable buffer.
 *
 * Rules
 * - Cursor, not window: items come back in file order, every complete line
 *   exactly once across calls; `marker.offset` is the first byte after the
 *   last classified line (or inside an oversized row, see below). Store the
 *   marker only together with the items it covers.
 * - Budget: at most `budgetBytes` (default 1 MiB) are tokenized per call. A line cut
 *   by the budget, or still being written (no "\n" yet), is left for the next
 *   call: the marker stays at its first byte. Bytes are never skipped: a
 *   complete line that is not valid JSON becomes an item of kind "invalid".
 * - One classifier for every row: lines are not decoded and JSON.parse'd but
 *   fed, as raw bytes, to a resumable JSON lexer (StreamingRowClassifier in
 *   ./classify.ts) that checks the JSON grammar and keeps only what the rule
 *   needs: top-level type/isMeta/isSidechain/isCompactSummary/uuid/timestamp,
 *   message.role, whether a tool_result block was seen, and the first
 *   maxTextBytes of the human text. It is several times faster than
 *   decode + JSON.parse, and its state is small whatever the row size
 *   (about 2 × maxTextBytes plus the nesting stack). Property tests check it
 *   against JSON.parse + classifyTranscriptRow.
 * - Oversized rows: instead of a raw prefix (which would miss a uuid or a
 *   tool_result block that comes after megabytes of content) the scanner
 *   carries that lexer state. An unfinished row that already fills the read
 *   buffer (min(budgetBytes, lineBufferBytes = 1 MiB)) is saved in
 *   `marker.pending` (JSON-serialisable) and `marker.offset` moves past the
 *   bytes read, so each call advances through the row in bounded memory, the
 *   row is classified (valid or "invalid") once its "\n" arrives, and the rows
 *   after it are found. Only difference from JSON.parse: nesting deeper than
 *   65,536 levels is "invalid".
 * - Skimming (catch-up): once at least skimAfterBytes (64 KiB) of an unfinished
 *   row were tokenized and its prefix already shows it can never be a human turn
 *   (StreamingRowClassifier.prefixVerdict: a tool_result block, an assistant or
 *   other type or role, isMeta, isSidechain, not an object, not valid JSON), the
 *   rest of the row is passed over by a newline search (Buffer.indexOf over the
 *   same read buffer) instead of being tokenized, within a separate budget of
 *   skimBudgetBytes per call (64 MiB). The row still becomes one item, of the
 *   kind its prefix decided, marked `skimmed`; a skim cut by its budget goes on
 *   next call from `marker.pending.skim`. So a 24 MiB tool output no longer
 *   holds back the human line after it, and memory stays one read buffer.
 *   What a skimmed row gives up, for rows that long only: a later duplicate key
 *   (which JSON.parse would let win) and the validity of the skimmed bytes are
 *   not read, so its kind may differ among the non-human kinds.
 * - File identity: when `marker.inode` differs from the file's inode, or the
 *   file is shorter than `marker.offset`, the file was replaced or truncated:
 *   scanning restarts at 0 and the result says `rotated: true` with a
 *   `resetReason`.
 * - Status: "found" when the file was read; "missing" when it does not exist
 *   and its directory could be looked at (definitive: the directory exists and
 *   has no such entry, or the directory itself does not exist); otherwise
 *   (EACCES, EIO, ENOTDIR, not a regular file, read errors) "indeterminate"
 *   with the error text. On "missing"/"indeterminate" no items are returned
 *   and the marker is the one passed in.
 */
import { open, stat } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { dirname } from "node:path";
import type { ClassifiedRow } from "./classify.js";
import { MAX_STREAM_TEXT_BYTES, StreamingRowClassifier, type NonHumanKind, type StreamingRowSnapshot } from "./rowTokenizer.js";

export const DEFAULT_BUDGET_BYTES = 1024 * 1024;
export const DEFAULT_SKIM_BUDGET_BYTES = 64 * 1024 * 1024;
const DEFAULT_SKIM_AFTER_BYTES = 64 * 1024;
const DEFAULT_MAX_TEXT_BYTES = 8 * 1024;
/** Default read buffer; an unfinished row longer than this is carried in marker.pending. */
const DEFAULT_LINE_BUFFER_BYTES = 1024 * 1024;

/** Kinds a skimmed row can have: its prefix decided it is not a human turn. */
export type SkimmedKind = NonHumanKind;
const SKIMMED_KINDS: readonly string[] = ["tool_result", "meta", "sidechain", "assistant", "other", "invalid"];

/** Progress inside an oversized row that is being streamed (or skimmed) across calls. */
interface PartialRowState {
  /** File offset of the row's first byte. */
  rowStart: number;
  /** Opaque, JSON-serialisable lexer state (a row being tokenized). */
  lexer?: StreamingRowSnapshot;
  /** Set instead of `lexer` while the row is skimmed: the kind its prefix decided. */
  skim?: SkimmedKind;
}

export interface ScanMarker {
  /** Next byte to read. */
  offset: number;
  /** Inode of the file the offset belongs to (set by the scanner). */
  inode?: number;
  /** File size seen by the scan that produced this marker. */
  size?: number;
  /** Set while an oversized row is being streamed. */
  pending?: PartialRowState;
}

export type ClassifiedItem = (ClassifiedRow | { kind: "invalid" }) & {
  /** Byte offset of the line's first byte. */
  offset: number;
  /** Byte offset just after the line's "\n". */
  end: number;
  /** The row was classified by its prefix and the rest skimmed (never a human turn). */
  skimmed?: true;
};

export interface ScanResult {
  status: "found" | "missing" | "indeterminate";
  items: ClassifiedItem[];
  marker: ScanMarker;
  /** Bytes read from the file by this call (at most budgetBytes + skimBudgetBytes + one read buffer). */
  bytesRead: number;
  error?: string;
  /** The scan restarted at offset 0 because the file was replaced or truncated. */
  rotated?: boolean;
  resetReason?: "inode_changed" | "truncated";
  /** Number of items of kind "invalid" in `items`. */
  invalidLines?: number;
  /** Bytes of rows already decided not human that were passed over without tokenizing (part of bytesRead). */
  bytesSkimmed?: number;
  /** Items in `items` that were skimmed. */
  skimmedRows?: number;
}

export interface ScanOptions {
  /** Read at most this many bytes per call (default 1 MiB). */
  budgetBytes?: number;
  /** Keep at most this many UTF-8 bytes of a human turn's text (default 8 KiB, at most 16 MiB). */
  maxTextBytes?: number;
  /**
   * Size of the read buffer (default 1 MiB, capped by budgetBytes). An
   * unfinished row shorter than this is read again by the next call; a longer
   * one is carried in marker.pending.
   */
  lineBufferBytes?: number;
  /**
   * Bytes per call that may be passed over by a plain newline search, inside rows whose
   * first bytes already show they are not a human turn (default 64 MiB; 0 = never skim:
   * every byte is tokenized within budgetBytes). Counted apart from budgetBytes.
   */
  skimBudgetBytes?: number;
  /** A row is skimmed only once at least this many of its bytes were read (default 64 KiB). */
  skimAfterBytes?: number;
}

// A few read buffers are kept between calls, so a monitor tick does not
// allocate a fresh megabyte. Concurrent scans each take their own.
const freeBuffers: Buffer[] = [];
const MAX_FREE_BUFFERS = 4;

let largestBuffer = 0;

function takeBuffer(size: number): Buffer {
  largestBuffer = Math.max(largestBuffer, size);
  const idx = freeBuffers.findIndex((b) => b.length === size);
  if (idx >= 0) return freeBuffers.splice(idx, 1)[0];
  return Buffer.allocUnsafeSlow(size);
}

/**
 * What the scanner holds between and during calls, for tests and diagnostics: the largest
 * read buffer any call took (the bound on what a scan buffers, whatever the row size) and the
 * sizes of the buffers kept for reuse.
 */
export function scannerBuffers(): { largestBufferBytes: number; pooledBufferBytes: number[] } {
  return { largestBufferBytes: largestBuffer, pooledBufferBytes: freeBuffers.map((b) => b.length) };
}

function giveBuffer(buf: Buffer): void {
  freeBuffers.push(buf);
  if (freeBuffers.length > MAX_FREE_BUFFERS) freeBuffers.shift();
}

function errorText(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

function errorCode(err: unknown): string | undefined {
  return typeof err === "object" && err !== null && "code" in err
    ? String((err as { code: unknown }).code)
    : undefined;
}

function positiveInt(v: number | undefined, dflt: number): number {
  return typeof v === "number" && Number.isFinite(v) && v >= 1 ? Math.floor(v) : dflt;
}

async function openFailure(path: string, err: unknown, from: ScanMarker): Promise<ScanResult> {
  const base = { items: [], marker: from, bytesRead: 0 };
  if (errorCode(err) === "ENOENT") {
    const dir = dirname(path);
    try {
      const st = await stat(dir);
      if (st.isDirectory()) return { ...base, status: "missing" };
      return { ...base, status: "indeterminate", error: `${dir} is not a directory` };
    } catch (dirErr) {
      // The lookup itself answered "no such entry": the directory is gone too.
      if (errorCode(dirErr) === "ENOENT") return { ...base, status: "missing" };
      return { ...base, status: "indeterminate", error: errorText(dirErr) };
    }
  }
  return { ...base, status: "indeterminate", error: errorText(err) };
}

function validMarkerOffset(from: ScanMarker): number {
  const o = from?.offset;
  return typeof o === "number" && Number.isSafeInteger(o) && o >= 0 ? o : 0;
}

/**
 * Scan `path` forward from `from`; see the file comment for the rules.
 * Start a new transcript with `{ offset: 0 }`.
 */
export async function scanTranscript(
  path: string,
  from: ScanMarker,
  opts: ScanOptions = {},
): Promise<ScanResult> {
  const budget = positiveInt(opts.budgetBytes, DEFAULT_BUDGET_BYTES);
  const sb = opts.skimBudgetBytes;
  const skimBudget = typeof sb === "number" && Number.isFinite(sb) && sb >= 0 ? Math.floor(sb) : DEFAULT_SKIM_BUDGET_BYTES;
  const skimAfter = positiveInt(opts.skimAfterBytes, DEFAULT_SKIM_AFTER_BYTES);
  const mt = opts.maxTextBytes;
  const maxText = typeof mt === "number" && mt >= 0 ? Math.min(Math.floor(mt), MAX_STREAM_TEXT_BYTES) : DEFAULT_MAX_TEXT_BYTES;

  let fh: FileHandle;
  try {
    fh = await open(path, "r");
  } catch (err) {
    return openFailure(path, err, from);
  }
  let buf: Buffer | undefined;
  try {
    const st = await fh.stat();
    if (!st.isFile()) {
      return { status: "indeterminate", items: [], marker: from, bytesRead: 0, error: `${path} is not a regular file` };
    }
    let offset = validMarkerOffset(from);
    let pending = offset > 0 ? from.pending : undefined;
    let resetReason: ScanResult["resetReason"];
    if (from.inode !== undefined && from.inode !== st.ino) resetReason = "inode_changed";
    else if (st.size < offset) resetReason = "truncated";
    if (resetReason) {
      offset = 0;
      pending = undefined;
    }

    const bufSize = Math.min(budget, positiveInt(opts.lineBufferBytes, DEFAULT_LINE_BUFFER_BYTES));

    // Resume a row kept in marker.pending; a damaged snapshot restarts that row at its first byte.
    let lexer: StreamingRowClassifier | null = null;
    let rowStart = offset; // file offset of the row being read
    let resumed = false;
    let resumedSkim: SkimmedKind | null = null;
    if (pending) {
      const rs = pending.rowStart;
      if (typeof rs === "number" && Number.isSafeInteger(rs) && rs >= 0 && rs < offset) {
        if (pending.skim !== undefined && SKIMMED_KINDS.includes(pending.skim) && skimBudget > 0) {
          resumedSkim = pending.skim;
          rowStart = rs;
        } else {
          // (A skim that may not go on with skimming off reads its row again from its first byte.)
          try {
            lexer = StreamingRowClassifier.restore(pending.lexer!);
            rowStart = rs;
            resumed = true;
          } catch {
            offset = rs;
            rowStart = rs;
          }
        }
      }
    }
    lexer ??= new StreamingRowClassifier(maxText);

    buf = takeBuffer(bufSize);
    const items: ClassifiedItem[] = [];
    let invalid = 0;
    let filePos = offset; // next byte to read
    let bytesRead = 0;
    let tokenized = 0; // bytes given to the lexer (the budget)
    let skimmed = 0; // bytes passed over by the byte scan (the skim budget)
    let skimmedRows = 0;
    // The kind of the row being skimmed: its prefix decided it is not a human turn.
    let skimming: SkimmedKind | null = resumedSkim;

    const push = (row: ClassifiedRow | { kind: "invalid" }, end: number, wasSkimmed: boolean) => {
      if (row.kind === "invalid") invalid++;
      const item: ClassifiedItem = { ...row, offset: rowStart, end };
      if (wasSkimmed) {
        item.skimmed = true;
        skimmedRows++;
      }
      items.push(item);
      rowStart = end;
    };

    for (;;) {
      const allowed = skimming ? skimBudget - skimmed : budget - tokenized;
      if (allowed <= 0) break;
      const { bytesRead: n } = await fh.read(buf, 0, Math.min(bufSize, allowed), filePos);
      if (n === 0) break;
      const base = filePos; // file offset of buf[0]
      bytesRead += n;
      filePos += n;
      const view = n === buf.length ? buf : buf.subarray(0, n);
      let i = 0;
      let limit = n;
      if (skimming) {
        // The row's prefix already decided it: find its end without tokenizing it.
        const nl = view.indexOf(0x0a);
        if (nl < 0) {
          skimmed += n;
          continue;
        }
        skimmed += nl + 1;
        push({ kind: skimming }, base + nl + 1, true);
        skimming = null;
        if (resumed && lexer.maxTextBytes !== maxText) lexer = new StreamingRowClassifier(maxText);
        else lexer.reset();
        resumed = false;
        i = nl + 1;
        // What this read holds past that row is tokenized as far as the budget allows; the
        // rest is read again later.
        limit = Math.min(n, i + Math.max(0, budget - tokenized));
        filePos = base + limit;
      }
      tokenized += limit - i;
      for (let nl = view.indexOf(0x0a, i); nl >= 0 && nl < limit; nl = view.indexOf(0x0a, i)) {
        lexer.feed(view, i, nl);
        const row = lexer.classify();
        push(row ?? { kind: "invalid" }, base + nl + 1, false);
        // A row resumed from a snapshot used the snapshot's text limit; later rows use this call's.
        if (resumed && lexer.maxTextBytes !== maxText) lexer = new StreamingRowClassifier(maxText);
        else lexer.reset();
        resumed = false;
        i = nl + 1;
      }
      if (i < limit) {
        // The start of a row that goes on past this read. Once skimAfter of its bytes are in,
        // a prefix that shows it cannot be a human turn lets the rest be skimmed from there.
        let from = i;
        const before = base + i - rowStart; // bytes of this row fed by earlier reads
        if (skimBudget > 0 && before < skimAfter && limit - i > skimAfter - before) {
          from = i + (skimAfter - before);
          lexer.feed(view, i, from);
          const verdict = lexer.prefixVerdict();
          if (verdict) {
            skimming = verdict.kind;
            tokenized -= limit - from;
            skimmed += limit - from;
            from = limit;
          }
        }
        if (from < limit) {
          lexer.feed(view, from, limit);
          if (skimBudget > 0 && filePos - rowStart >= skimAfter) {
            const verdict = lexer.prefixVerdict();
            if (verdict) skimming = verdict.kind;
          }
        }
      }
    }

    // The row at rowStart has no "\n" yet. A short one is simply read again
    // next time (the marker stays at its first byte); one that already filled
    // the read buffer is carried in marker.pending so it cannot block the cursor.
    const marker: ScanMarker = { offset: rowStart, inode: st.ino, size: Math.max(st.size, filePos) };
    if (skimming) {
      marker.offset = filePos;
      marker.pending = { rowStart, skim: skimming };
    } else if (filePos > rowStart && (resumed || filePos - rowStart >= bufSize)) {
      marker.offset = filePos;
      marker.pending = { rowStart, lexer: lexer.snapshot() };
    }
    const result: ScanResult = { status: "found", items, marker, bytesRead, invalidLines: invalid, bytesSkimmed: skimmed, skimmedRows };
    if (resetReason) {
      result.rotated = true;
      result.resetReason = resetReason;
    }
    return result;
  } catch (err) {
    return { status: "indeterminate", items: [], marker: from, bytesRead: 0, error: errorText(err) };
  } finally {
    if (buf) giveBuffer(buf);
    await fh.close().catch(() => undefined);
  }
}
