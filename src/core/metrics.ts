/**
 * What the core reports about its own work, for the operations surface (the server turns
 * these calls into Prometheus metrics). The core depends only on this interface; the
 * default does nothing.
 */
export interface CoreMetrics {
  /** Notices that left through the publish point (after commit). */
  noticesQueued(count: number): void;
}

export const NO_METRICS: CoreMetrics = {
  noticesQueued: () => {},
};
