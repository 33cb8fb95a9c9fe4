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
 * - Budget: at most `budgetBytes` (default 1 MiB) are read per call. A line cut
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
import { MAX_STREAM_TEXT_BYTES, StreamingRowClassifier, type StreamingRowSnapshot } from "./rowTokenizer.js";

export const DEFAULT_BUDGET_BYTES = 1024 * 1024;
const DEFAULT_MAX_TEXT_BYTES = 8 * 1024;
/** Default read buffer; an unfinished row longer than this is carried in marker.pending. */
const DEFAULT_LINE_BUFFER_BYTES = 1024 * 1024;

/** Progress inside an oversized row that is being streamed across calls. */
interface PartialRowState {
  /** File offset of the row's first byte. */
  rowStart: number;
  /** Opaque, JSON-serialisable lexer state. */
  lexer: StreamingRowSnapshot;
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
};

export interface ScanResult {
  status: "found" | "missing" | "indeterminate";
  items: ClassifiedItem[];
  marker: ScanMarker;
  /** Bytes read from the file by this call (never more than budgetBytes). */
  bytesRead: number;
  error?: string;
  /** The scan restarted at offset 0 because the file was replaced or truncated. */
  rotated?: boolean;
  resetReason?: "inode_changed" | "truncated";
  /** Number of items of kind "invalid" in `items`. */
  invalidLines?: number;
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
}

// A few read buffers are kept between calls, so a monitor tick does not
// allocate a fresh megabyte. Concurrent scans each take their own.
const freeBuffers: Buffer[] = [];
const MAX_FREE_BUFFERS = 4;

function takeBuffer(size: number): Buffer {
  const idx = freeBuffers.findIndex((b) => b.length === size);
  if (idx >= 0) return freeBuffers.splice(idx, 1)[0];
  return Buffer.allocUnsafeSlow(size);
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
    if (pending) {
      const rs = pending.rowStart;
      if (typeof rs === "number" && Number.isSafeInteger(rs) && rs >= 0 && rs < offset) {
        try {
          lexer = StreamingRowClassifier.restore(pending.lexer);
          rowStart = rs;
          resumed = true;
        } catch {
          offset = rs;
          rowStart = rs;
        }
      }
    }
    lexer ??= new StreamingRowClassifier(maxText);

    buf = takeBuffer(bufSize);
    const items: ClassifiedItem[] = [];
    let invalid = 0;
    let filePos = offset; // next byte to read
    let bytesRead = 0;

    while (bytesRead < budget) {
      const { bytesRead: n } = await fh.read(buf, 0, Math.min(bufSize, budget - bytesRead), filePos);
      if (n === 0) break;
      const base = filePos; // file offset of buf[0]
      bytesRead += n;
      filePos += n;
      const view = n === buf.length ? buf : buf.subarray(0, n);
      let i = 0;
      for (let nl = view.indexOf(0x0a, i); nl >= 0; nl = view.indexOf(0x0a, i)) {
        lexer.feed(view, i, nl);
        const row = lexer.classify();
        const end = base + nl + 1;
        if (row === null) {
          invalid++;
          items.push({ kind: "invalid", offset: rowStart, end });
        } else {
          items.push({ ...row, offset: rowStart, end });
        }
        // A row resumed from a snapshot used the snapshot's text limit; later rows use this call's.
        if (resumed && lexer.maxTextBytes !== maxText) lexer = new StreamingRowClassifier(maxText);
        else lexer.reset();
        rowStart = end;
        resumed = false;
        i = nl + 1;
      }
      if (i < n) lexer.feed(view, i, n);
    }

    // The row at rowStart has no "\n" yet. A short one is simply read again
    // next time (the marker stays at its first byte); one that already filled
    // the read buffer is carried in marker.pending so it cannot block the cursor.
    const marker: ScanMarker = { offset: rowStart, inode: st.ino, size: Math.max(st.size, filePos) };
    if (filePos > rowStart && (resumed || filePos - rowStart >= bufSize)) {
      marker.offset = filePos;
      marker.pending = { rowStart, lexer: lexer.snapshot() };
    }
    const result: ScanResult = { status: "found", items, marker, bytesRead, invalidLines: invalid };
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
