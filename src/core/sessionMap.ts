/**
 * Values by session, kept by agent, then session key: two levels, so no key string is built and
 * hashed per lookup (on an append's path that was a few per cent of its instructions,
 * docs/decisions/014-core-work-per-event.md). With a `capacity`, the map starts again empty once it would
 * hold more sessions (what is in use comes back with its next read).
 */
import type { SessionId } from "./keys.js";

export class SessionMap<V> {
  private readonly byAgent = new Map<string, Map<string, V>>();
  private size = 0;

  constructor(private readonly capacity = Number.POSITIVE_INFINITY) {}

  get(session: SessionId): V | undefined {
    return this.byAgent.get(session.agentId)?.get(session.sessionKey);
  }

  has(session: SessionId): boolean {
    return this.byAgent.get(session.agentId)?.has(session.sessionKey) ?? false;
  }

  set(session: SessionId, value: V): void {
    let sessions = this.byAgent.get(session.agentId);
    if (sessions?.has(session.sessionKey)) {
      sessions.set(session.sessionKey, value);
      return;
    }
    if (this.size >= this.capacity) {
      this.clear();
      sessions = undefined;
    }
    if (!sessions) this.byAgent.set(session.agentId, (sessions = new Map()));
    sessions.set(session.sessionKey, value);
    this.size++;
  }

  delete(session: SessionId): void {
    if (this.byAgent.get(session.agentId)?.delete(session.sessionKey)) this.size--;
  }

  clear(): void {
    this.byAgent.clear();
    this.size = 0;
  }

  *values(): IterableIterator<V> {
    for (const sessions of this.byAgent.values()) yield* sessions.values();
  }
}
