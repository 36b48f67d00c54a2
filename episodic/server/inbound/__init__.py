"""What an append's body may be: a batch in episodic's own format, or in OpenAI's
chat-completions, OpenAI's Responses or Anthropic's Messages format (each a module here),
converted into episodic's messages on the way in."""

from episodic.server.inbound.append import (
    APPEND_FORMATS,
    AppendFormat,
    AppendRequest,
    ReadAppend,
    read_append,
)
from episodic.server.inbound.document import document_requests

__all__ = [
    "APPEND_FORMATS",
    "AppendFormat",
    "AppendRequest",
    "ReadAppend",
    "document_requests",
    "read_append",
]
