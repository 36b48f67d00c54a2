/** The client against a live `episodic serve` on PostgreSQL: every route, every error the
 * server can be made to answer, and the retries (through a proxy that cuts connections). */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  AuthenticationError,
  ConflictError,
  DuplicateToolCallError,
  EpisodicClient,
  EpisodicError,
  ERROR_CLASSES,
  ErasedConversationError,
  errorFor,
  HttpError,
  IdempotencyMismatchError,
  MessageTooLargeError,
  NetworkError,
  NotFoundError,
  NotPinnedError,
  OperatorRequiredError,
  OrphanToolResultError,
  OverloadedError,
  retryAfterMs,
  ToolPairingError,
  UnsupportedMediaTypeError,
  ValidationError,
} from "../src/index.js";
import { API_KEY, BASE_URL, client, CuttingProxy, operator, userMessage } from "./support.js";

const UNKNOWN = "00000000-0000-4000-8000-000000000000";

async function conversation(c: EpisodicClient = client()): Promise<string> {
  return (await c.createConversation()).conversation.conversation_id;
}

async function rejects<E extends EpisodicError>(
  promise: Promise<unknown>,
  cls: abstract new (...args: never[]) => E,
  status: number,
): Promise<E> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof cls, `expected ${cls.name}, got ${String(error)}`);
    assert.equal(error.status, status);
    assert.equal(error.name, cls.name);
    return error;
  }
  assert.fail(`expected ${cls.name}`);
}

describe("routes", () => {
  test("create, get, list", async () => {
    const c = client();
    const id = crypto.randomUUID();
    const head = await c.createConversation({ conversationId: id, metadata: { title: "refunds" } });
    assert.equal(head.conversation.conversation_id, id);
    assert.equal(c.lastETag(id), '"0"');
    const got = await c.getConversation(id);
    assert.equal(got.conversation.last_seq, 0);
    assert.equal(got.conversation.metadata?.title, "refunds");
    const page = await c.listConversations({ limit: 500 });
    assert.ok(page.items.some((item) => item.conversation_id === id));
  });

  test("append in episodic's and OpenAI's format, replay under the same key", async () => {
    const c = client();
    const id = await conversation(c);
    const first = await c.append(id, [userMessage("What is the weather in Paris?")], {
      idempotencyKey: "turn-1",
      usage: { input_tokens: 12, output_tokens: 0 },
    });
    assert.equal(first.last_seq, 1);
    const replay = await c.append(id, [userMessage("What is the weather in Paris?")], {
      idempotencyKey: "turn-1",
      usage: { input_tokens: 12, output_tokens: 0 },
    });
    assert.deepEqual(replay, first);
    const openai = await c.append(id, {
      format: "openai",
      messages: [
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: "call_1", type: "function", function: { name: "weather", arguments: '{"city":"Paris"}' } },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: "18°C and sunny" },
      ],
    });
    assert.equal(openai.last_seq, 3);
    assert.equal(c.lastETag(id), '"3"');
  });

  test("load the context in every format, and a 304 for an unchanged ETag", async () => {
    const c = client();
    const id = await conversation(c);
    await c.append(id, [
      userMessage("Weather in Paris?"),
      { role: "assistant", content: null, tool_calls: [{ id: "c1", name: "weather", args: { city: "Paris" } }] },
      { role: "tool", tool_call_id: "c1", content: "18°C" },
      { role: "assistant", content: "It is 18°C." },
    ]);
    const context = await c.loadContext(id);
    assert.equal(context.format, "episodic");
    assert.deepEqual(
      context.messages.map((m) => [m.role, m.seq]),
      [["user", 1], ["assistant", 2], ["tool", 3], ["assistant", 4]],
    );
    const openai = await c.loadContext(id, { format: "openai" });
    assert.equal(openai.messages[1]?.role, "assistant");
    const responses = await c.loadContext(id, { format: "responses" });
    assert.ok(responses.messages.some((item) => "type" in item && item.type === "function_call"));
    const anthropic = await c.loadContext(id, { format: "anthropic" });
    assert.deepEqual(anthropic.messages.map((turn) => turn.role), ["user", "assistant", "user", "assistant"]);
    assert.equal(await c.loadContext(id, { ifNoneMatch: true }), undefined);
    await c.append(id, [userMessage("thanks")]);
    const fresh = await c.loadContext(id, { ifNoneMatch: '"4"' });
    assert.equal(fresh?.last_seq, 5);
  });

  test("events page by page, search, unpin, run completed", async () => {
    const c = client();
    const id = await conversation(c);
    const pinned = await c.append(id, [{ role: "user", content: "Always answer in French.", pinned: true }]);
    for (let i = 0; i < 5; i++) await c.append(id, [userMessage(`error REFUND-E${i} in reconcile.py`)]);
    const page = await c.readEvents(id, { limit: 2 });
    assert.deepEqual(page.events.map((e) => e.seq), [1, 2]);
    assert.equal(page.next_after_seq, 2);
    const all: number[] = [];
    for await (const event of c.events(id, { pageSize: 2 })) all.push(event.seq);
    assert.deepEqual(all, [1, 2, 3, 4, 5, 6]);
    const found = await c.search(id, "REFUND-E3");
    assert.deepEqual(found.events.map((e) => e.seq), [5]);
    const seq = pinned.events[0]?.seq;
    assert.equal(seq, 1);
    const unpinned = await c.unpin(id, 1);
    assert.equal(unpinned.events[0]?.kind, "unpin");
    await c.append(id, [{ role: "assistant", content: null, tool_calls: [{ id: "open", name: "run", args: {} }] }]);
    const completed = await c.markRunCompleted(id);
    const event = completed.events[0];
    assert.ok(event !== undefined && event.kind === "run_completed");
    assert.deepEqual(event.abandoned_tool_call_ids, ["open"]);
  });

  test("the export, streamed as records", async () => {
    const c = client();
    const id = await conversation(c);
    await c.append(id, [userMessage("one"), { role: "assistant", content: "two" }]);
    const records = [];
    for await (const record of c.exportConversation(id)) records.push(record);
    assert.ok(records.length >= 3, JSON.stringify(records));
    const seqs = records.filter((r) => typeof r.seq === "number").map((r) => r.seq);
    assert.deepEqual(seqs, [1, 2]);
  });

  test("operator routes: compaction status, compact now, erase; health", async () => {
    const c = client();
    const id = await conversation(c);
    const filler = "The reconcile job posts some refund entries twice when the worker restarts. ".repeat(6);
    for (let i = 0; i < 6; i++) {
      await c.append(id, [
        userMessage(`step ${i}: look at src/refund/reconcile_${i}.py. ${filler}`),
        { role: "assistant", content: `done ${i}. ${filler}` },
      ]);
    }
    const op = operator();
    const status = await op.compactionStatus({ limit: 5 });
    assert.ok(Array.isArray(status.conversations));
    const run = await op.compactNow(id);
    assert.equal(run.outcome, "succeeded", JSON.stringify(run));
    const context = await c.loadContext(id);
    assert.ok(context.boundary_seq !== null);
    assert.match(String(context.messages[0]?.content), /Session handoff|handoff/i);
    const erased = await op.eraseConversation(id, "test: the user asked");
    assert.equal(erased.conversation_id, id);
    await rejects(c.loadContext(id), NotFoundError, 404);
    assert.deepEqual(await c.healthz(), { status: "ok" });
    assert.deepEqual(await c.readyz(), { status: "ok" });
  });
});

describe("typed errors", () => {
  test("no key, a wrong key: AuthenticationError", async () => {
    await rejects(client({ apiKey: "ep_nope_nope" }).listConversations(), AuthenticationError, 401);
  });

  test("a tenant key on an operator route: OperatorRequiredError", async () => {
    await rejects(client().compactionStatus(), OperatorRequiredError, 403);
  });

  test("an unknown conversation: NotFoundError, with the problem's fields", async () => {
    const error = await rejects(client().getConversation(UNKNOWN), NotFoundError, 404);
    assert.equal(error.problem?.status, 404);
    assert.match(error.message, /GET \/v1\/conversations\/.* -> 404/);
  });

  test("bad input: ValidationError, and nothing written", async () => {
    const c = client();
    const id = await conversation(c);
    // a tool message without its call's id: refused (the types would not compile it either)
    await rejects(c.append(id, { messages: [{ role: "user" } as never] }), ValidationError, 422);
    assert.equal((await c.getConversation(id)).conversation.last_seq, 0);
  });

  test("a result for no call: OrphanToolResultError", async () => {
    const c = client();
    const id = await conversation(c);
    await rejects(
      c.append(id, [{ role: "tool", tool_call_id: "nowhere", content: "x" }]),
      OrphanToolResultError,
      422,
    );
  });

  test("a call id used twice: DuplicateToolCallError, a ToolPairingError", async () => {
    const c = client();
    const id = await conversation(c);
    const call = { id: "same", name: "run", args: {} };
    const error = await rejects(
      c.append(id, [{ role: "assistant", content: null, tool_calls: [call, call] }]),
      DuplicateToolCallError,
      422,
    );
    assert.ok(error instanceof ToolPairingError && error instanceof ValidationError);
  });

  test("the same key for another batch: IdempotencyMismatchError", async () => {
    const c = client();
    const id = await conversation(c);
    await c.append(id, [userMessage("a")], { idempotencyKey: "k" });
    await rejects(c.append(id, [userMessage("b")], { idempotencyKey: "k" }), IdempotencyMismatchError, 422);
  });

  test("a stale If-Match: ConflictError (412), the last seen ETag when asked for", async () => {
    const c = client();
    const id = await conversation(c);
    await c.append(id, [userMessage("a")], { ifMatch: true }); // at "0", as created
    const other = client();
    await other.append(id, [userMessage("from elsewhere")]);
    const error = await rejects(c.append(id, [userMessage("b")], { ifMatch: true }), ConflictError, 412);
    assert.match(error.message, /not the expected 1/);
    await assert.rejects(client().append(UNKNOWN, [userMessage("x")], { ifMatch: true }), TypeError);
  });

  test("the ETag kept is the newest seen; a pop or a clear forgets it", async () => {
    const c = client();
    const id = await conversation(c);
    await c.append(id, [userMessage("a")], { idempotencyKey: "one" });
    await c.append(id, [userMessage("b")]);
    assert.equal(c.lastETag(id), '"2"');
    await c.append(id, [userMessage("a")], { idempotencyKey: "one" }); // replayed: its ETag is "1"
    assert.equal(c.lastETag(id), '"2"');
    await c.retractLast(id);
    assert.equal(c.lastETag(id), undefined);
    await assert.rejects(c.append(id, [userMessage("c")], { ifMatch: true }), TypeError);
    await c.getConversation(id);
    await c.append(id, [userMessage("c")], { ifMatch: true }); // the head's ETag, read again
  });

  test("unpin of a message never pinned: NotPinnedError", async () => {
    const c = client();
    const id = await conversation(c);
    await c.append(id, [userMessage("not pinned")]);
    await rejects(c.unpin(id, 1), NotPinnedError, 422);
  });

  test("an erased id is not re-created by accident: ErasedConversationError", async () => {
    const c = client();
    const id = await conversation(c);
    await c.append(id, [userMessage("forget me")]);
    await operator().eraseConversation(id, "test");
    await rejects(c.append(id, [userMessage("again")]), NotFoundError, 404);
    await rejects(c.createConversation({ conversationId: id }), ErasedConversationError, 409);
  });

  test("a message over the server's limit: MessageTooLargeError", async () => {
    const c = client();
    const id = await conversation(c);
    const limit = Number(process.env.EPISODIC_TEST_MAX_MESSAGE_BYTES);
    assert.ok(limit > 0, "the harness sets EPISODIC_TEST_MAX_MESSAGE_BYTES");
    const error = await rejects(c.append(id, [userMessage("x".repeat(limit + 1))]), MessageTooLargeError, 413);
    assert.ok(error instanceof ValidationError);
    assert.equal((await c.getConversation(id)).conversation.last_seq, 0);
  });

  test("a body that is not JSON: UnsupportedMediaTypeError (a raw request, the client sends JSON)", async () => {
    const id = await conversation();
    const response = await fetch(`${BASE_URL}/v1/conversations/${id}/messages`, {
      method: "POST",
      headers: { Authorization: `Bearer ${API_KEY}`, "Content-Type": "text/plain" },
      body: "hello",
    });
    const error = errorFor(response.status, await response.json(), "POST raw");
    assert.ok(error instanceof UnsupportedMediaTypeError && error instanceof ValidationError);
    assert.equal(error.status, 415);
  });

  test("every error class of episodic.errors has its class here, with the same parent", () => {
    const python = JSON.parse(process.env.EPISODIC_ERROR_PARENTS ?? "{}") as Record<string, string | null>;
    assert.ok(Object.keys(python).length >= 25, "the harness passes episodic.errors' classes");
    for (const [name, parent] of Object.entries(python)) {
      const cls = ERROR_CLASSES[name];
      assert.ok(cls !== undefined, `no ${name} in errors.ts`);
      const parentName = Object.getPrototypeOf(cls).name as string;
      assert.equal(parent === null ? "Error" : parent, parentName, `${name}'s parent`);
      const problem = { type: `https://episodic.dev/errors/${name}`, title: "t", status: 400 };
      assert.equal(errorFor(400, problem, "GET /x").name, name);
    }
    assert.ok(errorFor(405, { detail: "Method Not Allowed" }, "PUT /x") instanceof HttpError);
  });

  test("no server: NetworkError after the retries a read is allowed", async () => {
    const c = new EpisodicClient({ baseUrl: "http://127.0.0.1:9", apiKey: "k", retries: 2, backoffMs: 1 });
    await rejects(c.healthz(), NetworkError, 0);
  });
});

describe("retries", () => {
  test("an append whose answer is lost is retried under its key and lands once", async () => {
    const c = client();
    const id = await conversation(c);
    // every other append's answer is withheld after the server wrote it
    const proxy = new CuttingProxy((head, index) => head.startsWith("POST") && index % 2 === 0);
    const through = client({ baseUrl: await proxy.start() });
    try {
      const turns = 20;
      for (let i = 0; i < turns; i++) {
        const appended = await through.append(id, [userMessage(`turn ${i}`)]);
        assert.equal(appended.last_seq, i + 1);
      }
      assert.equal(proxy.cutCount, turns);
      const texts: string[] = [];
      for await (const event of c.events(id)) {
        if (event.kind === "message") texts.push(String(event.message.content));
      }
      // 0 lost, 0 doubled: each turn once, in order
      assert.deepEqual(texts, Array.from({ length: turns }, (_, i) => `turn ${i}`));
    } finally {
      await proxy.stop();
    }
  });

  test("a POST other than an append is not retried after a lost answer", async () => {
    const c = client();
    const id = await conversation(c);
    await c.append(id, [{ role: "assistant", content: null, tool_calls: [{ id: "x", name: "run", args: {} }] }]);
    const proxy = new CuttingProxy((head) => head.includes("/run-completed"));
    const through = client({ baseUrl: await proxy.start() });
    try {
      await rejects(through.markRunCompleted(id), NetworkError, 0);
      assert.equal(proxy.seen.filter((h) => h.includes("/run-completed")).length, 1);
      assert.equal((await c.getConversation(id)).conversation.last_seq, 2); // it did land, once
    } finally {
      await proxy.stop();
    }
  });

  test("a 503 with Retry-After is waited out, then retried", async () => {
    let calls = 0;
    const fake: typeof fetch = async () => {
      calls++;
      if (calls === 1) {
        return new Response(
          JSON.stringify({ type: "https://episodic.dev/errors/OverloadedError", title: "Service Unavailable", status: 503 }),
          { status: 503, headers: { "Retry-After": "0", "Content-Type": "application/problem+json" } },
        );
      }
      return new Response(JSON.stringify({ conversation: { conversation_id: "c" }, pressure: {} }), { status: 201 });
    };
    const c = new EpisodicClient({ baseUrl: "http://example.invalid", apiKey: "k", fetch: fake });
    await c.createConversation(); // a shed request never reached the store: safe to resend
    assert.equal(calls, 2);
    const refusing: typeof fetch = async () =>
      new Response(JSON.stringify({ type: "https://episodic.dev/errors/OverloadedError", title: "t", status: 503 }), {
        status: 503,
        headers: { "Retry-After": "0" },
      });
    const shed = new EpisodicClient({ baseUrl: "http://example.invalid", apiKey: "k", fetch: refusing, retries: 1 });
    await rejects(shed.healthz(), OverloadedError, 503);
    assert.equal(retryAfterMs("2"), 2000);
    assert.equal(retryAfterMs(null), undefined);
  });
});
