/**
 * A `SessionStore` for the Claude Agent SDK (`@anthropic-ai/claude-agent-sdk`):
 * `query({ prompt, options: { sessionStore: new EpisodicSessionStore({ client }) } })`.
 *
 * The server's `/v1/claude-agent` routes run the Python `EpisodicSessionStore` behind each
 * call, so both languages share one store: a key names the same conversation, `load` gives
 * the entries back deep-equal to what either appended, an entry's `uuid` is stored once (a
 * retried or doubled batch is written once), listings and subpaths are the same. `delete` is
 * the audited erasure (the main transcript's subagent transcripts too), which over HTTP needs
 * an operator key.
 *
 * The session summary is the TypeScript SDK's own (`foldSessionSummary`, whose format the
 * Python fold does not write), kept apart from the Python SDK's: an append reads it and the
 * seq the session is at, folds this batch into it, and writes entries and summary together
 * only if the session is still at that seq; when another append won (a 412), it folds again.
 */

import {
  foldSessionSummary,
  type SessionKey,
  type SessionStore,
  type SessionStoreEntry,
  type SessionSummaryEntry,
} from "@anthropic-ai/claude-agent-sdk";

import type { EpisodicClient } from "./client.js";
import { ConflictError, ErasedConversationError } from "./errors.js";

/** How many times an append folds again after losing a race for the same session. */
export const MAX_FOLD_ATTEMPTS = 50;

export interface EpisodicSessionStoreOptions {
  client: EpisodicClient;
  /** a client with an operator key, for `delete` (an erasure); without it, `delete` uses
   * `client` and a tenant key is refused with OperatorRequiredError */
  operator?: EpisodicClient;
}

type Key = { project_key: string; session_id: string; subpath?: string };
type Summary = { summary: Record<string, unknown> | null; at_seq: number | null };

export class EpisodicSessionStore implements SessionStore {
  readonly client: EpisodicClient;
  readonly operator: EpisodicClient;

  constructor(options: EpisodicSessionStoreOptions) {
    this.client = options.client;
    this.operator = options.operator ?? options.client;
  }

  /** Mirror a batch of transcript entries, in order; an entry whose `uuid` the key holds is
   * not stored again. */
  async append(key: SessionKey, entries: SessionStoreEntry[]): Promise<void> {
    const body = wire(key);
    if (key.subpath) {
      await this.client.request("POST", "/v1/claude-agent/entries", { key: body, entries });
      return;
    }
    for (let attempt = 0; attempt < MAX_FOLD_ATTEMPTS; attempt++) {
      const { summary, at_seq } = await this.client.request<Summary>("GET", "/v1/claude-agent/summary", body);
      const previous = summary ? (summary as unknown as SessionSummaryEntry) : undefined;
      const folded = foldSessionSummary(previous, key, entries);
      try {
        // written only at the seq the summary was read at. Not resent after a lost answer:
        // an entry without a uuid (a title) would be stored twice; the SDK retries a batch.
        await this.client.request("POST", "/v1/claude-agent/entries", {
          key: body,
          entries,
          summary: folded,
          at_seq,
        });
        return;
      } catch (error) {
        if (!(error instanceof ConflictError) || error instanceof ErasedConversationError) throw error;
        // another append to the session won: fold on top of it
      }
    }
    throw new ConflictError(`appends to session ${key.sessionId} kept racing this one; retry the batch`, {
      status: 409,
      request: "POST /v1/claude-agent/entries",
    });
  }

  /** The key's entries as appended, oldest first; null for a key never written. */
  async load(key: SessionKey): Promise<SessionStoreEntry[] | null> {
    const { entries } = await this.client.request<{ entries: SessionStoreEntry[] | null }>(
      "GET",
      "/v1/claude-agent/entries",
      wire(key),
    );
    return entries;
  }

  /** The project's main transcripts, with their last write in epoch milliseconds. */
  async listSessions(projectKey: string): Promise<Array<{ sessionId: string; mtime: number }>> {
    const { sessions } = await this.client.request<{ sessions: { session_id: string; mtime: number }[] }>(
      "GET",
      "/v1/claude-agent/sessions",
      { project_key: projectKey },
    );
    return sessions.map((session) => ({ sessionId: session.session_id, mtime: session.mtime }));
  }

  /** The summaries this SDK folded for the project's sessions, as it wrote them. */
  async listSessionSummaries(projectKey: string): Promise<SessionSummaryEntry[]> {
    const { summaries } = await this.client.request<{ summaries: SessionSummaryEntry[] }>(
      "GET",
      "/v1/claude-agent/summaries",
      { project_key: projectKey },
    );
    return summaries;
  }

  /** The subpaths (subagent transcripts) written under a session. */
  async listSubkeys(key: { projectKey: string; sessionId: string }): Promise<string[]> {
    const { subkeys } = await this.client.request<{ subkeys: string[] }>("GET", "/v1/claude-agent/subkeys", {
      project_key: key.projectKey,
      session_id: key.sessionId,
    });
    return subkeys;
  }

  /** Erase the key's transcript (a main key's subagent transcripts too), each leaving a
   * tombstone; a key never written is nothing to delete. */
  async delete(key: SessionKey): Promise<void> {
    await this.operator.request("POST", "/v1/claude-agent/delete", { key: wire(key) });
  }
}

function wire(key: SessionKey): Key {
  const out: Key = { project_key: key.projectKey, session_id: key.sessionId };
  if (key.subpath) out.subpath = key.subpath; // "" is the main transcript, as in append
  return out;
}
