/**
 * What this build is: the package version, and the commit the bundle was built from when the
 * build knew it (scripts/build.mjs writes it in; empty when running from source or when the
 * build had no git checkout).
 */
import packageJson from "../../package.json" with { type: "json" };

export const BUILD_INFO = {
  version: packageJson.version,
  commit: process.env.SESSIONSTATE_BUILD_COMMIT ?? "",
  node: process.version,
} as const;
