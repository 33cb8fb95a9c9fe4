import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { sanitizeAssistantText, sanitizeUserText } from "../src/core/transcript/sanitize.js";

type Row = [name: string, input: string, expected: string];

/** The examples of design §4.2, row by row. */
const specRows: Row[] = [
  ["spec: ASCII control tokens", "<|assistant|>Here is the answer<|end|>", "Here is the answer"],
  ["spec: full-width control token", "<｜begin▁of▁sentence｜>Hello world", "Hello world"],
  [
    "spec: truncated tool_call payload",
    'Let me run.\n<tool_call>\n{"name": "find", "arguments": {}}\n',
    "Let me run.\n",
  ],
  ["spec: tag named in prose", "Use <tool_call> to invoke tools.", "Use <tool_call> to invoke tools."],
  ["spec: thinking block", "<think>private</think>Visible answer", "Visible answer"],
  ["spec: tag inside a code span", "`<tool_call>`", "`<tool_call>`"],
  [
    "spec: tag inside a fence",
    '```\n<tool_call>\n{"name": "find"}\n</tool_call>\n```',
    '```\n<tool_call>\n{"name": "find"}\n</tool_call>\n```',
  ],
];

const thinkingRows: Row[] = [
  ["thinking tags with blank lines after", "<thinking>plan</thinking>\n\nAnswer", "Answer"],
  ["thinking tag names are case-insensitive", "<THINK>x</THINK>Y", "Y"],
  ["unterminated think hides the rest", "<think>still reasoning about it", ""],
  ["unterminated think after an answer line", "Answer first.\n<think>\nmore private", "Answer first.\n"],
  ["stray closer is removed (tag only)", "reasoning done</think>Answer", "reasoning done Answer"],
  ["thinking opener mid-line with closer", "Sure. <think>hmm</think> The answer is 4.", "Sure. The answer is 4."],
  ["thinking tag named in prose, unterminated", "Use <thinking> tags for reasoning.", "Use <thinking> tags for reasoning."],
  [
    "relevant-memories scaffolding",
    "<relevant-memories>\n- likes tea\n</relevant-memories>\nHi there",
    "Hi there",
  ],
  [
    "relevant_memories scaffolding mid-text",
    "Noted.\n\n<relevant_memories>x</relevant_memories>\n\nNext paragraph",
    "Noted.\n\nNext paragraph",
  ],
];

const toolRows: Row[] = [
  [
    "closing tag inside a JSON string does not close",
    '<tool_call>{"arguments": {"x": "</tool_call>"}}</tool_call>after',
    "after",
  ],
  [
    "escaped quote inside the JSON string",
    '<tool_call>{"x": "a\\"</tool_call>"}</tool_call>after',
    "after",
  ],
  ["function_call block mid-line with JSON payload", 'Checking. <function_call>{"name":"ls"}</function_call> Done.', "Checking. Done."],
  ["tool_calls block with array payload", '<tool_calls>[{"name":"a"}]</tool_calls>Done.', "Done."],
  [
    "nested function_calls / invoke block",
    '<function_calls>\n<invoke name="a">\n<parameter name="p">1</parameter>\n</invoke>\n</function_calls>\nok',
    "ok",
  ],
  ["tag pair named in prose is kept", "Use <tool_call> and </tool_call> tags.", "Use <tool_call> and </tool_call> tags."],
  ["unterminated function_calls at line start", "Working\n<function_calls>\n<invoke", "Working\n"],
  [
    "MiniMax invoke wrapped in minimax tags",
    '<minimax:tool_call>\n<invoke name="bash">\n<parameter name="cmd">ls</parameter>\n</invoke>\n</minimax:tool_call>\nDone',
    "Done",
  ],
  ["stray MiniMax closer", "Result</minimax:tool_call>", "Result"],
  ["stray MiniMax opener", "<minimax:tool_call>Text", "Text"],
  ["truncated invoke hides the rest", 'Running\n<invoke name="bash">\n<parameter name="cmd">ls -la', "Running\n"],
  ["stray tool closer alone on its line", "Done.\n</tool_call>\nBye", "Done.\nBye"],
  [
    "backtick inside a removed block does not start code",
    '<tool_call>\n{"cmd": "echo `x`"}\n</tool_call>\nok',
    "ok",
  ],
];

const markerRows: Row[] = [
  [
    "Tool Call marker with Arguments line",
    '[Tool Call: read (ID: toolu_1)]\nArguments: {"path": "/a"}\nThe file says hi.',
    "The file says hi.",
  ],
  ["Tool Result marker mid-line", "Result: [Tool Result for ID toolu_1] done", "Result: done"],
  [
    "Historical context marker with nested brackets",
    '[Historical context: a different model called tool "x" with arguments: {"a": [1, 2]}. Do not mimic.]\nReply',
    "Reply",
  ],
  ["marker with ] inside a quoted string", '[Tool Result: "a]b"] tail', "tail"],
  ["unterminated marker extends to end of line", "[Tool Call: exec (ID: 1\nnext line", "next line"],
  ["ordinary bracketed prose is kept", "[Tool results are below] and [Tools: none]", "[Tool results are below] and [Tools: none]"],
];

const tokenRows: Row[] = [
  ["token between two words leaves one space", "Hello<|end|>world", "Hello world"],
  ["token between spaced words leaves one space", "Hello <|end|> world", "Hello world"],
  ["token at start leaves no space", "<|end|> Hello", "Hello"],
  ["token at end leaves no space", "Hello <|end|>", "Hello"],
  ["token before punctuation", "Hello <|end|>.", "Hello."],
  ["im_start takes its role word", "<|im_start|>assistant\nHi there<|im_end|>", "Hi there"],
  ["token-only text", "<|eot_id|>", ""],
  ["full-width token at end", "Hello<｜end▁of▁sentence｜>", "Hello"],
  ["not a token: whitespace inside", "a <| b |> c", "a <| b |> c"],
  ["not a token: longer than 64", `x <|${"a".repeat(65)}|> y`, `x <|${"a".repeat(65)}|> y`],
];

const codeAndWhitespaceRows: Row[] = [
  ["tilde fence untouched", "~~~\n<|end|> <think>x</think>\n~~~", "~~~\n<|end|> <think>x</think>\n~~~"],
  ["double-backtick span untouched", "``<|end|> and <think>`` ok", "``<|end|> and <think>`` ok"],
  ["unterminated fence keeps the rest", "```js\nconst a = '<think>';\n", "```js\nconst a = '<think>';\n"],
  [
    "code span kept while a later block is removed",
    'Run `<tool_call>` then:\n<tool_call>\n{"name":"x"}\n</tool_call>\nDone',
    "Run `<tool_call>` then:\nDone",
  ],
  ["block on its own line keeps one line break", "A\n<tool_call>{}</tool_call>\nB", "A\nB"],
  ["3+ line breaks from removals collapse to 2", "A\n\n\n<think>x</think>\n\n\nB", "A\n\nB"],
  ["indentation of the next line is kept", "Steps:\n<think>x</think>\n  - one", "Steps:\n  - one"],
  ["author whitespace without removals is kept", "Keep   spacing  here.\n\n\n\nAnd here  ", "Keep   spacing  here.\n\n\n\nAnd here  "],
  ["author whitespace away from a removal is kept", "a  b\n\n\n\nc <|x|>", "a  b\n\n\n\nc"],
  ["CRLF line breaks survive", "A\r\n<think>x</think>\r\nB", "A\r\nB"],
  ["text without markup is returned as is", "plain text, nothing to do", "plain text, nothing to do"],
];

const assistantRows: Row[] = [
  ...specRows,
  ...thinkingRows,
  ...toolRows,
  ...markerRows,
  ...tokenRows,
  ...codeAndWhitespaceRows,
];

describe("sanitizeAssistantText", () => {
  it.each(assistantRows)("%s", (_name, input, expected) => {
    expect(sanitizeAssistantText(input)).toBe(expected);
  });

  it.each(assistantRows)("is idempotent: %s", (_name, input) => {
    const once = sanitizeAssistantText(input);
    expect(sanitizeAssistantText(once)).toBe(once);
  });

  it.each([
    ["many unterminated prose openers", "Use <think> x ".repeat(80_000)],
    ["many prose tool tags", "Use <tool_call> x ".repeat(60_000)],
    ["many unmatched backtick runs", Array.from({ length: 1400 }, (_, k) => "`".repeat(k % 700 + 1) + " a ").join("").repeat(3)],
    ["many unterminated markers", "[Tool Call: x (ID: 1\n".repeat(50_000)],
    ["many closed markers on one line", "[Tool Result x] w ".repeat(55_000)],
    ["many control-token look-alikes", "<|".repeat(500_000)],
    ["alternating tokens and words", "w<|t|>".repeat(170_000)],
    ["a long string after an unterminated quote", `<tool_call>\n{"a": "${"x".repeat(1_000_000)}`],
  ])("handles a ~1 MB adversarial input: %s", (_name, input) => {
    const out = sanitizeAssistantText(input);
    expect(out.length).toBeLessThanOrEqual(input.length);
  });
});

describe("sanitizeUserText", () => {
  it.each<Row>([
    ["removes memory scaffolding", "<relevant-memories>m</relevant-memories>\nHi <|end|>", "Hi <|end|>"],
    ["keeps user-typed markup", "What does <think> or <|endoftext|> do?", "What does <think> or <|endoftext|> do?"],
    ["keeps tool XML typed by a user", '<tool_call>{"name":"x"}</tool_call>', '<tool_call>{"name":"x"}</tool_call>'],
  ])("%s", (_name, input, expected) => {
    expect(sanitizeUserText(input)).toBe(expected);
  });
});

/** Fragments that exercise every rule, for generated texts. */
const fragment = fc.constantFrom(
  "<think>",
  "</think>",
  "<thinking>",
  "</thinking>",
  "<tool_call>",
  "</tool_call>",
  "<function_calls>",
  "</function_calls>",
  '<invoke name="x">',
  "</invoke>",
  "<minimax:tool_call>",
  "</minimax:tool_call>",
  "<relevant-memories>",
  "</relevant-memories>",
  "<|end|>",
  "<|im_start|>",
  "<｜begin▁of▁sentence｜>",
  "[Tool Call: x]",
  "[Tool Result ",
  "[Historical context: ",
  "Arguments: ",
  "[",
  "]",
  "{",
  "}",
  '"',
  "\\",
  "`",
  "```",
  "~~~",
  "Tool",
  "Call:",
  "<",
  "|",
  ">",
  "\n",
  "\n\n",
  " ",
  "  ",
  ".",
  "word",
  "Hello",
);
const markupText = fc.array(fragment, { maxLength: 40 }).map((parts) => parts.join(""));

describe("sanitize properties", () => {
  it("never throws and never grows text (arbitrary strings)", () => {
    fc.assert(
      fc.property(fc.string({ unit: "grapheme", maxLength: 200 }), (text) => {
        const out = sanitizeAssistantText(text);
        expect(out.length).toBeLessThanOrEqual(text.length);
        expect(sanitizeUserText(text).length).toBeLessThanOrEqual(text.length);
      }),
      { numRuns: 500 },
    );
  });

  it("never throws, never grows and is idempotent (markup-heavy texts)", () => {
    fc.assert(
      fc.property(markupText, (text) => {
        const out = sanitizeAssistantText(text);
        expect(out.length).toBeLessThanOrEqual(text.length);
        expect(sanitizeAssistantText(out)).toBe(out);
      }),
      { numRuns: 2000 },
    );
  });
});
