/**
 * A typed client for `episodic serve`: every route, its types generated from the server's
 * /openapi.json (src/schema.ts), every problem+json a typed error (./errors.ts).
 *
 * Retries are where a retry cannot write twice: a read (GET) is retried on a network error
 * and on 502/503/504; an append is retried so only with an Idempotency-Key, which the client
 * makes (a random UUID) when the caller gives none, so the server replays the first result
 * instead of appending again; any other POST is retried only on the 503 of a shed request
 * (OverloadedError), which never reached the store. A 503's Retry-After is honoured.
 */

import { errorFor, type EpisodicError, NetworkError } from "./errors.js";
import type { components } from "./schema.js";

export type Schemas = components["schemas"];
export type Message = Schemas["Message"];
export type NewMessage = Schemas["NewMessage"];
export type NewUsage = Schemas["NewUsage"];
export type AppendRequest = Schemas["AppendRequest"];
export type Appended = Schemas["Appended"];
export type StoredEvent = Schemas["EventPage"]["events"][number];
export type Conversation = Schemas["Conversation"];
export type ConversationHead = Schemas["ConversationHead"];
export type ConversationPage = Schemas["ConversationPage"];
export type ConversationMetadata = Schemas["ConversationMetadata"];
export type EventPage = Schemas["EventPage"];
export type SearchResults = Schemas["SearchResults"];
export type CompactionStatus = Schemas["CompactionStatus"];
export type CompactionRun = Schemas["CompactionRun"];
export type Erasure = Schemas["Erasure"];
export type SessionView = Schemas["SessionView"];
export type Retracted = Schemas["Retracted"];
export type Cleared = Schemas["Cleared"];

/** The formats a context is served in (and an append may be sent in). */
export type ContextFormat = "episodic" | "openai" | "responses" | "anthropic";
/** A context's messages in each format. */
export interface FormatMessages {
  episodic: Message;
  openai: Schemas["ChatMessage"];
  responses: Schemas["ResponsesItem"];
  anthropic: Schemas["AnthropicTurn"];
}
/** `GET .../context` in format `F`. */
export type LoadedContext<F extends ContextFormat = "episodic"> = Omit<
  Schemas["LoadedContext"],
  "format" | "messages"
> & { format: F; messages: FormatMessages[F][] };

/** One line of `GET .../export` (episodic's export format: a header, the events, the
 * compaction attempts). */
export type ExportRecord = { [key: string]: unknown };

export interface EpisodicClientOptions {
  /** the server, e.g. "http://127.0.0.1:8000" */
  baseUrl: string;
  /** an API key from `episodic keys create` */
  apiKey: string;
  /** retries of a request that may be retried (see the module's comment); default 4 */
  retries?: number;
  /** the first backoff after a network error, doubled each time (with jitter); default 100 ms */
  backoffMs?: number;
  /** the longest wait between attempts, Retry-After included; default 10 s */
  maxDelayMs?: number;
  /** each attempt's timeout; default 30 s */
  timeoutMs?: number;
  /** the fetch to use; default globalThis.fetch */
  fetch?: typeof globalThis.fetch;
}

export interface AppendOptions {
  /** the same key and body: the first result, nothing appended again (made when absent) */
  idempotencyKey?: string;
  /** refuse the append unless the conversation is still at this ETag (412 ConflictError);
   * `true`: the last ETag this client saw for the conversation */
  ifMatch?: string | true;
  /** the provider-reported usage of the model call that produced these messages */
  usage?: NewUsage;
}

export interface LoadContextOptions<F extends ContextFormat> {
  format?: F;
  /** answer `undefined` (a 304) when the context's ETag is still this; `true`: the last
   * ETag this client saw for the conversation */
  ifNoneMatch?: string | true;
}

/** Which failures a request may be retried after: "safe", any network error or 502/503/504
 * (for what cannot write twice); "shed-only", only a 503 the server shed unprocessed. */
export type RetryRule = "safe" | "shed-only";

interface RequestInit {
  query?: Record<string, string | number | undefined>;
  body?: unknown;
  headers?: Record<string, string>;
  retry: RetryRule;
  /** the conversation whose ETag the answer carries */
  conversation?: string;
}

interface Answer<T> {
  status: number;
  body: T;
  headers: Headers;
}

const JSON_TYPE = "application/json";

export class EpisodicClient {
  readonly baseUrl: string;
  readonly #apiKey: string;
  readonly #retries: number;
  readonly #backoffMs: number;
  readonly #maxDelayMs: number;
  readonly #timeoutMs: number;
  readonly #fetch: typeof globalThis.fetch;
  readonly #etags = new Map<string, string>();

  constructor(options: EpisodicClientOptions) {
    if (!options.baseUrl) throw new TypeError("EpisodicClient needs a baseUrl");
    if (!options.apiKey) throw new TypeError("EpisodicClient needs an apiKey (episodic keys create)");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#apiKey = options.apiKey;
    this.#retries = options.retries ?? 4;
    this.#backoffMs = options.backoffMs ?? 100;
    this.#maxDelayMs = options.maxDelayMs ?? 10_000;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** The last ETag an answer gave for the conversation (its last seq, quoted). */
  lastETag(conversationId: string): string | undefined {
    return this.#etags.get(conversationId);
  }

  // ---- conversations -----------------------------------------------------------------

  /** Start a conversation (with your own id, if you give one). */
  async createConversation(
    init: { conversationId?: string; metadata?: ConversationMetadata } = {},
  ): Promise<ConversationHead> {
    const body: Schemas["NewConversation"] = {};
    if (init.conversationId !== undefined) body.conversation_id = init.conversationId;
    if (init.metadata !== undefined) body.metadata = init.metadata;
    const answer = await this.#request<ConversationHead>("POST", "/v1/conversations", {
      body,
      retry: "shed-only",
    });
    this.#remember(answer.body.conversation.conversation_id, answer.headers);
    return answer.body;
  }

  /** Conversations, newest first, a page at a time. */
  async listConversations(options: { limit?: number; before?: string } = {}): Promise<ConversationPage> {
    return (
      await this.#request<ConversationPage>("GET", "/v1/conversations", {
        query: { limit: options.limit, before: options.before },
        retry: "safe",
      })
    ).body;
  }

  /** The head (counters, compaction state) and the compaction pressure. */
  async getConversation(conversationId: string): Promise<ConversationHead> {
    return (
      await this.#request<ConversationHead>("GET", `/v1/conversations/${enc(conversationId)}`, {
        retry: "safe",
        conversation: conversationId,
      })
    ).body;
  }

  // ---- the log -----------------------------------------------------------------------

  /**
   * Append a batch atomically: `messages` in episodic's format, or a whole request body in
   * any format the server takes (`{format: "openai", messages: [...]}`, ...). Retried on a
   * network error or a 503 under its Idempotency-Key, so it lands once.
   */
  async append(
    conversationId: string,
    messages: NewMessage[] | AppendRequest,
    options: AppendOptions = {},
  ): Promise<Appended> {
    const body: AppendRequest = Array.isArray(messages) ? { messages } : { ...messages };
    if (options.usage !== undefined) body.usage = options.usage;
    const headers: Record<string, string> = {
      "Idempotency-Key": options.idempotencyKey ?? crypto.randomUUID(),
    };
    const ifMatch = this.#tag(conversationId, options.ifMatch, "ifMatch");
    if (ifMatch !== undefined) headers["If-Match"] = ifMatch;
    const answer = await this.#request<Appended>(
      "POST",
      `/v1/conversations/${enc(conversationId)}/messages`,
      { body, headers, retry: "safe", conversation: conversationId },
    );
    return answer.body;
  }

  /** Stop carrying a pinned user message (its seq) in later handoffs. */
  async unpin(conversationId: string, seq: number): Promise<Appended> {
    return (
      await this.#request<Appended>("POST", `/v1/conversations/${enc(conversationId)}/unpin`, {
        body: { seq },
        retry: "shed-only",
        conversation: conversationId,
      })
    ).body;
  }

  /** Record that an agent run ended: calls still waiting for a result are closed. */
  async markRunCompleted(conversationId: string): Promise<Appended> {
    return (
      await this.#request<Appended>(
        "POST",
        `/v1/conversations/${enc(conversationId)}/run-completed`,
        { retry: "shed-only", conversation: conversationId },
      )
    ).body;
  }

  /** Take back the newest message in view (a session's pop): the log keeps it, with a
   * retraction; `retracted` is null when none was in view. Not retried after a lost answer:
   * each call takes back one more. */
  async retractLast(conversationId: string): Promise<Retracted> {
    // the conversation moves on and the answer has no ETag: forget the one seen
    this.#etags.delete(conversationId);
    return (
      await this.#request<Retracted>("POST", `/v1/conversations/${enc(conversationId)}/retract-last`, {
        retry: "shed-only",
      })
    ).body;
  }

  /** Empty the view (a session's clear): the log keeps everything, with a clear. */
  async clear(conversationId: string): Promise<Cleared> {
    this.#etags.delete(conversationId); // as retractLast: no ETag comes back
    return (
      await this.#request<Cleared>("POST", `/v1/conversations/${enc(conversationId)}/clear`, {
        retry: "shed-only",
      })
    ).body;
  }

  /** What a framework's session holds: the latest boundary's messages, then the messages in
   * view as they were appended (not composed for a model call). */
  async view(conversationId: string): Promise<SessionView> {
    return (
      await this.#request<SessionView>("GET", `/v1/conversations/${enc(conversationId)}/view`, {
        retry: "safe",
        conversation: conversationId,
      })
    ).body;
  }

  /** The log itself, oldest first, a page at a time. */
  async readEvents(
    conversationId: string,
    options: { afterSeq?: number; limit?: number } = {},
  ): Promise<EventPage> {
    return (
      await this.#request<EventPage>("GET", `/v1/conversations/${enc(conversationId)}/events`, {
        query: { after_seq: options.afterSeq, limit: options.limit },
        retry: "safe",
      })
    ).body;
  }

  /** Every event after `afterSeq`, page after page. */
  async *events(conversationId: string, options: { afterSeq?: number; pageSize?: number } = {}): AsyncGenerator<StoredEvent> {
    let after: number | null = options.afterSeq ?? 0;
    while (after !== null) {
      const page = await this.readEvents(conversationId, {
        afterSeq: after,
        ...(options.pageSize !== undefined ? { limit: options.pageSize } : {}),
      });
      yield* page.events;
      after = page.next_after_seq;
    }
  }

  /** The conversation's messages (tool outputs included) holding the words of `q`. */
  async search(conversationId: string, q: string, options: { limit?: number } = {}): Promise<SearchResults> {
    return (
      await this.#request<SearchResults>("GET", `/v1/conversations/${enc(conversationId)}/search`, {
        query: { q, limit: options.limit },
        retry: "safe",
      })
    ).body;
  }

  /**
   * What the next model call should see: the handoff and retained user messages after a
   * boundary, then everything after its cut. `undefined` when `ifNoneMatch` still holds.
   */
  async loadContext<F extends ContextFormat = "episodic">(
    conversationId: string,
    options: LoadContextOptions<F> & { ifNoneMatch: string | true },
  ): Promise<LoadedContext<F> | undefined>;
  async loadContext<F extends ContextFormat = "episodic">(
    conversationId: string,
    options?: LoadContextOptions<F>,
  ): Promise<LoadedContext<F>>;
  async loadContext<F extends ContextFormat = "episodic">(
    conversationId: string,
    options: LoadContextOptions<F> = {},
  ): Promise<LoadedContext<F> | undefined> {
    const headers: Record<string, string> = {};
    const tag = this.#tag(conversationId, options.ifNoneMatch, "ifNoneMatch");
    if (tag !== undefined) headers["If-None-Match"] = tag;
    const answer = await this.#request<LoadedContext<F> | undefined>(
      "GET",
      `/v1/conversations/${enc(conversationId)}/context`,
      { query: { format: options.format }, headers, retry: "safe", conversation: conversationId },
    );
    return answer.status === 304 ? undefined : answer.body;
  }

  /** The whole log as episodic's export records, streamed line by line (NDJSON). */
  async *exportConversation(conversationId: string): AsyncGenerator<ExportRecord> {
    const path = `/v1/conversations/${enc(conversationId)}/export`;
    const { response, done } = await this.#send("GET", path, { retry: "safe" }, "application/x-ndjson");
    done(); // a long export streams for as long as it takes
    if (response.body === null) return;
    let buffered = "";
    let searched = 0; // where the buffer holds no newline: a long line is scanned once
    const decoder = new TextDecoder();
    try {
      for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
        buffered += decoder.decode(chunk, { stream: true });
        let newline: number;
        while ((newline = buffered.indexOf("\n", searched)) >= 0) {
          const line = buffered.slice(0, newline);
          buffered = buffered.slice(newline + 1);
          searched = 0;
          if (line.trim()) yield JSON.parse(line) as ExportRecord;
        }
        searched = buffered.length;
      }
    } catch (cause) {
      if (cause instanceof SyntaxError) throw cause;
      throw new NetworkError(`GET ${path}: the export was cut: ${describe(cause)}`, `GET ${path}`, { cause });
    }
    buffered += decoder.decode();
    if (buffered.trim()) yield JSON.parse(buffered) as ExportRecord;
  }

  // ---- operations (operator keys) ----------------------------------------------------

  /** The compaction queue and its recent runs (an operator key). */
  async compactionStatus(options: { recent?: number; limit?: number } = {}): Promise<CompactionStatus> {
    return (
      await this.#request<CompactionStatus>("GET", "/v1/compaction", {
        query: { recent: options.recent, limit: options.limit },
        retry: "safe",
      })
    ).body;
  }

  /** Compact the conversation now, due or not (an operator key). */
  async compactNow(conversationId: string): Promise<CompactionRun> {
    return (
      await this.#request<CompactionRun>("POST", `/v1/conversations/${enc(conversationId)}/compact`, {
        retry: "shed-only",
      })
    ).body;
  }

  /** Erase the conversation: its events and attempts go, an audited tombstone stays (an
   * operator key). */
  async eraseConversation(conversationId: string, reason: string): Promise<Erasure> {
    return (
      await this.#request<Erasure>("POST", `/v1/conversations/${enc(conversationId)}/erase`, {
        body: { reason },
        retry: "shed-only",
      })
    ).body;
  }

  /** Liveness: the process answers. */
  async healthz(): Promise<Schemas["Health"]> {
    return (await this.#request<Schemas["Health"]>("GET", "/healthz", { retry: "safe" })).body;
  }

  /** Readiness: the database answers and its schema is current. */
  async readyz(): Promise<Schemas["Health"]> {
    return (await this.#request<Schemas["Health"]>("GET", "/readyz", { retry: "safe" })).body;
  }

  /**
   * A route this client has no method for (the framework modules' routes): JSON in
   * (`params` is a GET's query, a POST's body), JSON out (undefined for a 204), its errors
   * typed. `retry` "safe" only for a request that cannot write twice; by default a GET is,
   * a POST is retried only when the server shed it unprocessed.
   */
  async request<T = unknown>(
    method: "GET" | "POST",
    path: string,
    params: Record<string, unknown> = {},
    retry: RetryRule = method === "GET" ? "safe" : "shed-only",
  ): Promise<T> {
    const init: RequestInit =
      method === "GET"
        ? { query: Object.fromEntries(Object.entries(params).map(([k, v]) => [k, v === undefined ? undefined : String(v)])), retry }
        : { body: params, retry };
    return (await this.#request<T>(method, path, init)).body;
  }

  // ---- the transport -----------------------------------------------------------------

  #tag(conversationId: string, given: string | true | undefined, what: string): string | undefined {
    if (given !== true) return given;
    const seen = this.#etags.get(conversationId);
    if (seen === undefined) {
      throw new TypeError(`${what}: true needs an ETag seen for ${conversationId}; load or append first`);
    }
    return seen;
  }

  /** Keep the newest ETag seen for a conversation (an answer that arrives late, or a replayed
   * append's, carries an older seq and does not move it back). */
  #remember(conversationId: string | undefined, headers: Headers): void {
    const tag = headers.get("etag");
    if (conversationId === undefined || tag === null) return;
    const seen = this.#etags.get(conversationId);
    if (seen === undefined || seqOf(tag) >= seqOf(seen)) this.#etags.set(conversationId, tag);
  }

  async #request<T>(method: string, path: string, init: RequestInit): Promise<Answer<T>> {
    const { response, done } = await this.#send(method, path, init, JSON_TYPE);
    let text: string;
    try {
      text = await response.text();
    } catch (cause) {
      throw new NetworkError(`${method} ${path}: the answer was cut: ${describe(cause)}`, `${method} ${path}`, { cause });
    } finally {
      done();
    }
    this.#remember(init.conversation, response.headers);
    const body = (text ? JSON.parse(text) : undefined) as T;
    return { status: response.status, body, headers: response.headers };
  }

  /** One request, retried as `init.retry` allows; a response that is not 2xx (or a 304)
   * becomes its typed error. The attempt's timeout runs until `done` is called: after the
   * body is read, or (a stream) once its headers have come. */
  async #send(
    method: string,
    path: string,
    init: RequestInit,
    accept: string,
  ): Promise<{ response: Response; done: () => void }> {
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(init.query ?? {})) {
      if (value !== undefined) url.searchParams.set(name, String(value));
    }
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.#apiKey}`,
      Accept: `${accept}, application/problem+json`,
      ...init.headers,
    };
    let payload: string | undefined;
    if (init.body !== undefined) {
      headers["Content-Type"] = JSON_TYPE;
      payload = JSON.stringify(init.body);
    }
    const request = `${method} ${path}`;
    for (let attempt = 0; ; attempt++) {
      let response: Response;
      const controller = new AbortController();
      const timer = setTimeout(() => controller.abort(new Error(`no answer in ${this.#timeoutMs} ms`)), this.#timeoutMs);
      const done = () => clearTimeout(timer);
      try {
        response = await this.#fetch(url, {
          method,
          headers,
          ...(payload !== undefined ? { body: payload } : {}),
          signal: controller.signal,
        });
      } catch (cause) {
        done();
        const error = new NetworkError(`${request} got no answer: ${describe(cause)}`, request, { cause });
        if (init.retry === "safe" && attempt < this.#retries) {
          await sleep(this.#backoff(attempt));
          continue;
        }
        throw error;
      }
      if (response.ok || response.status === 304) return { response, done };
      let text = "";
      try {
        text = await response.text();
      } catch {
        // the error's body was cut: its status still says what it was
      } finally {
        done();
      }
      let parsed: unknown;
      try {
        parsed = text ? JSON.parse(text) : undefined;
      } catch {
        parsed = undefined;
      }
      const error = errorFor(response.status, parsed, request);
      if (attempt < this.#retries && retryable(init.retry, error)) {
        await sleep(this.#delay(attempt, response.headers.get("retry-after")));
        continue;
      }
      throw error;
    }
  }

  #backoff(attempt: number): number {
    const full = Math.min(this.#backoffMs * 2 ** attempt, this.#maxDelayMs);
    return full / 2 + Math.random() * (full / 2);
  }

  #delay(attempt: number, retryAfter: string | null): number {
    const asked = retryAfterMs(retryAfter);
    return asked === undefined ? this.#backoff(attempt) : Math.min(asked, this.#maxDelayMs);
  }
}

function retryable(rule: RetryRule, error: EpisodicError): boolean {
  if (error.name === "OverloadedError") return true; // shed before the store: never written
  return rule === "safe" && (error.status === 502 || error.status === 503 || error.status === 504);
}

/** Retry-After in milliseconds: seconds, or an HTTP date. */
export function retryAfterMs(value: string | null): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** An ETag's seq (`"12"` or `W/"12"`), -1 when it has none. */
function seqOf(tag: string): number {
  const digits = /(\d+)/.exec(tag);
  return digits ? Number(digits[1]) : -1;
}

function enc(segment: string): string {
  return encodeURIComponent(segment);
}

function describe(cause: unknown): string {
  if (cause instanceof Error) {
    const inner = (cause as { cause?: unknown }).cause;
    return inner instanceof Error ? `${cause.message} (${inner.message})` : cause.message;
  }
  return String(cause);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
