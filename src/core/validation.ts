/** Field checks shared by the core's entry points. Each error names the request field. */
import { invalidArgument } from "./errors.js";

const CONTROL = /[\u0000-\u001f\u007f]/;
const LINE_BREAK = /[\r\n\u2028\u2029]/;

export function checkText(field: string, value: string, maxBytes: number): string {
  if (Buffer.byteLength(value, "utf8") > maxBytes) throw invalidArgument(field, `must be at most ${maxBytes} bytes`);
  return value;
}

/** A short identifier-like string: bounded, no control characters. Empty allowed. */
export function checkToken(field: string, value: string, maxBytes: number): string {
  checkText(field, value, maxBytes);
  if (CONTROL.test(value)) throw invalidArgument(field, "must not contain control characters");
  return value;
}

export const MAX_SUMMARY_CHARS = 280;

/** The one-line summary of an event. */
export function checkSummary(field: string, summary: string): string {
  if (summary.trim() === "") throw invalidArgument(field, "must not be empty");
  if ([...summary].length > MAX_SUMMARY_CHARS) {
    throw invalidArgument(field, `must be at most ${MAX_SUMMARY_CHARS} characters`);
  }
  if (LINE_BREAK.test(summary)) throw invalidArgument(field, "must be one line (no line breaks)");
  if (CONTROL.test(summary)) throw invalidArgument(field, "must not contain control characters");
  return summary;
}

export function checkRange(field: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw invalidArgument(field, `must be an integer from ${min} to ${max} (got ${value})`);
  }
  return value;
}

export function checkCount(field: string, length: number, min: number, max: number): void {
  if (length < min || length > max) {
    throw invalidArgument(field, `must hold ${min === max ? min : `${min} to ${max}`} entries (got ${length})`);
  }
}
