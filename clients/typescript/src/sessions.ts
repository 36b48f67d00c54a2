import type { Appended, ConversationMetadata, EpisodicClient, NewMessage, NewUsage } from "./client.js";
import { ConflictError, ErasedConversationError, NotFoundError } from "./errors.js";

/**
 * Append a session's batch, making its conversation on the first write (the TypeScript
 * twin of the Python sessions' `create_session_conversation`): one Idempotency-Key across
 * the attempt and the retry after the create, so the batch lands once; an erased session
 * stays erased; a concurrent first write that made the conversation meanwhile is no error.
 */
export async function appendToSession(
  client: EpisodicClient,
  conversationId: string,
  messages: NewMessage[],
  options: { usage?: NewUsage; metadata?: ConversationMetadata } = {},
): Promise<Appended> {
  const append = { idempotencyKey: crypto.randomUUID(), ...(options.usage ? { usage: options.usage } : {}) };
  try {
    return await client.append(conversationId, messages, append);
  } catch (error) {
    if (!(error instanceof NotFoundError)) throw error;
  }
  try {
    await client.createConversation({
      conversationId,
      ...(options.metadata ? { metadata: options.metadata } : {}),
    });
  } catch (error) {
    if (error instanceof ErasedConversationError || !(error instanceof ConflictError)) throw error;
  }
  return await client.append(conversationId, messages, append);
}
