/**
 * The MCP server holds the service's token (and its own HTTP token); the model and the logs
 * never see them. Every text that leaves — a tool result, a tool error, a log line — passes
 * through a Scrubber that masks any occurrence of a held secret, whatever produced the text.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import type { ClientLogger } from "../client/logger.js";

export const MASK = "[redacted]";

export class Scrubber {
  private readonly secrets: string[];

  constructor(secrets: readonly (string | undefined)[]) {
    // Longest first, so a secret that contains another is masked whole.
    this.secrets = [...new Set(secrets.filter((s): s is string => s !== undefined && s !== ""))].sort((a, b) => b.length - a.length);
  }

  text(value: string): string {
    let out = value;
    for (const secret of this.secrets) if (out.includes(secret)) out = out.split(secret).join(MASK);
    return out;
  }

  /** A logger that writes through `logger` with every field scrubbed. */
  logger(logger: ClientLogger): ClientLogger {
    const clean = (fields?: Record<string, unknown>) => (fields === undefined ? undefined : (JSON.parse(this.text(JSON.stringify(fields))) as Record<string, unknown>));
    return {
      info: (msg, fields) => logger.info(this.text(msg), clean(fields)),
      warn: (msg, fields) => logger.warn(this.text(msg), clean(fields)),
      error: (msg, fields) => logger.error(this.text(msg), clean(fields)),
    };
  }
}

/** Compares a presented secret with the expected one in time that does not depend on where they differ. */
export function secretMatches(presented: string, expected: string): boolean {
  // Equal-length digests: timingSafeEqual needs equal lengths, and the length of the secret stays hidden.
  const a = createHash("sha256").update(presented, "utf8").digest();
  const b = createHash("sha256").update(expected, "utf8").digest();
  return timingSafeEqual(a, b);
}
