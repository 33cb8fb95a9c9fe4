/** Small formatting helpers shared by the views. */
import { timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { ConnectError } from "@connectrpc/connect";

/** An enum value's name without its prefix, lower case: SessionKind.MAIN → "main". */
export function enumName(names: Record<number, string>, value: number): string {
  const name = names[value];
  return name === undefined ? String(value) : name.toLowerCase();
}

export function ms(ts: Timestamp | undefined): number | undefined {
  return ts === undefined ? undefined : timestampMs(ts);
}

/** "12:03:04" today, else "2026-12-01 12:03". */
export function when(ts: Timestamp | number | undefined): string {
  const t = typeof ts === "number" ? ts : ms(ts);
  if (t === undefined || t === 0) return "—";
  const d = new Date(t);
  const iso = d.toISOString();
  return d.toDateString() === new Date().toDateString() ? iso.slice(11, 19) : `${iso.slice(0, 10)} ${iso.slice(11, 16)}`;
}

/** "3 s", "4 min", "2 h", "5 d" ago. */
export function ago(ts: Timestamp | number | undefined): string {
  const t = typeof ts === "number" ? ts : ms(ts);
  if (t === undefined || t === 0) return "—";
  const s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function errorText(err: unknown): string {
  const e = ConnectError.from(err);
  return `${e.code === undefined ? "" : `${codeName(e.code)}: `}${e.rawMessage}`;
}

const CODES = ["ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found", "already_exists", "permission_denied", "resource_exhausted", "failed_precondition", "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss", "unauthenticated"];

export function codeName(code: number): string {
  return CODES[code] ?? String(code);
}

/** The link to one session's page. */
export function sessionHref(agentId: string, sessionKey: string): string {
  return `#/session?${new URLSearchParams({ agent: agentId, key: sessionKey }).toString()}`;
}
