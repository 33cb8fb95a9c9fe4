/** Runs in every test file: drops the file's PostgreSQL database once the file is done. */
import { afterAll } from "vitest";
import { dropFileDatabase } from "./backends.js";

afterAll(async () => {
  await dropFileDatabase();
});
