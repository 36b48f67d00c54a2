/**
 * The Vercel AI SDK (`ai`): a conversation as the SDK's `ModelMessage[]`, and what a
 * `generateText` / `streamText` call produced saved back, so `onFinish` is one line:
 *
 *   const chat = new EpisodicChat({ client, conversationId });
 *   await chat.add([{ role: "user", content: prompt }]);
 *   const result = streamText({ model, messages: await chat.messages(), onFinish: chat.onFinish });
 *
 * `messages()` is the context (`GET .../context`): after the worker's boundary, the handoff
 * and the retained user messages first, then every message after its cut, each tool call
 * followed by its results (a call that never got one gets an error result, so the provider
 * never refuses the history). Each `ModelMessage` saved is kept whole in the log (its
 * `native` payload) and comes back as it was; its meaning is in episodic's fields too, so a
 * handoff, a search and a context in another format read it. Saves are appends under an
 * Idempotency-Key: a lost answer is retried and lands once.
 */

import type { LanguageModelUsage, ModelMessage } from "ai";

import type { Appended, EpisodicClient, Message, NewMessage, NewUsage } from "./client.js";
import { NotFoundError } from "./errors.js";
import { appendToSession } from "./sessions.js";
import { messageText } from "./text.js";

/** The `native` protocol of a message this module stored. */
export const MESSAGE_PROTOCOL = "ai-sdk";

export interface EpisodicChatOptions {
  client: EpisodicClient;
  conversationId: string;
}

/** What `onFinish` (or `await result`) hands over: the messages a call added, and its usage. */
export interface FinishedCall {
  response: { messages: ModelMessage[] };
  totalUsage?: LanguageModelUsage;
  usage?: LanguageModelUsage;
}

export class EpisodicChat {
  readonly client: EpisodicClient;
  readonly conversationId: string;

  constructor(options: EpisodicChatOptions) {
    this.client = options.client;
    this.conversationId = options.conversationId;
  }

  /** The context as `ModelMessage[]` (empty for a conversation never written). */
  async messages(): Promise<ModelMessage[]> {
    try {
      const context = await this.client.loadContext(this.conversationId);
      return modelMessagesOf(context.messages);
    } catch (error) {
      if (error instanceof NotFoundError) return [];
      throw error;
    }
  }

  /** Append messages (the user's turn, say), in one batch; the conversation is made by the
   * first write. */
  async add(messages: ModelMessage[], usage?: LanguageModelUsage): Promise<Appended | undefined> {
    if (messages.length === 0) return undefined;
    return appendToSession(this.client, this.conversationId, messages.flatMap(storedMessagesOf), {
      ...(usage ? { usage: usageOf(usage) } : {}),
    });
  }

  /** Save what a call produced: its response messages, with its usage (the provider's count,
   * which the compaction trigger weighs). */
  async save(call: FinishedCall): Promise<Appended | undefined> {
    // the last step's usage: its input tokens are the context the model last saw, which is
    // what the pressure weighs (totalUsage sums every step of a tool loop)
    return this.add(call.response.messages, call.usage ?? call.totalUsage);
  }

  /** `save`, bound, for the SDK's `onFinish` (which the SDK awaits):
   * `streamText({ ..., onFinish: chat.onFinish })`. */
  readonly onFinish = async (call: FinishedCall): Promise<void> => {
    await this.save(call);
  };
}

// ---- ModelMessage <-> episodic messages --------------------------------------------------

type Part = { type: string; [field: string]: unknown };

/** A ModelMessage as the log's messages: one, except a tool message, which is one per result
 * (episodic's tool messages answer one call each). The ModelMessage is kept whole in the first;
 * the others say where they belong. */
export function storedMessagesOf(message: ModelMessage): NewMessage[] {
  const data = JSON.parse(JSON.stringify(message)) as Record<string, unknown>;
  const native = { protocol: MESSAGE_PROTOCOL, data };
  switch (message.role) {
    case "system":
      return [{ role: "system", content: message.content, native }];
    case "user":
      return [{ role: "user", content: textOf(message.content), native }];
    case "assistant": {
      const parts: Part[] = typeof message.content === "string" ? [{ type: "text", text: message.content }] : (message.content as Part[]);
      // a provider-executed call (a hosted web search) has its result in this message: it
      // is no call waiting for a tool message, so it stays in the saved message only
      const calls = parts
        .filter((part) => part.type === "tool-call" && part.providerExecuted !== true)
        .map((part) => ({ id: String(part.toolCallId), name: String(part.toolName), args: argsOf(part.input) }));
      const reasoning = parts
        .filter((part) => part.type === "reasoning")
        .map((part) => String(part.text))
        .join("\n");
      return [
        {
          role: "assistant",
          content: textOf(parts) || (calls.length ? null : ""),
          ...(calls.length ? { tool_calls: calls } : {}),
          ...(reasoning ? { reasoning } : {}),
          native,
        },
      ];
    }
    case "tool": {
      const results = (message.content as Part[]).filter((part) => part.type === "tool-result");
      return results.map((part, index) => ({
        role: "tool" as const,
        tool_call_id: String(part.toolCallId),
        name: String(part.toolName),
        content: outputText(part.output),
        is_error: isErrorOutput(part.output),
        native: index === 0 ? native : { protocol: MESSAGE_PROTOCOL, data: { part_of: "tool", index } },
      }));
    }
  }
}

/** The context's messages as ModelMessages: a message this module stored, as it was saved;
 * any other (the handoff, the retained user messages, a synthetic result, what another client
 * appended) as the ModelMessage that says the same. */
export function modelMessagesOf(messages: Message[]): ModelMessage[] {
  const out: ModelMessage[] = [];
  for (const message of messages) {
    const native = message.native;
    if (native?.protocol === MESSAGE_PROTOCOL) {
      if ("role" in native.data) out.push(native.data as unknown as ModelMessage);
      continue; // a tool message's later results: in the ModelMessage its first one holds
    }
    out.push(modelMessageOf(message));
  }
  return out;
}

function modelMessageOf(message: Message): ModelMessage {
  const text = messageText(message);
  switch (message.role) {
    case "system":
      return { role: "system", content: text };
    case "user":
      return { role: "user", content: text };
    case "tool":
      return {
        role: "tool",
        content: [
          {
            type: "tool-result",
            toolCallId: message.tool_call_id ?? "",
            toolName: message.name ?? "",
            output: message.is_error ? { type: "error-text", value: text } : { type: "text", value: text },
          },
        ],
      };
    default: {
      const calls = (message.tool_calls ?? []).map((call) => ({
        type: "tool-call" as const,
        toolCallId: call.id,
        toolName: call.name,
        input: call.arguments_json !== null && call.arguments_json !== undefined ? call.arguments_json : (call.args ?? {}),
      }));
      if (calls.length === 0) return { role: "assistant", content: text };
      return { role: "assistant", content: [...(text ? [{ type: "text" as const, text }] : []), ...calls] };
    }
  }
}

/** The SDK's usage as episodic's (the fields it has). */
export function usageOf(usage: LanguageModelUsage): NewUsage {
  const out: NewUsage = {};
  if (usage.inputTokens !== undefined) out.input_tokens = usage.inputTokens;
  if (usage.outputTokens !== undefined) out.output_tokens = usage.outputTokens;
  const cached = usage.inputTokenDetails?.cacheReadTokens;
  if (cached !== undefined) out.cache_read_tokens = cached;
  const reasoning = usage.outputTokenDetails?.reasoningTokens;
  if (reasoning !== undefined) out.reasoning_tokens = reasoning;
  return out;
}

function argsOf(input: unknown): Record<string, unknown> {
  return typeof input === "object" && input !== null && !Array.isArray(input) ? (input as Record<string, unknown>) : { input };
}

function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return (content as Part[])
    .filter((part) => part.type === "text")
    .map((part) => String(part.text))
    .join("\n");
}

function outputText(output: unknown): string {
  const out = output as { type?: string; value?: unknown } | undefined;
  if (out === undefined) return "";
  if (out.type === "text" || out.type === "error-text") return String(out.value);
  return JSON.stringify(out.value ?? out);
}

function isErrorOutput(output: unknown): boolean {
  const type = (output as { type?: string } | undefined)?.type;
  return type === "error-text" || type === "error-json";
}
