/**
 * A child process for test/faults/walWriteFaults.test.ts: runs a plan of SQLite write
 * transactions on one file, under the WAL fault shim (walFault.c), then kills itself with
 * SIGKILL so that the parent reopens what a crash left. Plain JavaScript: it runs under
 * `node` with LD_PRELOAD set, without a loader.
 *
 *   node walWorkload.mjs <plan.json>
 *
 * The plan: { db, library (the WAL library without its suffix, or null for SQLite's own
 * writes), control (the shim's command file), results (a file to append outcomes to),
 * cacheSize, transactions: [{ id, rows, size, fault, update, readBack, rollback, onError,
 * checkpoint }] }.
 *
 * Each transaction inserts `rows` rows of `size` random bytes tagged with its id; `update`
 * rewrites half of them (pages dirtied again after they were spilled: SQLite then overwrites
 * their frames in place), `readBack` reads them all back (spilled pages come from the WAL);
 * `rollback` ends it with ROLLBACK. A `fault` ({ action, target, skip, when }) is armed just
 * before it starts, or with `when: "update"` just before the update. On an error, `onError` says what the application does next: "rollback", or
 * "commit" (carry on: COMMIT what the failed statement left, as SQLite allows after an
 * I/O error in a statement). `checkpoint` (PASSIVE, RESTART or TRUNCATE) runs after it, so
 * the next one may start the WAL over. One JSON line per transaction goes to `results`, written
 * before the next one starts: { id, outcome: committed | refused | rolledback, rows (the
 * count it can read after committing), step and code of the first error, fired }.
 */
import Database from "better-sqlite3";
import { closeSync, openSync, readFileSync, writeFileSync, writeSync } from "node:fs";

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
if (plan.library) {
  // As the service does: loading the library makes its VFS the process's default.
  const scratch = new Database(":memory:");
  scratch.loadExtension(plan.library);
  scratch.close();
}
const results = openSync(plan.results, "a");
const db = new Database(plan.db);
db.pragma("journal_mode = WAL");
db.pragma("synchronous = normal");
db.pragma(`cache_size = ${plan.cacheSize}`);
db.exec("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, txn INTEGER NOT NULL, v BLOB NOT NULL); CREATE INDEX IF NOT EXISTS t_txn ON t (txn)");
const insert = db.prepare("INSERT INTO t (txn, v) VALUES (?, randomblob(?))");
const update = db.prepare("UPDATE t SET v = randomblob(length(v)) WHERE txn = ? AND id % 2 = 0");
const readBack = db.prepare("SELECT count(*) AS n, sum(length(v)) AS bytes FROM t WHERE txn = ?");
const count = db.prepare("SELECT count(*) FROM t WHERE txn = ?").pluck();

for (const txn of plan.transactions) {
  const arm = () => writeFileSync(plan.control, `${txn.fault.action} ${txn.fault.target} ${txn.fault.skip}\n`);
  writeFileSync(plan.control, "");
  if (txn.fault && txn.fault.when !== "update") arm();
  let step = "begin";
  let error;
  const attempt = (name, fn) => {
    step = name;
    try {
      fn();
      return true;
    } catch (err) {
      error ??= { step: name, code: err.code ?? String(err) };
      return false;
    }
  };
  let ok = attempt("begin", () => db.exec("BEGIN IMMEDIATE"));
  for (let i = 0; ok && i < txn.rows; i++) ok = attempt("insert", () => insert.run(txn.id, txn.size));
  if (ok && txn.update) {
    if (txn.fault?.when === "update") arm();
    ok = attempt("update", () => update.run(txn.id));
  }
  if (ok && txn.readBack) ok = attempt("read", () => readBack.get(txn.id));
  let outcome;
  if (ok && txn.rollback) {
    attempt("rollback", () => db.exec("ROLLBACK"));
    outcome = "rolledback";
  } else if (!ok && txn.onError === "commit" && db.inTransaction) {
    outcome = attempt("commit", () => db.exec("COMMIT")) ? "committed" : "refused";
  } else if (ok) {
    outcome = attempt("commit", () => db.exec("COMMIT")) ? "committed" : "refused";
  } else {
    outcome = "refused";
  }
  if (db.inTransaction) attempt("rollback after the error", () => db.exec("ROLLBACK"));
  let rows = 0;
  if (outcome === "committed") attempt("count", () => (rows = count.get(txn.id)));
  const control = readFileSync(plan.control, "utf8").trim();
  const fired = control.startsWith("fired ") ? control : undefined;
  writeFileSync(plan.control, "");
  // A checkpoint writes no WAL frame (and nothing is armed now): it only decides where the
  // next transaction's frames go, the WAL started over or not.
  if (txn.checkpoint) db.pragma(`wal_checkpoint(${txn.checkpoint})`);
  writeSync(results, JSON.stringify({ id: txn.id, outcome, rows, error, fired, lastStep: step }) + "\n");
}
closeSync(results);
// What a crash leaves: the WAL as it is, no checkpoint, no close.
process.kill(process.pid, "SIGKILL");
