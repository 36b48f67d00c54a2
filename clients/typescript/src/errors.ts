/**
 * The errors the server answers with, as classes named like the Python ones in
 * `episodic.errors` (and with the same parents), so `catch (e) { if (e instanceof
 * ConflictError) ... }` reads as it does in Python. Every problem+json answer becomes the
 * class its `type` names (`https://episodic.dev/errors/ConflictError`); an answer that names
 * no episodic class (a 405, a proxy's 502) is an `HttpError`, and a request that never got an
 * answer a `NetworkError`.
 */

import type { components } from "./schema.js";

/** A problem+json body (RFC 9457), as the server sends it (its schema's `Problem`, and the
 * extension members a problem may carry, such as `field`). */
export type Problem = components["schemas"]["Problem"] & { [extension: string]: unknown };

/** The base of every error the client raises for an answer of the server. */
export class EpisodicError extends Error {
  override name = "EpisodicError";
  /** the HTTP status (0 for a NetworkError) */
  readonly status: number;
  /** the problem+json body, when the server sent one */
  readonly problem: Problem | undefined;
  /** the request's method and path, e.g. "POST /v1/conversations/…/messages" */
  readonly request: string;

  constructor(message: string, init: { status: number; problem?: Problem; request: string }) {
    super(message);
    this.status = init.status;
    this.problem = init.problem;
    this.request = init.request;
  }

  /** the server's request id of a server error (its log has what went wrong under it) */
  get requestId(): string | undefined {
    return this.problem?.request_id ?? undefined;
  }
}

/** Bad input: the message says which field and why. Nothing was written. */
export class ValidationError extends EpisodicError {
  override name = "ValidationError";
}
export class MessageTooLargeError extends ValidationError {
  override name = "MessageTooLargeError";
}
export class ToolPairingError extends ValidationError {
  override name = "ToolPairingError";
}
export class OrphanToolResultError extends ToolPairingError {
  override name = "OrphanToolResultError";
}
export class DuplicateToolCallError extends ToolPairingError {
  override name = "DuplicateToolCallError";
}
export class UnsafeCutError extends ValidationError {
  override name = "UnsafeCutError";
}
export class NotPinnedError extends ValidationError {
  override name = "NotPinnedError";
}
export class UnsupportedMediaTypeError extends ValidationError {
  override name = "UnsupportedMediaTypeError";
}
export class ImportFormatError extends ValidationError {
  override name = "ImportFormatError";
}
/** No such conversation for this key's tenant. */
export class NotFoundError extends EpisodicError {
  override name = "NotFoundError";
}
export class ConversationDeletedError extends NotFoundError {
  override name = "ConversationDeletedError";
}
/** The conversation moved on: a stale If-Match (412), a boundary raced, a duplicate id. */
export class ConflictError extends EpisodicError {
  override name = "ConflictError";
}
export class ErasedConversationError extends ConflictError {
  override name = "ErasedConversationError";
}
/** The same Idempotency-Key (or client id) was used for a different batch. */
export class IdempotencyMismatchError extends EpisodicError {
  override name = "IdempotencyMismatchError";
}
export class TenantDeniedError extends EpisodicError {
  override name = "TenantDeniedError";
}
export class ErasureDeniedError extends EpisodicError {
  override name = "ErasureDeniedError";
}
/** No key, or a key that is unknown or revoked. */
export class AuthenticationError extends EpisodicError {
  override name = "AuthenticationError";
}
/** The route needs an operator key (`episodic keys create --operator`). */
export class OperatorRequiredError extends EpisodicError {
  override name = "OperatorRequiredError";
}
export class ApiKeyNotFoundError extends EpisodicError {
  override name = "ApiKeyNotFoundError";
}
export class LeaseLostError extends EpisodicError {
  override name = "LeaseLostError";
}
/** The database was briefly away: retry (the client already did, where that was safe). */
export class TransientDatabaseError extends EpisodicError {
  override name = "TransientDatabaseError";
}
export class LockTimeoutError extends TransientDatabaseError {
  override name = "LockTimeoutError";
}
export class DatabaseUnavailableError extends TransientDatabaseError {
  override name = "DatabaseUnavailableError";
}
/** The database server is out of disk space: nothing was written; retry once space is freed. */
export class StorageFullError extends TransientDatabaseError {
  override name = "StorageFullError";
}
/** The server shed the request (503 with Retry-After) before it reached the store. */
export class OverloadedError extends EpisodicError {
  override name = "OverloadedError";
}
export class ConfigurationError extends EpisodicError {
  override name = "ConfigurationError";
}
export class CompactionUnavailableError extends ConfigurationError {
  override name = "CompactionUnavailableError";
}
export class SchemaNotMigratedError extends ConfigurationError {
  override name = "SchemaNotMigratedError";
}
export class IntegrityViolationError extends EpisodicError {
  override name = "IntegrityViolationError";
}

/** An answer that names no episodic error: a route that is not there, a proxy's 502. */
export class HttpError extends EpisodicError {
  override name = "HttpError";
}
/** No answer at all: the connection failed or was cut, or the request timed out. */
export class NetworkError extends EpisodicError {
  override name = "NetworkError";
  constructor(message: string, request: string, options?: { cause?: unknown }) {
    super(message, { status: 0, request });
    if (options?.cause !== undefined) {
      Object.defineProperty(this, "cause", { value: options.cause, enumerable: false });
    }
  }
}

type ErrorClass = new (
  message: string,
  init: { status: number; problem?: Problem; request: string },
) => EpisodicError;

/** The classes a problem's `type` can name, by the name it ends with. */
export const ERROR_CLASSES: Readonly<Record<string, ErrorClass>> = Object.freeze({
  EpisodicError,
  ValidationError,
  MessageTooLargeError,
  ToolPairingError,
  OrphanToolResultError,
  DuplicateToolCallError,
  UnsafeCutError,
  NotPinnedError,
  UnsupportedMediaTypeError,
  ImportFormatError,
  NotFoundError,
  ConversationDeletedError,
  ConflictError,
  ErasedConversationError,
  IdempotencyMismatchError,
  TenantDeniedError,
  ErasureDeniedError,
  AuthenticationError,
  OperatorRequiredError,
  ApiKeyNotFoundError,
  LeaseLostError,
  TransientDatabaseError,
  LockTimeoutError,
  DatabaseUnavailableError,
  StorageFullError,
  OverloadedError,
  ConfigurationError,
  CompactionUnavailableError,
  SchemaNotMigratedError,
  IntegrityViolationError,
});

const TYPE_PREFIX = "https://episodic.dev/errors/";

/** The error for an answer that is not 2xx: the class its problem names, else HttpError. */
export function errorFor(status: number, body: unknown, request: string): EpisodicError {
  const problem = isProblem(body) ? body : undefined;
  const kind = problem?.type.startsWith(TYPE_PREFIX)
    ? problem.type.slice(TYPE_PREFIX.length)
    : undefined;
  const cls = (kind !== undefined && Object.hasOwn(ERROR_CLASSES, kind)
    ? ERROR_CLASSES[kind]
    : undefined) ?? HttpError;
  const detail = problem?.detail ?? problem?.title ?? `HTTP ${status}`;
  return new cls(`${detail} (${request} -> ${status})`, {
    status,
    request,
    ...(problem !== undefined ? { problem } : {}),
  });
}

function isProblem(body: unknown): body is Problem {
  return (
    typeof body === "object" &&
    body !== null &&
    typeof (body as { type?: unknown }).type === "string" &&
    typeof (body as { status?: unknown }).status === "number"
  );
}
