/**
 * A `Session` for the OpenAI Agents SDK (`@openai/agents`):
 * `run(agent, input, { session: new EpisodicSession({ client, sessionId }) })`.
 *
 * The same semantics as the Python `EpisodicSession` (episodic/integrations/openai_agents.py),
 * and the same conversation for the same session id and tenant, so both languages share one:
 * - each item added is one message of the log, the item kept whole in its `native` payload,
 *   so `getItems` gives back exactly what was added;
 * - `getItems` is the compacted view (`GET .../view`): after the worker's boundary, the
 *   handoff (a user message) and the retained user messages first, then the items after its
 *   cut as they came; a `limit` window never starts with a call's output whose call it
 *   leaves out;
 * - `popItem` is a retraction and `clearSession` a clear: the log keeps everything, the view
 *   changes;
 * - an append is retried on a lost answer only under its Idempotency-Key (the client's rule),
 *   so a turn is never stored twice.
 */

import type { AgentInputItem, Session } from "@openai/agents-core";

import type { ConversationMetadata, EpisodicClient, Message, NewMessage } from "./client.js";
import { NotFoundError } from "./errors.js";
import { appendToSession } from "./sessions.js";
import { messageText } from "./text.js";
import { uuid5 } from "./uuid.js";

/** The namespace of the conversations session ids name (the Python session's). */
export const SESSION_NAMESPACE = "6f3a1c52-9a43-4f0e-8d7e-5b3f4f0a2e61";
/** The tenant of a store not scoped to one (the Python library's `DEFAULT_TENANT`). */
export const DEFAULT_TENANT = "default";
/** The `native` protocol of an item this session stored. */
export const ITEM_PROTOCOL = "openai-agents-js";

/** The conversation a session id names for a tenant: the Python session's, byte for byte. */
export function sessionConversationId(sessionId: string, tenantId: string = DEFAULT_TENANT): Promise<string> {
  return uuid5(SESSION_NAMESPACE, `${tenantId}\u0000${sessionId}`);
}

export interface EpisodicSessionOptions {
  client: EpisodicClient;
  sessionId: string;
  /** the API key's tenant (`episodic keys create --tenant T`): the conversation is derived
   * from it and the session id, as the Python session derives it */
  tenantId?: string;
  /** the conversation's metadata when the first write makes it (`session_id` is added), e.g.
   * `{ compaction: { trigger_context_tokens: 60000 } }` for a model with a smaller window */
  metadata?: ConversationMetadata;
}

export class EpisodicSession implements Session {
  readonly client: EpisodicClient;
  readonly sessionId: string;
  readonly tenantId: string;
  readonly metadata: ConversationMetadata;
  #conversationId: Promise<string> | undefined;

  constructor(options: EpisodicSessionOptions) {
    if (typeof options.sessionId !== "string") throw new TypeError("sessionId must be a string");
    this.client = options.client;
    this.sessionId = options.sessionId;
    this.tenantId = options.tenantId ?? DEFAULT_TENANT;
    this.metadata = { ...options.metadata, session_id: this.sessionId };
  }

  /** The episodic conversation this session is stored in. */
  conversationId(): Promise<string> {
    this.#conversationId ??= sessionConversationId(this.sessionId, this.tenantId);
    return this.#conversationId;
  }

  async getSessionId(): Promise<string> {
    return this.sessionId;
  }

  /** The compacted view (all of it, or its latest `limit` items), oldest first. */
  async getItems(limit?: number): Promise<AgentInputItem[]> {
    if (limit !== undefined && limit <= 0) return [];
    let messages: Message[];
    try {
      messages = (await this.client.view(await this.conversationId())).messages;
    } catch (error) {
      if (error instanceof NotFoundError) return [];
      throw error;
    }
    const items = messages.flatMap(itemsOf);
    if (limit === undefined || items.length <= limit) return items;
    return withoutOrphanOutputs(items.slice(-limit));
  }

  /** Store the items, in order, in one append (the conversation is made by the first). */
  async addItems(items: AgentInputItem[]): Promise<void> {
    if (items.length === 0) return;
    await appendToSession(this.client, await this.conversationId(), items.map(messageOf), {
      metadata: this.metadata,
    });
  }

  /** Take back the newest item in view and return it (undefined when there is none): a
   * retraction, so the log keeps it. A boundary's handoff is never taken back. */
  async popItem(): Promise<AgentInputItem | undefined> {
    try {
      const { retracted } = await this.client.retractLast(await this.conversationId());
      return retracted ? itemsOf(retracted.message)[0] : undefined;
    } catch (error) {
      if (error instanceof NotFoundError) return undefined;
      throw error;
    }
  }

  /** Empty the view: a clear, so the log keeps everything. */
  async clearSession(): Promise<void> {
    try {
      await this.client.clear(await this.conversationId());
    } catch (error) {
      if (!(error instanceof NotFoundError)) throw error;
    }
  }
}

// ---- items and messages ------------------------------------------------------------------

type Item = AgentInputItem & { type?: string; role?: string };

/** An item as one message of the log: its meaning in episodic's fields (what a handoff, a
 * context in another format and a search read), the item itself kept whole in `native`. */
export function messageOf(item: AgentInputItem): NewMessage {
  const native = { protocol: ITEM_PROTOCOL, data: JSON.parse(JSON.stringify(item)) as Record<string, unknown> };
  const it = item as Item & Record<string, unknown>;
  switch (it.type ?? "message") {
    case "message": {
      const role = it.role;
      const text = textOf(it.content);
      if (role === "user") return { role: "user", content: text, native };
      if (role === "system") return { role: "system", content: text, native };
      return { role: "assistant", content: text, native };
    }
    case "function_call": {
      const args = it.arguments as string;
      return {
        role: "assistant",
        content: null,
        tool_calls: [{ id: it.callId as string, name: it.name as string, ...argsOf(args) }],
        native,
      };
    }
    case "function_call_result":
      return {
        role: "tool",
        tool_call_id: it.callId as string,
        name: it.name as string,
        content: outputText(it.output),
        native,
      };
    case "reasoning":
      return { role: "assistant", content: "", reasoning: textOf(it.content) || null, native };
    default:
      // hosted tools, computer and shell calls, compaction items: kept in the view as they
      // came; a context for another format has nothing to say about them
      return { role: "assistant", content: "", native };
  }
}

/** A message of the view as the items the SDK reads: the item this session stored, as it
 * was; any other message (a handoff, a retained user message, a message another client
 * appended) as the items that say the same. */
export function itemsOf(message: Message): AgentInputItem[] {
  const native = message.native;
  if (native?.protocol === ITEM_PROTOCOL) return [native.data as unknown as AgentInputItem];
  const text = messageText(message);
  switch (message.role) {
    case "user":
      return [{ role: "user", content: text }];
    case "system":
      return [{ role: "system", content: text }];
    case "tool":
      return [
        {
          type: "function_call_result",
          callId: message.tool_call_id ?? "",
          name: message.name ?? "",
          status: "completed",
          output: { type: "text", text },
        },
      ];
    default: {
      const items: AgentInputItem[] = [];
      if (text) {
        items.push({
          type: "message",
          role: "assistant",
          status: "completed",
          content: [{ type: "output_text", text }],
        });
      }
      for (const call of message.tool_calls ?? []) {
        items.push({
          type: "function_call",
          callId: call.id,
          name: call.name,
          arguments: call.arguments_json ?? JSON.stringify(call.args ?? {}),
        });
      }
      return items;
    }
  }
}

/** `items` less the call outputs whose call is not before them in `items` (it fell outside
 * the window): the Responses API refuses an output without its call. */
export function withoutOrphanOutputs(items: AgentInputItem[]): AgentInputItem[] {
  const called = new Set<string>();
  const kept: AgentInputItem[] = [];
  for (const item of items) {
    const it = item as Item & { callId?: string };
    const type = it.type ?? "";
    if (it.callId !== undefined && (type.endsWith("_result") || type.endsWith("_output"))) {
      if (!called.has(it.callId)) continue;
    } else if (it.callId !== undefined) {
      called.add(it.callId);
    }
    kept.push(item);
  }
  return kept;
}

function argsOf(text: string): { args: Record<string, unknown> } | { arguments_json: string } {
  try {
    const parsed: unknown = JSON.parse(text);
    if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) {
      return { args: parsed as Record<string, unknown> };
    }
  } catch {
    // not JSON: kept as the model wrote it
  }
  return { arguments_json: text };
}

function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((part: { type?: string; text?: string; refusal?: string }) => part.text ?? part.refusal ?? "")
    .filter((text) => text !== "")
    .join("\n");
}

function outputText(output: unknown): string {
  if (typeof output === "string") return output;
  if (Array.isArray(output)) return textOf(output);
  if (typeof output === "object" && output !== null && "text" in output) return String(output.text);
  return JSON.stringify(output ?? "");
}
