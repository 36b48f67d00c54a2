/** EpisodicChat under the real Vercel AI SDK: `generateText` and `streamText` with the SDK's
 * own mock model (`ai/test`) calling a tool every turn, over many turns, each turn saved by
 * `onFinish`, while the worker compacts the conversation in between. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import type { LanguageModelV3CallOptions, LanguageModelV3GenerateResult, LanguageModelV3Prompt } from "@ai-sdk/provider";
import { generateText, jsonSchema, type ModelMessage, simulateReadableStream, stepCountIs, streamText, tool } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import { EpisodicChat, modelMessagesOf, storedMessagesOf } from "../src/ai-sdk.js";
import { client, userMessage, waitForBoundary } from "./support.js";

const FILLER = "The nightly reconcile job posts refund entries twice after a worker restart. ".repeat(4);

function usage(input: number, output: number): LanguageModelV3GenerateResult["usage"] {
  return {
    inputTokens: { total: input, noCache: input, cacheRead: 0, cacheWrite: 0 },
    outputTokens: { total: output, text: output, reasoning: 0 },
  };
}

/** Calls `lookup` when the prompt ends with the user's message, answers once it has a result. */
class Script {
  readonly prompts: LanguageModelV3Prompt[] = [];
  calls = 0;

  generate = async (options: LanguageModelV3CallOptions): Promise<LanguageModelV3GenerateResult> => {
    this.prompts.push(options.prompt);
    const last = options.prompt[options.prompt.length - 1]!;
    if (last.role === "tool") {
      return {
        content: [{ type: "text", text: `Fixed it. ${FILLER}` }],
        finishReason: { unified: "stop", raw: "stop" },
        usage: usage(120, 30),
        warnings: [],
      };
    }
    this.calls++;
    return {
      content: [
        { type: "tool-call", toolCallId: `call_${this.calls}`, toolName: "lookup", input: JSON.stringify({ ticket: `REFUND-${this.calls}` }) },
      ],
      finishReason: { unified: "tool-calls", raw: "tool_calls" },
      usage: usage(100, 10),
      warnings: [],
    };
  };
}

const lookup = tool({
  description: "Look a refund ticket up",
  inputSchema: jsonSchema<{ ticket: string }>({
    type: "object",
    properties: { ticket: { type: "string" } },
    required: ["ticket"],
  }),
  execute: async ({ ticket }) => `ticket ${ticket}: posted twice at 02:00. ${FILLER}`,
});

function isHandoff(message: ModelMessage | undefined): boolean {
  return message?.role === "user" && typeof message.content === "string" && message.content.includes("Session handoff");
}

describe("Vercel AI SDK", () => {
  test("generateText turns with a tool, saved by onFinish, the worker compacting in between", async () => {
    const c = client();
    const conversationId = crypto.randomUUID();
    await c.createConversation({ conversationId, metadata: { compaction: { trigger_unfinished_turns: 4 } } });
    const chat = new EpisodicChat({ client: c, conversationId });
    const script = new Script();
    const model = new MockLanguageModelV3({ doGenerate: script.generate });
    let boundary: number | null = null;
    let boundaries = 0;
    for (let turn = 1; turn <= 12; turn++) {
      await chat.add([{ role: "user", content: `Turn ${turn}: check the refund ticket. ${FILLER}` }]);
      const result = await generateText({
        model,
        system: "Fix the refund job.",
        messages: await chat.messages(),
        tools: { lookup },
        stopWhen: stepCountIs(3),
        onFinish: chat.onFinish,
      });
      assert.match(result.text, /^Fixed it\./);
      const messages = await chat.messages();
      assert.equal(messages[messages.length - 1]?.role, "assistant");
      if (turn % 4 === 0) {
        boundary = await waitForBoundary(c, conversationId, boundary);
        boundaries++;
        assert.ok(isHandoff((await chat.messages())[0]), "the handoff first after a boundary");
      }
    }
    assert.ok(boundaries >= 2);
    // the model's prompt after a compaction: the system prompt, then the handoff
    const last = script.prompts[script.prompts.length - 1]!;
    assert.equal(last[0]?.role, "system");
    assert.match(JSON.stringify(last[1]), /Session handoff/);
    // the log holds every turn once: 12 user messages, 12 calls, 12 results, 12 answers
    const roles: string[] = [];
    for await (const event of c.events(conversationId)) if (event.kind === "message") roles.push(event.message.role);
    assert.deepEqual(roles, Array.from({ length: 12 }, () => ["user", "assistant", "tool", "assistant"]).flat());
    // the last step's provider-reported usage reached the head (the trigger weighs the
    // context the model last saw: 120 input tokens, not the tool loop's sum of 220)
    assert.equal((await c.getConversation(conversationId)).conversation.usage_input_tokens, 120);
  });

  test("streamText: onFinish saves the streamed turn", async () => {
    const c = client();
    const chat = new EpisodicChat({ client: c, conversationId: crypto.randomUUID() });
    assert.deepEqual(await chat.messages(), []);
    await chat.add([{ role: "user", content: "stream me an answer" }]);
    const model = new MockLanguageModelV3({
      doStream: async () => ({
        stream: simulateReadableStream({
          chunks: [
            { type: "text-start", id: "t" },
            { type: "text-delta", id: "t", delta: "Streamed " },
            { type: "text-delta", id: "t", delta: "answer." },
            { type: "text-end", id: "t" },
            { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage: usage(10, 3) },
          ],
        }),
      }),
    });
    let saved: Promise<unknown> | undefined;
    const result = streamText({
      model,
      messages: await chat.messages(),
      onFinish: (event) => {
        saved = chat.onFinish(event);
      },
    });
    assert.equal(await result.text, "Streamed answer.");
    await result.consumeStream();
    await saved;
    const messages = await chat.messages();
    assert.equal(messages.length, 2);
    assert.deepEqual(messages[1], { role: "assistant", content: [{ type: "text", text: "Streamed answer." }] });
  });

  test("a ModelMessage comes back as it was saved; others read as ModelMessages", async () => {
    const c = client();
    const chat = new EpisodicChat({ client: c, conversationId: crypto.randomUUID() });
    const saved: ModelMessage[] = [
      { role: "user", content: [{ type: "text", text: "two lookups" }] },
      {
        role: "assistant",
        content: [
          { type: "text", text: "Looking both up." },
          { type: "tool-call", toolCallId: "a", toolName: "lookup", input: { ticket: "A" } },
          { type: "tool-call", toolCallId: "b", toolName: "lookup", input: { ticket: "B" } },
        ],
      },
      {
        role: "tool",
        content: [
          { type: "tool-result", toolCallId: "a", toolName: "lookup", output: { type: "text", value: "A ok" } },
          { type: "tool-result", toolCallId: "b", toolName: "lookup", output: { type: "error-text", value: "B failed" } },
        ],
      },
    ];
    await chat.add(saved);
    assert.deepEqual(await chat.messages(), saved);
    assert.equal(storedMessagesOf(saved[2]!).length, 2);
    // what another client appended (episodic's format) reads as the same ModelMessages
    await c.append(chat.conversationId, [userMessage("from elsewhere")]);
    const context = await c.loadContext(chat.conversationId);
    assert.deepEqual(modelMessagesOf(context.messages.slice(-1)), [{ role: "user", content: "from elsewhere" }]);
    // an unanswered call gets an error result in the context, so no provider refuses it
    await c.append(chat.conversationId, [{ role: "assistant", content: null, tool_calls: [{ id: "c", name: "lookup", args: {} }] }]);
    await c.markRunCompleted(chat.conversationId);
    const messages = await chat.messages();
    const lastMessage = messages[messages.length - 1]!;
    assert.equal(lastMessage.role, "tool");
    assert.equal(JSON.stringify(lastMessage).includes("error-text"), true);
  });
});
