// Drives maasd's OpenAI-compatible endpoint with the official Node SDK (npm
// `openai`) and prints what it saw as one JSON document, for the Rust
// integration tests to assert on: the Node twin of client.py, with the same
// plan on stdin, the same step kinds (chat, stream, models) and the same
// report. The tests run it as `$MAAS_OPENAI_NODE client.mjs` with
// MAAS_OPENAI_NODE_DIR set to the directory holding node_modules/openai
// (bin/test installs both under target/; without the variable, the
// repository's target/openai-node).

import { createRequire } from "node:module";
import path from "node:path";

const dir =
  process.env.MAAS_OPENAI_NODE_DIR || path.join(import.meta.dirname, "../../target/openai-node");
let OpenAI, APIError; // the SDK's, loaded below (a failure to load is reported)

const usage = (u) =>
  u
    ? { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens, total_tokens: u.total_tokens }
    : null;

// The request body and options of chat.completions.create; the optional
// fields only when given.
function createArgs(step) {
  const body = { model: step.model, messages: step.messages };
  for (const key of ["user", "metadata"]) {
    if (step[key] != null) body[key] = step[key];
  }
  const options = step.extra_headers != null ? { headers: step.extra_headers } : undefined;
  return [body, options];
}

async function chat(client, step) {
  const r = await client.chat.completions.create(...createArgs(step));
  const choice = r.choices?.[0];
  return {
    ok: true,
    id: r.id,
    model: r.model,
    content: choice ? choice.message.content : null,
    finish_reason: choice ? choice.finish_reason : null,
    usage: usage(r.usage),
  };
}

async function stream(client, step) {
  const [body, options] = createArgs(step);
  body.stream = true;
  if (step.include_usage) body.stream_options = { include_usage: true };
  const ids = [];
  let content = "", finish = null, lastUsage = null, chunks = 0;
  for await (const chunk of await client.chat.completions.create(body, options)) {
    chunks += 1;
    if (!ids.includes(chunk.id)) ids.push(chunk.id);
    for (const choice of chunk.choices ?? []) {
      if (choice.delta?.content) content += choice.delta.content;
      if (choice.finish_reason != null) finish = choice.finish_reason;
    }
    if (chunk.usage != null) lastUsage = usage(chunk.usage);
  }
  return { ok: true, id: ids[0] ?? null, ids, content, finish_reason: finish, usage: lastUsage, chunks };
}

async function models(client) {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  return { ok: true, ids };
}

const KINDS = { chat, stream, models };

async function run(client, step) {
  try {
    return await KINDS[step.kind](client, step);
  } catch (e) {
    // A connection failure is an APIError too, without a status.
    if (e instanceof APIError && e.status !== undefined) {
      return {
        ok: false,
        status: e.status,
        type: e.type ?? null,
        code: e.code ?? null,
        message: String(e.message),
        retry_after: e.headers?.get("retry-after") ?? null,
      };
    }
    return { ok: false, exception: String(e) };
  }
}

const report = [];
try {
  let input = "";
  for await (const part of process.stdin) input += part;
  const plan = JSON.parse(input);
  ({ OpenAI, APIError } = createRequire(path.join(dir, "package.json"))("openai"));
  const client = new OpenAI({
    baseURL: plan.base_url,
    apiKey: plan.api_key,
    maxRetries: 0,
    timeout: 120_000,
  });
  for (const step of plan.steps) report.push(await run(client, step));
} catch (e) {
  report.push({ ok: false, exception: String(e) });
}
console.log(JSON.stringify(report));
