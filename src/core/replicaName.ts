/** How the operator's view names a serving process: its host and process id. */
import { hostname } from "node:os";

let name: string | undefined;

/** "<host> pid <pid>", at most 63 bytes (PostgreSQL's limit for an application name). */
export function replicaName(): string {
  return (name ??= `${hostname().slice(0, 40)} pid ${process.pid}`);
}
