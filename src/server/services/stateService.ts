/** StateService handlers: map the request, call the core, map the result. */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import type { SessionState } from "../../core/sessionState.js";
import type { SessionTools } from "../../core/sessionTools.js";
import {
  AppendEventStreamResponseSchema,
  AppendEventsResponseSchema,
  AppendResultSchema,
  GetStatusResponseSchema,
  StateChangesSchema,
  StateService,
  type AppendEventStreamRequest,
  type AppendEventStreamResponse,
  type AppendEventsResponse,
  type AppendResult,
  type EventInput,
  type StateChanges,
} from "../../../gen/sessionstate/v1/state_pb.js";
import { decide } from "../../core/access.js";
import { principalKey } from "../auth/interceptor.js";
import { POLICY } from "../auth/policy.js";
import { toConnectError } from "../errors.js";
import type { Logger } from "../logger.js";
import type { StorageWatch } from "../storageHealth.js";
import type { StreamAdmission } from "../streamAdmission.js";
import type { AppendOutcome, ChangesPage } from "../../core/model.js";
import { appendResultsField } from "../appendResultWire.js";
import { EventWireCache, isBinaryCall } from "../eventWire.js";
import { actorTypes, eventKinds, eventMessage, int64, msOf, routeMessage, routeOf, runOutcomes, sessionMessage } from "../convert.js";
import { requesterOf } from "../convertTranscript.js";

export function stateService(
  core: SessionState,
  tools: SessionTools,
  stream: AppendStreamSettings = { maxBatchesInFlight: DEFAULT_MAX_STREAM_BATCHES_IN_FLIGHT, logger: silentLogger },
  wire: EventWireCache = new EventWireCache(),
): ServiceImpl<typeof StateService> {
  return {
    async appendEvents(req, ctx) {
      const outcomes = await appendBatch(core, req.events);
      return withResults(create(AppendEventsResponseSchema), outcomes, isBinaryCall(ctx.requestHeader, ctx.url), RESULTS_OF_CALL);
    },

    appendEventStream: (requests, ctx) => appendEventStream(core, requests, ctx, stream),

    async getStatus(req, ctx) {
      // A Connect GET never writes (the method is side-effect free for caches and browsers);
      // setting the model is a write, so it needs a POST.
      if (req.model !== undefined && ctx.requestMethod === "GET") {
        throw new ConnectError("model sets the session's model, and a GET request never writes: send GetStatus with model as a POST (or use PatchSession)", Code.InvalidArgument);
      }
      // session_status under the requester's visibility (none given = operator view).
      const status = await tools.getStatus(requesterOf(req.requester), {
        session: req.session && { sessionKey: req.session.sessionKey, agentId: req.session.agentId },
        changesSince: req.changesSince === undefined ? undefined : int64("changes_since", req.changesSince),
        limit: req.limit,
        model: req.model,
        activeRoute: routeOf(req.activeRoute),
      });
      const binary = status.changes !== undefined && isBinaryCall(ctx.requestHeader, ctx.url);
      const response = create(GetStatusResponseSchema, {
        stateVersion: BigInt(status.stateVersion),
        session: status.session ? sessionMessage(status.session) : undefined,
        stateChanges: status.changes && !binary ? changesMessage(status.changes) : undefined,
        route: status.route && {
          origin: routeMessage(status.route.origin),
          active: routeMessage(status.route.active),
          deliveryContext: routeMessage(status.route.deliveryContext),
        },
        usage: status.usage && {
          contextTokens: BigInt(status.usage.contextTokens),
          totalTokens: BigInt(status.usage.totalTokens),
          inputTokens: BigInt(status.usage.inputTokens),
          outputTokens: BigInt(status.usage.outputTokens),
          cacheReadTokens: BigInt(status.usage.cacheReadTokens),
          cacheWriteTokens: BigInt(status.usage.cacheWriteTokens),
          usageMessageSequence: BigInt(status.usage.usageMessageSequence),
          backfilled: status.usage.backfilled,
        },
        taskContext: status.taskContext,
        modelChanged: status.modelChanged,
      });
      // Over a binary protocol the delta goes out as the bytes its events were encoded to once (eventWire.ts).
      if (binary) response.$unknown = [wire.stateChangesField(status.changes!)];
      return response;
    },
  };
}

/** The delta as a typed message (JSON answers). */
function changesMessage(changes: ChangesPage): StateChanges {
  return create(StateChangesSchema, {
    events: changes.events.map(eventMessage),
    truncated: changes.truncated,
    earliestAvailableSequence: BigInt(changes.earliestAvailableSequence),
    historyGap: changes.historyGap,
  });
}

/** One AppendEvents batch: the events mapped for the core, its outcomes. */
function appendBatch(core: SessionState, events: EventInput[]): Promise<AppendOutcome[]> {
  return core.appendEvents(
    events.map((e, i) => ({
      sessionKey: e.session?.sessionKey ?? "",
      agentId: e.session?.agentId ?? "",
      kind: eventKinds.required(`events[${i}].kind`, e.kind),
      actorType: actorTypes.required(`events[${i}].actor_type`, e.actorType),
      actorId: e.actorId,
      runId: e.runId,
      occurredAt: msOf(e.occurredAt),
      summary: e.summary,
      payload: {
        outcome: runOutcomes.optional(`events[${i}].payload.outcome`, e.payload?.outcome ?? 0),
        channel: e.payload?.channel ?? "",
        turns: e.payload?.turns ?? 0,
      },
      dedupeKey: e.dedupeKey,
      watcherSessionKeys: e.watcherSessionKeys,
    })),
  );
}

const RESULTS_OF_CALL = AppendEventsResponseSchema.field.results.number;
const RESULTS_OF_STREAM = AppendEventStreamResponseSchema.field.results.number;

/**
 * The outcomes as the response's `results` (field `field`): over a binary protocol written
 * straight to their bytes (appendResultWire.ts), else as messages.
 */
function withResults<R extends AppendEventsResponse | AppendEventStreamResponse>(response: R, outcomes: readonly AppendOutcome[], binary: boolean, field: number): R {
  const raw = binary ? appendResultsField(outcomes, field) : undefined;
  if (raw !== undefined) response.$unknown = raw;
  else response.results = outcomes.map(resultMessage);
  return response;
}

function resultMessage(o: AppendOutcome): AppendResult {
  return create(AppendResultSchema, {
    sequence: BigInt(o.sequence),
    stateVersion: BigInt(o.stateVersion),
    duplicate: o.duplicate,
    recorded: o.recorded,
    reason: o.reason,
  });
}

export const DEFAULT_MAX_STREAM_BATCHES_IN_FLIGHT = 64;

/** Settings of AppendEventStream. */
export interface AppendStreamSettings {
  /** Batches of one stream read and not yet answered; beyond it the stream is not read (backpressure). */
  maxBatchesInFlight: number;
  /** The server-wide bound on events of batches being handled, shared by every stream; none when absent. */
  admission?: StreamAdmission;
  logger: Logger;
  storage?: StorageWatch;
}

const silentLogger: Logger = { log() {}, info() {}, warn() {}, error() {} };

const APPEND_EVENTS = `${StateService.typeName}/${StateService.method.appendEvents.name}`;
const APPEND_EVENT_STREAM = `${StateService.typeName}/${StateService.method.appendEventStream.name}`;

/**
 * AppendEventStream: every request message is a batch handled as an AppendEvents call with
 * the same events would be — authorized by AppendEvents' rule (per batch, so a batch outside a
 * gateway token's agents is refused alone), validated and appended by the core. Batches run
 * concurrently (they share commits); each is answered when it is done, with its results or
 * with the error AppendEvents would have failed with. At most `maxBatchesInFlight` batches are
 * read and not yet answered — answered meaning handed to the response's writer, which takes
 * the next answer only once HTTP/2 flow control lets the last one go: a client that stops
 * reading its answers stops having its batches read, and holds no more than that many.
 */
async function* appendEventStream(
  core: SessionState,
  requests: AsyncIterable<AppendEventStreamRequest>,
  ctx: HandlerContext,
  settings: AppendStreamSettings,
): AsyncGenerator<AppendEventStreamResponse> {
  const principal = ctx.values.get(principalKey);
  const rule = POLICY.get(APPEND_EVENTS);
  const binary = isBinaryCall(ctx.requestHeader, ctx.url);
  const ready: AppendEventStreamResponse[] = [];
  /** Read and not yet answered. */
  let unanswered = 0;
  /** Being handled (not yet in `ready`). */
  let handling = 0;
  let readDone = false;
  let readError: unknown;
  let wake: (() => void) | undefined;
  const poke = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  let slot: (() => void) | undefined;
  /** Wakes the read loop if it waits for a slot. */
  const freeSlot = () => {
    const s = slot;
    slot = undefined;
    s?.();
  };

  const handle = async (req: AppendEventStreamRequest): Promise<AppendEventStreamResponse> => {
    try {
      if (principal && rule) {
        const denial = decide(principal, {
          procedure: APPEND_EVENT_STREAM,
          access: "act",
          agents: "agents" in rule ? () => rule.agents(req as never) : undefined,
        });
        if (denial !== undefined) throw new ConnectError(denial, Code.PermissionDenied);
      }
      const outcomes = await appendBatch(core, req.events);
      return withResults(create(AppendEventStreamResponseSchema, { batchId: req.batchId }), outcomes, binary, RESULTS_OF_STREAM);
    } catch (err) {
      const error = toConnectError(err, settings.logger, APPEND_EVENT_STREAM, settings.storage);
      return create(AppendEventStreamResponseSchema, { batchId: req.batchId, error: { code: error.code, message: error.rawMessage } });
    }
  };

  /** The answers' side has ended (the client went away or the stream failed): read no more. */
  let ended = false;
  const read = async () => {
    try {
      for await (const req of requests) {
        while (unanswered >= settings.maxBatchesInFlight && !ended) await new Promise<void>((r) => (slot = r));
        if (ended) break;
        const cost = settings.admission?.costOf(req.events.length) ?? 0;
        if (settings.admission) await settings.admission.acquire(cost);
        // A batch whose stream ended while it waited for room is not appended: nobody hears of it.
        if (ended) {
          settings.admission?.release(cost);
          break;
        }
        unanswered++;
        handling++;
        void handle(req).then((res) => {
          settings.admission?.release(cost);
          handling--;
          ready.push(res);
          poke();
        });
      }
    } catch (err) {
      readError = err;
    } finally {
      readDone = true;
      poke();
    }
  };
  const onAbort = () => poke();
  ctx.signal.addEventListener("abort", onAbort);
  void read();
  try {
    for (;;) {
      while (ready.length > 0) {
        yield ready.shift()!;
        // Resumed: the writer has taken that answer, so one more batch may be read.
        unanswered--;
        freeSlot();
      }
      if (ctx.signal.aborted) throw ConnectError.from(ctx.signal.reason ?? new ConnectError("the stream was ended", Code.Canceled));
      if (readError !== undefined && handling === 0) throw readError;
      if (readDone && handling === 0) return;
      await new Promise<void>((r) => (wake = r));
    }
  } finally {
    ctx.signal.removeEventListener("abort", onAbort);
    ended = true;
    freeSlot();
  }
}
