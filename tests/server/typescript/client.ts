/**
 * A client no one at episodic wrote: its types are generated from the live server's
 * /openapi.json (openapi-typescript, into schema.d.ts) and its requests go through
 * openapi-fetch. It creates a conversation, appends with an Idempotency-Key (twice, then with
 * another body), appends behind a stale If-Match, appends in OpenAI's chat format, loads the
 * context in OpenAI's format and meets the errors, then prints one JSON line of what it saw
 * for tests/server/test_typescript_client.py to check.
 *
 * `tsc --noEmit` (strict) is half the test: every body, parameter and error below is typed by
 * the generated schema, so a schema that stops describing the API stops this compiling.
 *
 * Run: EPISODIC_URL=http://127.0.0.1:8000 EPISODIC_KEY=ep_... npx tsx client.ts
 */
import createClient from "openapi-fetch";

import type { components, paths } from "./schema";

type Problem = components["schemas"]["Problem"];
type Message = components["schemas"]["Message"];
type NewMessage = components["schemas"]["NewMessage"];
type AppendBatch = components["schemas"]["AppendBatch"];
type OpenAIAppendBatch = components["schemas"]["OpenAIAppendBatch"];
type StoredEvent = components["schemas"]["Appended"]["events"][number];

/** One OpenAI chat-completions message, as far as this client reads it. */
interface OpenAIMessage {
  role: string;
  content: string | null;
  tool_calls?: { id: string; type: string; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
}

/** What the client saw; the Python test asserts every field. */
interface Summary {
  created: { status: number; location: string | null; etag: string | null; id: string };
  append: { status: number; etag: string | null; seqs: number[]; last_seq: number };
  replay: { status: number; etag: string | null; seqs: number[]; last_seq: number };
  mismatch: { status: number; content_type: string | null; type: string; title: string };
  stale: { status: number; type: string; detail: string | null };
  fresh: { status: number; seqs: number[] };
  context: {
    status: number;
    etag: string | null;
    format: string;
    last_seq: number;
    messages: {
      role: string;
      content: string | null;
      tool_calls: string[];
      tool_call_id: string | null;
    }[];
  };
  not_found: { status: number; type: string; instance: string | null };
  no_key: { status: number; type: string; www_authenticate: string | null };
}

function env(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") {
    throw new Error(`set ${name}`);
  }
  return value;
}

/** The success body of an openapi-fetch result, or an Error naming the problem. */
function ok<T>(what: string, result: { data?: T; error?: Problem; response: Response }): T {
  if (result.data === undefined) {
    const problem = result.error === undefined ? "no body" : JSON.stringify(result.error);
    throw new Error(`${what}: HTTP ${result.response.status}: ${problem}`);
  }
  return result.data;
}

/** The problem of an openapi-fetch result that should have failed. */
function failed(what: string, result: { data?: unknown; error?: Problem; response: Response }) {
  if (result.error === undefined) {
    throw new Error(`${what}: expected an error, got HTTP ${result.response.status}`);
  }
  return result.error;
}

function seqsOf(events: StoredEvent[]): number[] {
  return events.map((event) => event.seq);
}

function isOpenAIMessage(value: unknown): value is OpenAIMessage {
  if (typeof value !== "object" || value === null || !("role" in value)) {
    return false;
  }
  const content = "content" in value ? value.content : null;
  return typeof value.role === "string" && (content === null || typeof content === "string");
}

// The generated types are narrow: a role outside the schema's enum does not compile...
// @ts-expect-error "robot" is not one of Message["role"]
const notARole: Message = { role: "robot", content: "beep", tool_calls: [], is_error: false };
void notARole;
// ...and a message to append has each role's rules: a tool result needs its call's id.
// @ts-expect-error a NewToolMessage without tool_call_id
const noCallId: NewMessage = { role: "tool", content: "18°C" };
void noCallId;

async function main(): Promise<Summary> {
  const baseUrl = env("EPISODIC_URL");
  const client = createClient<paths>({
    baseUrl,
    headers: { Authorization: `Bearer ${env("EPISODIC_KEY")}` },
  });
  const anonymous = createClient<paths>({ baseUrl });

  const created = await client.POST("/v1/conversations", {
    body: { metadata: { client: "openapi-fetch" } },
  });
  const head = ok("create", created);
  const id = head.conversation.conversation_id;
  const createdEtag = created.response.headers.get("ETag");
  const path = { conversation_id: id };

  const batch: AppendBatch = {
    messages: [
      { role: "user", content: "What is the weather in Paris?" },
      {
        role: "assistant",
        content: null,
        tool_calls: [{ id: "call_1", name: "weather", args: { city: "Paris" } }],
      },
      { role: "tool", tool_call_id: "call_1", name: "weather", content: "18°C and sunny" },
      { role: "assistant", content: "It is 18°C and sunny in Paris." },
    ],
    usage: { input_tokens: 120, output_tokens: 30 },
  };
  const idempotencyKey = `ts-${crypto.randomUUID()}`;
  const appendWithKey = (body: AppendBatch) =>
    client.POST("/v1/conversations/{conversation_id}/messages", {
      params: { path, header: { "Idempotency-Key": idempotencyKey } },
      body,
    });

  const first = await appendWithKey(batch);
  const appended = ok("append", first);
  const second = await appendWithKey(batch);
  const replayed = ok("replayed append", second);

  const other = await appendWithKey({ messages: [{ role: "user", content: "And in Lyon?" }] });
  const mismatch: Problem = failed("append of another body under the same key", other);

  // The ETag from creation ("0") is behind the batch just appended.
  const staleAppend = await client.POST("/v1/conversations/{conversation_id}/messages", {
    params: { path, header: { "If-Match": createdEtag ?? '"0"' } },
    body: { messages: [{ role: "user", content: "Behind the head" }] },
  });
  const stale: Problem = failed("append with a stale If-Match", staleAppend);

  // In OpenAI's chat format, as the context below gives it back.
  const chat: OpenAIAppendBatch = { format: "openai", messages: [{ role: "user", content: "Thanks!" }] };
  const freshAppend = await client.POST("/v1/conversations/{conversation_id}/messages", {
    params: { path, header: { "If-Match": first.response.headers.get("ETag") ?? "" } },
    body: chat,
  });
  const fresh = ok("append with the head's If-Match", freshAppend);

  const loaded = await client.GET("/v1/conversations/{conversation_id}/context", {
    params: { path, query: { format: "openai" } },
  });
  const context = ok("load_context", loaded);
  const messages = context.messages.map((item, index) => {
    if (!isOpenAIMessage(item)) {
      throw new Error(`context message ${index} is not a chat-completions message`);
    }
    return {
      role: item.role,
      content: item.content,
      tool_calls: (item.tool_calls ?? []).map((call) => `${call.function.name}:${call.id}`),
      tool_call_id: item.tool_call_id ?? null,
    };
  });

  const unknown = await client.GET("/v1/conversations/{conversation_id}", {
    params: { path: { conversation_id: crypto.randomUUID() } },
  });
  const notFound: Problem = failed("get of an unknown conversation", unknown);

  const keyless = await anonymous.GET("/v1/conversations");
  const noKey: Problem = failed("list without a key", keyless);

  return {
    created: {
      status: created.response.status,
      location: created.response.headers.get("Location"),
      etag: createdEtag,
      id,
    },
    append: {
      status: first.response.status,
      etag: first.response.headers.get("ETag"),
      seqs: seqsOf(appended.events),
      last_seq: appended.last_seq,
    },
    replay: {
      status: second.response.status,
      etag: second.response.headers.get("ETag"),
      seqs: seqsOf(replayed.events),
      last_seq: replayed.last_seq,
    },
    mismatch: {
      status: other.response.status,
      content_type: other.response.headers.get("Content-Type"),
      type: mismatch.type,
      title: mismatch.title,
    },
    stale: { status: staleAppend.response.status, type: stale.type, detail: stale.detail ?? null },
    fresh: { status: freshAppend.response.status, seqs: seqsOf(fresh.events) },
    context: {
      status: loaded.response.status,
      etag: loaded.response.headers.get("ETag"),
      format: context.format,
      last_seq: context.last_seq,
      messages,
    },
    not_found: {
      status: unknown.response.status,
      type: notFound.type,
      instance: notFound.instance ?? null,
    },
    no_key: {
      status: keyless.response.status,
      type: noKey.type,
      www_authenticate: keyless.response.headers.get("WWW-Authenticate"),
    },
  };
}

main().then(
  (summary) => {
    console.log(JSON.stringify(summary));
  },
  (error: unknown) => {
    console.error(error instanceof Error ? (error.stack ?? error.message) : String(error));
    process.exitCode = 1;
  },
);
