/** EpisodicSession under the real `@openai/agents` Runner, with a scripted model (the SDK's
 * `Model` interface: no network) calling a tool every turn, over many turns, while the worker
 * (`episodic worker`, started by the harness) compacts the conversation in between. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Agent, type AgentInputItem, type Model, type ModelRequest, type ModelResponse, Runner, tool, Usage } from "@openai/agents-core";

import { EpisodicSession, sessionConversationId, withoutOrphanOutputs } from "../src/openai-agents.js";
import { client, waitForBoundary } from "./support.js";

const FILLER = "The nightly reconcile job posts refund entries twice after a worker restart. ".repeat(4);

/** A model that calls `lookup` for each new user message and answers once it has the result. */
class ScriptedModel implements Model {
  readonly inputs: AgentInputItem[][] = [];
  #calls = 0;

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const input = typeof request.input === "string" ? [{ role: "user", content: request.input } as AgentInputItem] : request.input;
    this.inputs.push(input);
    const last = input[input.length - 1] as { type?: string; role?: string; content?: unknown; output?: unknown };
    const usage = new Usage({ requests: 1, inputTokens: 100, outputTokens: 20, totalTokens: 120 });
    if (last.type === "function_call_result") {
      const text = `Done: ${JSON.stringify(last.output).slice(0, 40)}. ${FILLER}`;
      return {
        usage,
        output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text }] }],
      };
    }
    this.#calls++;
    const ticket = `REFUND-${1000 + this.#calls}`;
    return {
      usage,
      output: [
        { type: "function_call", callId: `call_${this.#calls}`, name: "lookup", arguments: JSON.stringify({ ticket }), status: "completed" },
      ],
    };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("the scripted model does not stream");
  }
}

const lookup = tool({
  name: "lookup",
  description: "Look a refund ticket up",
  parameters: {
    type: "object",
    properties: { ticket: { type: "string" } },
    required: ["ticket"],
    additionalProperties: false,
  },
  strict: true,
  execute: async (input: unknown) => `ticket ${(input as { ticket: string }).ticket}: posted twice at 02:00. ${FILLER}`,
});

function agentAndRunner(model: ScriptedModel): { agent: Agent; runner: Runner } {
  const agent = new Agent({ name: "refunds", instructions: "Fix the refund job.", tools: [lookup] });
  const runner = new Runner({ modelProvider: { getModel: async () => model }, tracingDisabled: true });
  return { agent, runner };
}

function isHandoff(item: AgentInputItem | undefined): boolean {
  const it = item as { role?: string; content?: unknown } | undefined;
  return it?.role === "user" && typeof it.content === "string" && it.content.includes("Session handoff");
}

describe("@openai/agents Session", () => {
  test("many turns with tool calls, the worker compacting in between", async () => {
    const c = client();
    // this conversation's own trigger: compact after 4 turns (the server's default is 8)
    const session = new EpisodicSession({
      client: c,
      sessionId: `refunds-${crypto.randomUUID()}`,
      tenantId: "acme",
      metadata: { compaction: { trigger_unfinished_turns: 4 } },
    });
    const model = new ScriptedModel();
    const { agent, runner } = agentAndRunner(model);
    const id = await session.conversationId();
    let boundary: number | null = null;
    let boundaries = 0;
    for (let turn = 1; turn <= 12; turn++) {
      const result = await runner.run(agent, `Turn ${turn}: check the refund ticket. ${FILLER}`, { session });
      assert.match(String(result.finalOutput), /^Done: /);
      const items = await session.getItems();
      // every call in view has its result right after it (the SDK saved them together)
      const calls = items.filter((i) => (i as { type?: string }).type === "function_call").length;
      const results = items.filter((i) => (i as { type?: string }).type === "function_call_result").length;
      assert.equal(calls, results);
      for (let limit = 1; limit <= items.length; limit++) {
        const window = await session.getItems(limit);
        assert.ok(window.length <= limit);
        assert.deepEqual(withoutOrphanOutputs(window), window, `an orphan output in the last ${limit}`);
      }
      if (turn % 4 === 0) {
        // the worker's trigger (4 unfinished turns) fires: wait for its boundary
        boundary = await waitForBoundary(c, id, boundary);
        boundaries++;
        const view = await session.getItems();
        assert.ok(isHandoff(view[0]), `the handoff first after a boundary: ${JSON.stringify(view[0])}`);
      }
    }
    assert.ok(boundaries >= 2, `the worker compacted ${boundaries} times`);
    // the model's input after a compaction starts with the handoff, and is bounded
    const last = model.inputs[model.inputs.length - 1]!;
    assert.ok(isHandoff(last[0]), JSON.stringify(last[0]));
    assert.ok(last.length < 12 * 4, `the model saw ${last.length} items, the whole history`);
    // the log keeps every turn: 12 user messages, 12 calls and results, 12 answers
    let messages = 0;
    for await (const event of c.events(id)) if (event.kind === "message") messages++;
    assert.equal(messages, 12 * 4);
  });

  test("items come back as they were added; pop and clear are events", async () => {
    const c = client();
    const session = new EpisodicSession({ client: c, sessionId: `s-${crypto.randomUUID()}`, tenantId: "acme" });
    assert.deepEqual(await session.getItems(), []);
    assert.equal(await session.popItem(), undefined);
    const added: AgentInputItem[] = [
      { role: "user", content: "hello" },
      { type: "function_call", callId: "c1", name: "lookup", arguments: '{"ticket":"T-1"}', status: "completed", id: "fc_1" },
      { type: "function_call_result", callId: "c1", name: "lookup", status: "completed", output: { type: "text", text: "found" } },
      { type: "reasoning", content: [{ type: "input_text", text: "thinking" }], id: "rs_1" },
      { type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "All done." }] },
    ];
    await session.addItems(added);
    assert.deepEqual(await session.getItems(), added);
    assert.deepEqual(await session.getItems(2), added.slice(-2));
    // a window that starts between a call and its result leaves the result out
    assert.deepEqual(await session.getItems(3), added.slice(-2));
    assert.deepEqual(await session.popItem(), added[4]);
    assert.deepEqual(await session.getItems(), added.slice(0, 4));
    await session.clearSession();
    assert.deepEqual(await session.getItems(), []);
    const kinds: string[] = [];
    for await (const event of c.events(await session.conversationId())) kinds.push(event.kind);
    assert.deepEqual(kinds, ["message", "message", "message", "message", "message", "retraction", "clear"]);
  });

  test("the same session id names the Python session's conversation", async () => {
    const expected = JSON.parse(process.env.EPISODIC_SESSION_IDS ?? "[]") as [string, string, string][];
    assert.ok(expected.length > 0, "the harness passes Python's session_conversation_id values");
    for (const [tenant, sessionId, conversationId] of expected) {
      assert.equal(await sessionConversationId(sessionId, tenant), conversationId, `${tenant}/${sessionId}`);
    }
  });
});
