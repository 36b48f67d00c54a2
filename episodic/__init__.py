"""episodic: a durable, append-only episodic history for AI-agent conversations.

Append every message as it happens; a compaction worker appends summary boundaries; the next
request loads ``[handoff summary, retained user messages, everything after the boundary]``.
Nothing in the log is ever rewritten or deleted.
"""

from episodic.context import Context
from episodic.errors import (
    ConfigurationError,
    ConflictError,
    ConversationDeletedError,
    DatabaseUnavailableError,
    DuplicateToolCallError,
    EpisodicError,
    ErasedConversationError,
    ErasureDeniedError,
    IdempotencyMismatchError,
    ImportFormatError,
    IntegrityViolationError,
    LeaseLostError,
    LockTimeoutError,
    MessageTooLargeError,
    NotFoundError,
    NotPinnedError,
    OrphanToolResultError,
    SchemaNotMigratedError,
    StorageFullError,
    TenantDeniedError,
    ToolPairingError,
    TransientDatabaseError,
    UnsafeCutError,
    ValidationError,
)
from episodic.formats.openai_chat import messages_from_openai
from episodic.models import (
    BoundaryEvent,
    ClearEvent,
    Conversation,
    DeletionEvent,
    ImageBlock,
    Message,
    MessageEvent,
    RetractionEvent,
    RunCompletedEvent,
    StateChange,
    StateEvent,
    StoredEvent,
    TextBlock,
    ToolCall,
    UnpinEvent,
    Usage,
    UsageEvent,
)
from episodic.policy import (
    EpisodicCompactionConfig,
    EpisodicCompactionPressure,
    EpisodicCompactionTrigger,
    episodic_compaction_trigger,
)
from episodic.settings import EpisodicSettings
from episodic.store import EpisodicStore
from episodic.store.attempts import (
    AttemptEnd,
    AttemptOutcome,
    AttemptRecord,
    Claim,
    CompactionQueueEntry,
    CompactionStatus,
)
from episodic.store.boundaries import BoundaryRequest
from episodic.store.erasure import Erasure
from episodic.store.migrate import SchemaMigration
from episodic.store.state import StateSnapshot
from episodic.store.transfer import ImportedConversation, ImportSummary
from episodic.tokens import CharHeuristic, TiktokenEstimator, TokenEstimator

#: The package's version (the wheel's, read by the build from this line).
__version__ = "0.1.0"

__all__ = [
    "AttemptEnd",
    "AttemptOutcome",
    "AttemptRecord",
    "BoundaryEvent",
    "BoundaryRequest",
    "CharHeuristic",
    "Claim",
    "ClearEvent",
    "CompactionQueueEntry",
    "CompactionStatus",
    "ConfigurationError",
    "ConflictError",
    "Context",
    "Conversation",
    "ConversationDeletedError",
    "DatabaseUnavailableError",
    "DeletionEvent",
    "DuplicateToolCallError",
    "EpisodicCompactionConfig",
    "EpisodicCompactionPressure",
    "EpisodicCompactionTrigger",
    "EpisodicError",
    "EpisodicSettings",
    "EpisodicStore",
    "ErasedConversationError",
    "Erasure",
    "ErasureDeniedError",
    "IdempotencyMismatchError",
    "ImageBlock",
    "ImportFormatError",
    "ImportSummary",
    "ImportedConversation",
    "IntegrityViolationError",
    "LeaseLostError",
    "LockTimeoutError",
    "Message",
    "MessageEvent",
    "MessageTooLargeError",
    "NotFoundError",
    "NotPinnedError",
    "OrphanToolResultError",
    "RetractionEvent",
    "RunCompletedEvent",
    "SchemaMigration",
    "SchemaNotMigratedError",
    "StateChange",
    "StateEvent",
    "StateSnapshot",
    "StorageFullError",
    "StoredEvent",
    "TenantDeniedError",
    "TextBlock",
    "TiktokenEstimator",
    "TokenEstimator",
    "ToolCall",
    "ToolPairingError",
    "TransientDatabaseError",
    "UnpinEvent",
    "UnsafeCutError",
    "Usage",
    "UsageEvent",
    "ValidationError",
    "episodic_compaction_trigger",
    "messages_from_openai",
]
