/**
 * Which session an MCP connection acts as. The operator names it with --session-key, or the
 * harness names it at initialize, in its client capabilities:
 *
 *   "capabilities": { "experimental": { "sessionstate": { "sessionKey": "agent:main:main" } } }
 *
 * When both name one they must agree: a mismatch fails the initialize request (the flag is
 * what the operator allowed; a harness cannot widen it). The check sits between the transport
 * and the MCP server (InitializeGate), so no request reaches a tool before the session is known.
 */
import type { Transport, TransportSendOptions } from "@modelcontextprotocol/sdk/shared/transport.js";
import { ErrorCode, isInitializeRequest, type JSONRPCMessage, type MessageExtraInfo } from "@modelcontextprotocol/sdk/types.js";
import { DomainError } from "../core/errors.js";
import { agentIdOfKey, checkAgentId, checkSessionKey } from "../core/keys.js";

/** The key of the experimental client capability that names the session. */
export const SESSION_CAPABILITY = "sessionstate";

export interface SessionFlags {
  /** --session-key */
  sessionKey?: string;
  /** --agent: the agent of a key that names none (the bare "global"). */
  agentId?: string;
}

export type Binding = { ok: true; sessionKey: string; agentId: string } | { ok: false; error: string };

/** What the harness named in its initialize capabilities (strings only; anything else is a mistake). */
function named(capabilities: unknown): { sessionKey?: unknown; agentId?: unknown } | undefined {
  const experimental = (capabilities as { experimental?: Record<string, unknown> } | undefined)?.experimental;
  const entry = experimental?.[SESSION_CAPABILITY];
  return entry !== null && typeof entry === "object" ? (entry as { sessionKey?: unknown; agentId?: unknown }) : undefined;
}

const where = `capabilities.experimental.${SESSION_CAPABILITY}`;

/** The session a connection acts as, from the flags and the harness's initialize capabilities. */
export function bindSession(flags: SessionFlags, capabilities: unknown): Binding {
  const fromHarness = named(capabilities);
  if (fromHarness?.sessionKey !== undefined && typeof fromHarness.sessionKey !== "string") return { ok: false, error: `${where}.sessionKey: expected a string` };
  if (fromHarness?.agentId !== undefined && typeof fromHarness.agentId !== "string") return { ok: false, error: `${where}.agentId: expected a string` };
  const harnessKey = fromHarness?.sessionKey as string | undefined;
  const harnessAgent = fromHarness?.agentId as string | undefined;
  if (flags.sessionKey !== undefined && harnessKey !== undefined && harnessKey !== flags.sessionKey) {
    return { ok: false, error: `the harness named session ${JSON.stringify(harnessKey)} at initialize, but this server acts as ${JSON.stringify(flags.sessionKey)} (--session-key)` };
  }
  if (flags.agentId !== undefined && harnessAgent !== undefined && harnessAgent !== flags.agentId) {
    return { ok: false, error: `the harness named agent ${JSON.stringify(harnessAgent)} at initialize, but this server acts for ${JSON.stringify(flags.agentId)} (--agent)` };
  }
  const sessionKey = flags.sessionKey ?? harnessKey;
  if (sessionKey === undefined) return { ok: false, error: `no session to act as: start the server with --session-key, or name it at initialize in ${where}.sessionKey` };
  try {
    checkSessionKey("sessionKey", sessionKey);
    const ofKey = agentIdOfKey(sessionKey);
    const given = flags.agentId ?? harnessAgent;
    if (given !== undefined) checkAgentId("agentId", given);
    if (ofKey !== undefined && given !== undefined && given !== ofKey) return { ok: false, error: `agentId ${JSON.stringify(given)} does not match the agent of ${JSON.stringify(sessionKey)}` };
    const agentId = ofKey ?? given;
    if (agentId === undefined) return { ok: false, error: `session ${JSON.stringify(sessionKey)} names no agent: give its agent (--agent, or ${where}.agentId)` };
    return { ok: true, sessionKey, agentId };
  } catch (err) {
    if (err instanceof DomainError) return { ok: false, error: err.message };
    throw err;
  }
}

/**
 * A transport that passes everything through, except an initialize request whose session
 * does not bind: that one is answered with an error (InvalidParams) and never reaches the
 * server, and `onRefused` runs after the answer is sent.
 */
export class InitializeGate implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: <T extends JSONRPCMessage>(message: T, extra?: MessageExtraInfo) => void;

  constructor(
    private readonly inner: Transport,
    private readonly bind: (capabilities: unknown) => Binding,
    private readonly onBound: (binding: Extract<Binding, { ok: true }>) => void,
    private readonly onRefused: (error: string) => void,
  ) {}

  get sessionId(): string | undefined {
    return this.inner.sessionId;
  }

  setProtocolVersion = (version: string): void => {
    this.inner.setProtocolVersion?.(version);
  };

  start(): Promise<void> {
    this.inner.onclose = () => this.onclose?.();
    this.inner.onerror = (error) => this.onerror?.(error);
    this.inner.onmessage = (message, extra) => {
      if (isInitializeRequest(message)) {
        const binding = this.bind(message.params.capabilities);
        if (!binding.ok) {
          const id = (message as { id?: string | number }).id ?? null;
          void this.inner
            .send({ jsonrpc: "2.0", id: id as string | number, error: { code: ErrorCode.InvalidParams, message: binding.error } })
            .finally(() => this.onRefused(binding.error));
          return;
        }
        this.onBound(binding);
      }
      this.onmessage?.(message, extra);
    };
    return this.inner.start();
  }

  send(message: JSONRPCMessage, options?: TransportSendOptions): Promise<void> {
    return this.inner.send(message, options);
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
