/**
 * What the SQLite rows layer remembers about a session between statements, kept by agent,
 * then session key (two levels: no key string is built and hashed per lookup), with a bound:
 * beyond `capacity` sessions it starts again empty (the sessions in use come back with their
 * next read). Only values the one serving connection itself read or wrote go in
 * (processLock.ts); the storage forgets them all when a transaction rolls back.
 */
import type { SessionId } from "../keys.js";

export class SessionMap<V> {
  private readonly byAgent = new Map<string, Map<string, V>>();
  private size = 0;

  constructor(private readonly capacity: number) {}

  get(session: SessionId): V | undefined {
    return this.byAgent.get(session.agentId)?.get(session.sessionKey);
  }

  has(session: SessionId): boolean {
    return this.byAgent.get(session.agentId)?.has(session.sessionKey) ?? false;
  }

  set(session: SessionId, value: V): void {
    let sessions = this.byAgent.get(session.agentId);
    if (!sessions?.has(session.sessionKey)) {
      if (this.size >= this.capacity) this.clear();
      if (!(sessions = this.byAgent.get(session.agentId))) this.byAgent.set(session.agentId, (sessions = new Map()));
      this.size++;
    }
    sessions!.set(session.sessionKey, value);
  }

  delete(session: SessionId): void {
    if (this.byAgent.get(session.agentId)?.delete(session.sessionKey)) this.size--;
  }

  clear(): void {
    this.byAgent.clear();
    this.size = 0;
  }
}
