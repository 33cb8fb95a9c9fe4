/** The client settings every benchmark load uses, the no-op reference included. */
import type { Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";

/** Connect protocol, binary protobuf, h2c: one HTTP/2 connection per transport. */
export function benchTransport(url: string): Transport {
  return createConnectTransport({ baseUrl: url, httpVersion: "2", useBinaryFormat: true });
}
