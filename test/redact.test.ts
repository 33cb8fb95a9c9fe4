import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  createRedactor,
  defaultRedactor,
  isSecretName,
  maskSecret,
  redactText,
  RedactPatternError,
} from "../src/core/transcript/redact.js";

// Test secrets are assembled at run time so no literal credential appears in the source.
const alnum = "aB3dE5gH7jK9mN1pQ2rS4tU6vW8xY0zAbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
const rand = (len: number, offset = 0): string =>
  Array.from({ length: len }, (_, k) => alnum[(k * 7 + offset) % alnum.length]).join("");

const OPENAI = `sk-${rand(48)}`;
const OPENAI_PROJ = `sk-proj-${rand(40, 3)}`;
const ANTHROPIC = `sk-ant-api03-${rand(60, 5)}`;
const GHP = `ghp_${rand(36, 1)}`;
const GHO = `gho_${rand(36, 2)}`;
const GHU = `ghu_${rand(36, 4)}`;
const GHS = `ghs_${rand(36, 6)}`;
const GHR = `ghr_${rand(36, 8)}`;
const GITHUB_PAT = `github_pat_${rand(22, 9)}_${rand(59, 10)}`;
const SLACK_BOT = `xoxb-${"1234567890"}-${"0987654321"}-${rand(24, 11)}`;
const SLACK_USER = `xoxp-${"1234567890"}-${rand(24, 12)}`;
const GOOGLE = `AIza${rand(35, 13)}`;
const NPM = `npm_${rand(36, 14)}`;
const AWS = `AKIA${"IOSFODNN7EXAMPLE"}`;
const LONG = `${rand(24, 15)}`;

type Row = [name: string, input: string, expected: string];

const positiveRows: Row[] = [
  // env-style assignments
  ["export *_KEY=", `export OPENAI_API_KEY=${LONG}`, `export OPENAI_API_KEY=${maskSecret(LONG)}`],
  ["*_TOKEN: value", `GITHUB_TOKEN: ${LONG}`, `GITHUB_TOKEN: ${maskSecret(LONG)}`],
  ["*_SECRET=\"quoted\"", `AWS_SECRET="${LONG}"`, `AWS_SECRET="${maskSecret(LONG)}"`],
  ["*_PASSWORD='short'", "DB_PASSWORD='hunter2'", "DB_PASSWORD='***'"],
  ["lowercase yaml api_key", "api_key: abc123xyz", "api_key: ***"],
  ["password: in prose-like text", "password: hunter2", "password: ***"],
  ["URL query token", "https://x.test/cb?token=abcdef123&next=1", "https://x.test/cb?token=***&next=1"],
  // JSON fields
  ["JSON apiKey", `{"apiKey": "${LONG}"}`, `{"apiKey": "${maskSecret(LONG)}"}`],
  ["JSON api_key", '{"api_key":"k-123"}', '{"api_key":"***"}'],
  ["JSON token", '{"token": "abc"}', '{"token": "***"}'],
  ["JSON accessToken", `{"accessToken": "${LONG}", "user": "bob"}`, `{"accessToken": "${maskSecret(LONG)}", "user": "bob"}`],
  ["JSON refreshToken", '{"refreshToken": "r-1"}', '{"refreshToken": "***"}'],
  ["JSON secret", '{"secret": "s3cr3t"}', '{"secret": "***"}'],
  ["JSON password with escaped quote", '{"password": "p\\"w"}', '{"password": "***"}'],
  ["JSON clientSecret", '{"clientSecret": "cs-1"}', '{"clientSecret": "***"}'],
  ["escaped JSON inside a JSON string", '{"args": "{\\"token\\": \\"abc\\"}"}', '{"args": "{\\"token\\": \\"***\\"}"}'],
  // CLI flags
  ["--api-key X", `tool --api-key ${LONG} run`, `tool --api-key ${maskSecret(LONG)} run`],
  ["--api-key=X", "tool --api-key=abc123 run", "tool --api-key=*** run"],
  ["--token", "gh --token abc123", "gh --token ***"],
  ["--password quoted", "db --password 'p@ss word'", "db --password '***'"],
  // headers
  ["Authorization: Bearer", `Authorization: Bearer ${LONG}`, `Authorization: Bearer ${maskSecret(LONG)}`],
  ["Authorization: Basic in curl", "curl -H 'Authorization: Basic dXNlcjpwYXNz'", "curl -H 'Authorization: Basic ***'"],
  ["JSON authorization header", '{"authorization": "Bearer abc"}', '{"authorization": "Bearer ***"}'],
  ["stand-alone Bearer token", `use Bearer ${LONG} here`, `use Bearer ${maskSecret(LONG)} here`],
  // PEM
  [
    "PEM private key block",
    "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nabc+/=\n-----END RSA PRIVATE KEY-----\nafter",
    "key:\n-----BEGIN RSA PRIVATE KEY-----\n***\n-----END RSA PRIVATE KEY-----\nafter",
  ],
  [
    "unterminated PEM block",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\ntruncated",
    "-----BEGIN OPENSSH PRIVATE KEY-----\n***",
  ],
  ["PEM with escaped newlines", '"-----BEGIN PRIVATE KEY-----\\nMIIE\\n-----END PRIVATE KEY-----"', '"-----BEGIN PRIVATE KEY-----\\n***\\n-----END PRIVATE KEY-----"'],
  // well-known prefixes
  ["sk- key", `key ${OPENAI} end`, `key ${maskSecret(OPENAI)} end`],
  ["sk-proj- key", `(${OPENAI_PROJ})`, `(${maskSecret(OPENAI_PROJ)})`],
  ["sk-ant- key", `"${ANTHROPIC}"`, `"${maskSecret(ANTHROPIC)}"`],
  ["ghp_", GHP, maskSecret(GHP)],
  ["gho_", GHO, maskSecret(GHO)],
  ["ghu_", GHU, maskSecret(GHU)],
  ["ghs_", GHS, maskSecret(GHS)],
  ["ghr_", GHR, maskSecret(GHR)],
  ["github_pat_", GITHUB_PAT, maskSecret(GITHUB_PAT)],
  ["xoxb-", SLACK_BOT, maskSecret(SLACK_BOT)],
  ["xoxp-", SLACK_USER, maskSecret(SLACK_USER)],
  ["AIza", GOOGLE, maskSecret(GOOGLE)],
  ["npm_", NPM, maskSecret(NPM)],
  ["AWS AKIA", `id=${AWS}.`, `id=${maskSecret(AWS)}.`],
  ["URL credentials", "postgres://admin:s3cretpass@db:5432/app", "postgres://admin:***@db:5432/app"],
  // code is not exempt
  ["inside an inline code span", `run \`export NPM_TOKEN=${LONG}\``, `run \`export NPM_TOKEN=${maskSecret(LONG)}\``],
  ["inside a fence", `\`\`\`sh\ncurl -H "Authorization: Bearer ${LONG}"\n\`\`\``, `\`\`\`sh\ncurl -H "Authorization: Bearer ${maskSecret(LONG)}"\n\`\`\``],
];

const negativeRows: Row[] = [
  ["token budget prose", "the token budget is 4k", "the token budget is 4k"],
  ["password reset prose", "password reset flow", "password reset flow"],
  ["sk-learn word", "we use sk-learn for this", "we use sk-learn for this"],
  ["long sk- prose word without a digit run", "sk-learn-compatibility-layer-for-models", "sk-learn-compatibility-layer-for-models"],
  ["max_tokens count", "max_tokens=4096", "max_tokens=4096"],
  ["public key is not secret", "public_key=ssh-ed25519", "public_key=ssh-ed25519"],
  ["secret: plain prose word", "the secret: never tell", "the secret: never tell"],
  ["words ending in key", "monkey=banana turkey: roasted", "monkey=banana turkey: roasted"],
  ["too-short ghp_", "ghp_short", "ghp_short"],
  ["too-short AKIA", "AKIA1234", "AKIA1234"],
  ["bearer in prose", "the Bearer of bad news", "the Bearer of bad news"],
  ["placeholders", "OPENAI_API_KEY=$OPENAI_API_KEY token: <your-token>", "OPENAI_API_KEY=$OPENAI_API_KEY token: <your-token>"],
  ["code references", "apiKey: process.env.OPENAI_API_KEY", "apiKey: process.env.OPENAI_API_KEY"],
  ["working directory variable", "PWD=/home/me", "PWD=/home/me"],
  ["flag that is not secret", "--token-limit 5 --max-tokens 9", "--token-limit 5 --max-tokens 9"],
];

describe("redact (default redactor)", () => {
  it.each(positiveRows)("redacts %s", (_name, input, expected) => {
    const out = defaultRedactor.redact(input);
    expect(out.text).toBe(expected);
    expect(out.redacted).toBe(true);
  });

  it.each(negativeRows)("keeps %s", (_name, input, expected) => {
    const out = redactText(input);
    expect(out.text).toBe(expected);
    expect(out.redacted).toBe(false);
  });

  it.each([...positiveRows, ...negativeRows])("is idempotent: %s", (_name, input) => {
    const once = redactText(input).text;
    const twice = redactText(once);
    expect(twice.text).toBe(once);
    expect(twice.redacted).toBe(false);
  });

  it.each([
    ["", "***"],
    ["a", "***"],
    ["abcdefghijklmnopq", "***"], // 17 characters
    ["abcdefghijklmnopqr", "abcdef…opqr"], // 18 characters
    ["0123456789abcdefghijklmnopqrstuvwxyz", "012345…wxyz"],
  ])("maskSecret(%j) = %j", (secret, masked) => {
    expect(maskSecret(secret)).toBe(masked);
  });

  it.each([
    ["OPENAI_API_KEY", true],
    ["apiKey", true],
    ["clientSecret", true],
    ["db.password", true],
    ["x-api-key", true],
    ["accesstoken", true],
    ["monkey", false],
    ["max_tokens", false],
    ["token_count", false],
    ["public_key", false],
    ["key", false],
    ["PWD", false],
  ])("isSecretName(%j) = %j", (name, expected) => {
    expect(isSecretName(name)).toBe(expected);
  });

  it.each([
    ["sk- runs", "sk-".repeat(350_000)],
    ["assignments with open quotes", 'API_KEY="'.repeat(110_000)],
    ["JSON keys with open strings", '"token": "'.repeat(100_000)],
    ["escaped JSON fields on one line", '{\\"token\\": \\"abc\\"} '.repeat(40_000)],
    ["flags without values", "--token ".repeat(125_000)],
    ["header prefixes", "Authorization: ".repeat(66_000)],
    ["unterminated PEM headers", "-----BEGIN PRIVATE KEY-----".repeat(37_000)],
    ["one long identifier", "a_".repeat(500_000) + "KEY=x"],
    ["long whitespace runs", `TOKEN${" ".repeat(1_000_000)}=x`],
    ["URL-like runs", "ab://user:".repeat(100_000)],
    ["long token-ish run", "x".repeat(1_000_000)],
  ])("completes on a ~1 MB adversarial input: %s", (_name, input) => {
    const out = redactText(input);
    expect(typeof out.text).toBe("string");
  });
});

describe("createRedactor extraPatterns", () => {
  it.each<[string, (string | RegExp)[], string, string]>([
    ["string pattern masks the whole match", ["internal-[a-z0-9]+"], "id internal-abc123 ok", "id *** ok"],
    ["RegExp group 1 is masked", [/code=(\d+)/], "code=123456", "code=***"],
    ["RegExp without g flag still masks every match", [/corp_[0-9]{4}/], "corp_1234 corp_5678", "*** ***"],
    [
      "long match keeps 6 + 4 characters",
      [/acme_[a-z0-9]{20}/i],
      "acme_abcdefghij0123456789",
      maskSecret("acme_abcdefghij0123456789"),
    ],
    ["built-in rules still apply", ["zz-[0-9]+"], `zz-1 ${GHP}`, `*** ${maskSecret(GHP)}`],
  ])("%s", (_name, extraPatterns, input, expected) => {
    const out = createRedactor({ extraPatterns }).redact(input);
    expect(out.text).toBe(expected);
    expect(out.redacted).toBe(true);
  });

  it("throws on an invalid string pattern", () => {
    expect(() => createRedactor({ extraPatterns: ["("] })).toThrow(SyntaxError);
  });

  it("survives zero-length extra matches", () => {
    expect(createRedactor({ extraPatterns: [/x*/] }).redact("abc").text).toBe("abc");
  });

  it("runs extra patterns on RE2: (a+)+$ is linear, and the RegExp flags i, m, s carry over", () => {
    const redactor = createRedactor({ extraPatterns: ["(a+)+$"] });
    expect(redactor.redact(`${"a".repeat(32)}!`).text).toBe(`${"a".repeat(32)}!`);
    expect(redactor.redact(`x ${"a".repeat(200_000)}!`).redacted).toBe(false);
    expect(redactor.redact(`x ${"a".repeat(20)}`).text).toBe("x aaaaaa…aaaa");
    expect(createRedactor({ extraPatterns: [/corp-\d+/i] }).redact("CORP-12").text).toBe("***");
    expect(createRedactor({ extraPatterns: [/^k=(\w+)$/m] }).redact("a\nk=secret\nb").text).toBe("a\nk=***\nb");
    expect(createRedactor({ extraPatterns: [/begin.+end/s] }).redact("begin\nend").text).toBe("***");
  });

  it.each([
    ["a backreference", "(a)\\1", /backreferences/],
    ["a lookahead", "a(?=b)", /lookahead and lookbehind/],
    ["a negative lookbehind", "(?<!x)a", /lookahead and lookbehind/],
    ["a RegExp with a backreference", /(a)\1/, /backreferences/],
  ])("refuses %s, naming the pattern and why", (_name, pattern, why) => {
    expect(() => createRedactor({ extraPatterns: [pattern] })).toThrow(RedactPatternError);
    expect(() => createRedactor({ extraPatterns: [pattern] })).toThrow(why);
  });
});

/** Known-format secrets with random bodies (every body carries at least one digit). */
const body = (min: number, max: number) =>
  fc
    .tuple(fc.stringMatching(new RegExp(`^[A-Za-z0-9]{${min},${max}}$`)), fc.integer({ min: 0, max: 9 }))
    .map(([s, d]) => `${s}${d}`);

const knownSecret = fc.oneof(
  body(24, 60).map((b) => `sk-${b}`),
  body(24, 60).map((b) => `sk-proj-${b}`),
  body(24, 60).map((b) => `sk-ant-api03-${b}`),
  fc.tuple(fc.constantFrom("ghp", "gho", "ghu", "ghs", "ghr"), body(35, 40)).map(([p, b]) => `${p}_${b}`),
  body(60, 90).map((b) => `github_pat_${b}`),
  fc.tuple(fc.constantFrom("a", "b", "p", "r", "s"), body(15, 40)).map(([k, b]) => `xox${k}-${b}`),
  body(34, 40).map((b) => `AIza${b}`),
  body(35, 40).map((b) => `npm_${b}`),
  fc.stringMatching(/^[0-9A-Z]{16}$/).map((b) => `AKIA${b}`),
);

const separator = fc.constantFrom(" ", "\n", "\t", " (", ") ", '"', "'", ", ", ": ", "=", "`", "\n```\n");

describe("redact properties", () => {
  it("never leaves a generated known-format secret in its output", () => {
    fc.assert(
      fc.property(
        fc.string({ maxLength: 60 }),
        separator,
        knownSecret,
        separator,
        fc.string({ maxLength: 60 }),
        (before, sep1, secret, sep2, after) => {
          const out = redactText(`${before}${sep1}${secret}${sep2}${after}`);
          expect(out.text).not.toContain(secret);
          expect(out.redacted).toBe(true);
        },
      ),
      { numRuns: 1000 },
    );
  });

  it("never throws on arbitrary text and is idempotent", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme", maxLength: 200 }), (text) => {
        const once = redactText(text).text;
        expect(redactText(once).text).toBe(once);
      }),
      { numRuns: 500 },
    );
  });
});
