// The standard gRPC health service (grpc.health.v1.Health), so load balancers, orchestrators
// and `grpc_health_probe`-style tools can ask whether this server is serving.
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";

/** The health spec lets List refuse large answers; grpc-go uses the same bound. */
const MAX_LISTED_SERVICES = 100;

/**
 * Serving status per service name. The empty name is the server as a whole and starts as
 * `overall` (SERVING unless told otherwise); any other name is unknown until set.
 */
export class HealthStatus {
  private readonly statuses = new Map<string, ServingStatus>();
  private readonly mailboxes = new Set<Mailbox>();
  private shutDown = false;

  constructor(overall: ServingStatus = ServingStatus.SERVING) {
    this.statuses.set("", overall);
  }

  /** Records a status and tells the service's watchers. Ignored after shutdown(). */
  set(service: string, status: ServingStatus): void {
    // SERVICE_UNKNOWN is what Watch reports for names nobody set; storing it would make an
    // unknown service look known to Check.
    if (status === ServingStatus.SERVICE_UNKNOWN) {
      throw new RangeError(`SERVICE_UNKNOWN is reserved for Watch; not settable for "${service}"`);
    }
    // A server that is going away must not look healthy again because of a late set().
    if (this.shutDown) return;
    this.update(service, status);
  }

  /** The service's status, or undefined when it was never set. */
  get(service: string): ServingStatus | undefined {
    return this.statuses.get(service);
  }

  /** A snapshot of every known service's status. */
  list(): Map<string, ServingStatus> {
    return new Map(this.statuses);
  }

  /** Number of open watch() iterations (open Watch calls). */
  get watching(): number {
    return this.mailboxes.size;
  }

  /**
   * Marks every service NOT_SERVING, ignores later set() calls, and ends every watch after
   * it has delivered NOT_SERVING, so clients learn the reason before the stream closes.
   */
  shutdown(): void {
    if (this.shutDown) return;
    this.shutDown = true;
    for (const service of this.statuses.keys()) this.update(service, ServingStatus.NOT_SERVING);
    for (const mailbox of this.mailboxes) mailbox.close();
  }

  /**
   * The service's current status (SERVICE_UNKNOWN when unset), then each change, until
   * `signal` aborts or shutdown() is called. Equal consecutive statuses are sent once.
   */
  async *watch(service: string, signal: AbortSignal): AsyncGenerator<ServingStatus, void, undefined> {
    const mailbox = new Mailbox(service);
    mailbox.put(this.statuses.get(service) ?? ServingStatus.SERVICE_UNKNOWN);
    const onAbort = () => mailbox.close();
    signal.addEventListener("abort", onAbort);
    if (this.shutDown || signal.aborted) mailbox.close();
    this.mailboxes.add(mailbox);
    try {
      let sent: ServingStatus | undefined;
      for (let status = await mailbox.take(); status !== undefined; status = await mailbox.take()) {
        // Nobody is listening any more; don't push a stale status into a dead stream. A stop
        // aborts every call's signal too, yet the client is still there to learn NOT_SERVING.
        if (signal.aborted && !this.shutDown) return;
        if (status === sent) continue;
        sent = status;
        yield status;
      }
    } finally {
      this.mailboxes.delete(mailbox);
      signal.removeEventListener("abort", onAbort);
    }
  }

  private update(service: string, status: ServingStatus): void {
    this.statuses.set(service, status);
    for (const mailbox of this.mailboxes) {
      if (mailbox.service === service) mailbox.put(status);
    }
  }
}

/**
 * One watch's pending update. It holds only the newest status: a slow client needs to know
 * where things stand now, not every flip in between.
 */
class Mailbox {
  private latest: ServingStatus | undefined;
  private closed = false;
  private wake: (() => void) | undefined;

  constructor(readonly service: string) {}

  put(status: ServingStatus): void {
    this.latest = status;
    this.notify();
  }

  close(): void {
    this.closed = true;
    this.notify();
  }

  /** The next status; undefined once closed and drained. */
  async take(): Promise<ServingStatus | undefined> {
    for (;;) {
      if (this.latest !== undefined) {
        const status = this.latest;
        this.latest = undefined;
        return status;
      }
      if (this.closed) return undefined;
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }
}

/** Registers grpc.health.v1.Health (Check, Watch and List) backed by `health`. */
export function registerHealth(router: ConnectRouter, health: HealthStatus): void {
  router.service(Health, {
    check(request) {
      const status = health.get(request.service);
      // The health spec: an unknown service fails Check with NOT_FOUND.
      if (status === undefined) throw new ConnectError(`unknown service "${request.service}"`, Code.NotFound);
      return { status };
    },
    async *watch(request, context) {
      for await (const status of health.watch(request.service, context.signal)) yield { status };
    },
    list() {
      const statuses = health.list();
      if (statuses.size > MAX_LISTED_SERVICES) {
        throw new ConnectError(`more than ${MAX_LISTED_SERVICES} services`, Code.ResourceExhausted);
      }
      return { statuses: Object.fromEntries([...statuses].map(([name, status]) => [name, { status }])) };
    },
  });
}
