/** EpisodicSessionStore against the SessionStore contracts the Claude Agent SDK documents,
 * with the SDK's own InMemorySessionStore as the oracle: the same calls on both give the same
 * answers (mtimes aside); and the worker's compaction of a transcript's conversation (Claude
 * Code compacts on its own, but the worker may too) changes nothing `load` gives back. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { InMemorySessionStore, type SessionKey, type SessionStoreEntry } from "@anthropic-ai/claude-agent-sdk";

import { EpisodicSessionStore } from "../src/claude-agent-sdk.js";
import { OperatorRequiredError } from "../src/index.js";
import { client, operator, waitForBoundary } from "./support.js";

const FILLER = "The reconcile job posts refund entries twice after a restart. ".repeat(6);

function line(type: string, uuid: string | undefined, text: string, extra: Record<string, unknown> = {}): SessionStoreEntry {
  return {
    type,
    ...(uuid ? { uuid } : {}),
    timestamp: new Date(Date.UTC(2026, 11, 1, 10, 0, Number(uuid?.replace(/\D/g, "") || 0))).toISOString(),
    message: { role: type === "assistant" ? "assistant" : "user", content: [{ type: "text", text }] },
    ...extra,
  };
}

function transcript(turns: number, prefix: string): SessionStoreEntry[] {
  const entries: SessionStoreEntry[] = [line("user", `${prefix}u0`, `Fix the refund job. ${FILLER}`, { cwd: "/repo", isSidechain: false })];
  for (let i = 1; i <= turns; i++) {
    entries.push(line("assistant", `${prefix}a${i}`, `Step ${i}: reading reconcile_${i}.py. ${FILLER}`));
    entries.push(line("user", `${prefix}u${i}`, `Go on with step ${i + 1}. ${FILLER}`));
  }
  return entries;
}

function stores(): { ours: EpisodicSessionStore; oracle: InMemorySessionStore } {
  return { ours: new EpisodicSessionStore({ client: client(), operator: operator() }), oracle: new InMemorySessionStore() };
}

const withoutMtime = <T extends { mtime: number }>(items: T[]): Omit<T, "mtime">[] =>
  items.map(({ mtime: _mtime, ...rest }) => rest);

describe("Claude Agent SDK SessionStore", () => {
  test("append and load: entries back deep-equal, in append order, batch after batch", async () => {
    const { ours, oracle } = stores();
    const key: SessionKey = { projectKey: `/p/${crypto.randomUUID()}`, sessionId: crypto.randomUUID() };
    assert.equal(await ours.load(key), null);
    const entries = transcript(6, "s");
    for (let i = 0; i < entries.length; i += 3) {
      const batch = entries.slice(i, i + 3);
      await ours.append(key, batch);
      await oracle.append(key, batch);
    }
    assert.deepEqual(await ours.load(key), await oracle.load(key));
    assert.deepEqual(await ours.load(key), entries);
  });

  test("a retried batch is stored once; entries without a uuid as they come", async () => {
    const { ours } = stores();
    const key: SessionKey = { projectKey: `/p/${crypto.randomUUID()}`, sessionId: "s" };
    const batch = transcript(2, "r");
    await ours.append(key, batch);
    await ours.append(key, batch); // the SDK retries a batch whose answer it did not see
    await Promise.all([ours.append(key, batch.slice(1)), ours.append(key, batch.slice(2))]);
    const title = { type: "custom-title", customTitle: "Refunds" };
    await ours.append(key, [title]);
    await ours.append(key, [title]);
    assert.deepEqual(await ours.load(key), [...batch, title, title]);
  });

  test("listings, summaries and subkeys answer as the SDK's own store does", async () => {
    const { ours, oracle } = stores();
    const projectKey = `/p/${crypto.randomUUID()}`;
    const before = Date.now();
    for (const sessionId of ["one", "two"]) {
      const key = { projectKey, sessionId };
      await ours.append(key, transcript(2, sessionId));
      await oracle.append(key, transcript(2, sessionId));
      const title = [{ type: "custom-title", customTitle: `Title ${sessionId}` }];
      await ours.append(key, title);
      await oracle.append(key, title);
      const sub = { projectKey, sessionId, subpath: "subagents/agent-1" };
      await ours.append(sub, [line("user", `${sessionId}-sub`, "a subagent's prompt")]);
      await oracle.append(sub, [line("user", `${sessionId}-sub`, "a subagent's prompt")]);
    }
    const sort = <T extends { sessionId: string }>(items: T[]) => [...items].sort((a, b) => a.sessionId.localeCompare(b.sessionId));
    const listed = sort(await ours.listSessions(projectKey));
    assert.deepEqual(withoutMtime(listed), withoutMtime(sort(await oracle.listSessions(projectKey))));
    for (const session of listed) assert.ok(session.mtime >= before - 5_000 && session.mtime <= Date.now() + 5_000);
    const summaries = sort(await ours.listSessionSummaries(projectKey));
    assert.deepEqual(withoutMtime(summaries), withoutMtime(sort(await oracle.listSessionSummaries(projectKey))));
    assert.equal(summaries[0]?.data.customTitle, "Title one");
    // a summary's mtime is its session's listed mtime: one clock, one write
    assert.deepEqual(summaries.map((s) => s.mtime), listed.map((s) => s.mtime));
    assert.deepEqual(await ours.listSubkeys({ projectKey, sessionId: "one" }), ["subagents/agent-1"]);
  });

  test("delete erases the transcript and its subagents' (an operator key's erasure)", async () => {
    const { ours } = stores();
    const projectKey = `/p/${crypto.randomUUID()}`;
    const key = { projectKey, sessionId: "gone" };
    const sub = { ...key, subpath: "subagents/a" };
    await ours.append(key, transcript(1, "d"));
    await ours.append(sub, [line("user", "d-sub", "x")]);
    const tenantOnly = new EpisodicSessionStore({ client: client() });
    await assert.rejects(tenantOnly.delete(key), OperatorRequiredError);
    await ours.delete(key);
    assert.equal(await ours.load(key), null);
    assert.equal(await ours.load(sub), null);
    assert.deepEqual(await ours.listSessions(projectKey), []);
    await ours.delete({ projectKey, sessionId: "never-written" }); // nothing to delete
  });

  test("the worker compacting the transcript's conversation changes nothing load gives back", async () => {
    const { ours } = stores();
    const sessionId = crypto.randomUUID();
    const key = { projectKey: `/p/${crypto.randomUUID()}`, sessionId };
    // ends with the assistant's answer: the run is at rest, the worker may cut through it all
    const entries = [...transcript(12, "c"), line("assistant", "c-end", `All fixed. ${FILLER}`)];
    await ours.append(key, entries);
    const c = client();
    const page = await c.listConversations({ limit: 1000 });
    const found = page.items.find(
      (item) => (item.metadata.claude_agent as { session_id?: string } | undefined)?.session_id === sessionId,
    );
    assert.ok(found, "the transcript's conversation is listed");
    // 13 user turns: past the server's trigger (8 unfinished turns), the worker compacts it
    await waitForBoundary(c, found.conversation_id, null);
    assert.deepEqual(await ours.load(key), entries);
    const after = line("user", "c-after", "after the compaction");
    await ours.append(key, [after]);
    assert.deepEqual(await ours.load(key), [...entries, after]);
  });
});
