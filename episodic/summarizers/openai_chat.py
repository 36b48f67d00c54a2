"""A summarizer for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama,
LiteLLM, ...), through the ``openai`` package (the ``episodic-store[openai]`` extra).

One request per call, no retries of the SDK's own: the worker owns retries and backoff, and
two retry loops stacked would multiply the attempts and hide them from the attempts ledger.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from episodic.compaction import CompactionRequest
from episodic.errors import ConfigurationError
from episodic.models import Usage
from episodic.summarizers.base import SummarizerError, SummaryResult
from episodic.summarizers.classify import summarizer_error

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.completion_usage import CompletionUsage

logger = logging.getLogger(__name__)

#: Where requests go when no ``base_url`` (and no ``client``) is given: OpenAI itself. Explicit,
#: so the SDK never falls back to ``OPENAI_BASE_URL`` from the environment: configuration comes
#: from episodic's settings. Never silent: the summarizer logs where it sends at INFO, and its
#: errors name the URL.
OPENAI_BASE_URL = "https://api.openai.com/v1"

#: Sent as the key when none is given: keyless local servers ignore it, and the SDK then
#: neither refuses to start nor reads ``OPENAI_API_KEY`` behind the settings' back.
PLACEHOLDER_API_KEY = "no-key"

DEFAULT_SYSTEM_PROMPT = (
    "You write handoff notes that let another agent continue a session after its earlier "
    "messages are removed. Follow the instructions in the user message and reply with the "
    "note only."
)

MaxTokensField = Literal["max_completion_tokens", "max_tokens"]


class OpenAIChatSummarizer:
    """Sends the request prompt as one user message (after a short system message, unless
    ``system_prompt`` is ``None``) and returns the reply's text, usage and model.

    ``timeout`` bounds the whole call, connection included. ``max_output_tokens`` is sent as
    ``max_completion_tokens`` (OpenAI's current name, required by its reasoning models); set
    ``max_tokens_field="max_tokens"`` for servers that only know the older name. A ``client``
    passed in is used with its retries turned off (and ``base_url``, when given, applied to it)
    and is not closed by :meth:`aclose`.

    ``base_url`` is where requests go: the one given, the client's, or :data:`OPENAI_BASE_URL`.
    It is logged once at INFO when the summarizer is created, and every
    :class:`SummarizerError` raised names it and the model, e.g. ``openai-chat:gpt-4.1-mini at
    https://api.openai.com/v1 (model gpt-4.1-mini): HTTP 401 Unauthorized: ...``, so a failing
    compaction says which endpoint failed.

    Errors become :class:`SummarizerError` with ``retryable`` set; an empty or missing content
    is returned as an empty text, for the worker to count as a failure.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        max_tokens_field: MaxTokensField = "max_completion_tokens",
        name: str | None = None,
        client: AsyncOpenAI | None = None,
    ) -> None:
        if not model:
            raise ValueError("model must name the model to ask")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be at least 1, not {max_output_tokens}")
        try:
            from openai import AsyncOpenAI
        except ImportError as exc:
            raise ConfigurationError(
                "OpenAIChatSummarizer needs the openai package; install it with "
                "pip install 'episodic-store[openai]'"
            ) from exc
        self.model = model
        self.name = name or f"openai-chat:{model}"
        self.timeout = timeout
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.max_tokens_field: MaxTokensField = max_tokens_field
        self._owns_client = client is None
        if client is None:
            source = "the base URL given" if base_url else "the default base URL: none was given"
            #: where every request goes (no trailing slash): the URL given, the client's, or
            #: :data:`OPENAI_BASE_URL`
            self.base_url = (base_url or OPENAI_BASE_URL).rstrip("/")
            self._client = AsyncOpenAI(
                api_key=api_key or PLACEHOLDER_API_KEY,
                base_url=self.base_url,
                timeout=timeout,
                max_retries=0,
            )
        elif base_url:
            source = "the base URL given"
            self.base_url = base_url.rstrip("/")
            self._client = client.with_options(max_retries=0, base_url=self.base_url)
        else:
            source = "the client's base URL"
            self._client = client.with_options(max_retries=0)
            self.base_url = str(self._client.base_url).rstrip("/")
        #: how log lines and errors name the endpoint: ``<base_url> (model <model>)``, with any
        #: password or query string in the URL masked
        self.endpoint = f"{redact_url(self.base_url)} (model {self.model})"
        # Once per summarizer, so a deployment's log says where its conversations are sent.
        logger.info(
            "summarizer %s sends to %s, model %s (%s)",
            self.name,
            redact_url(self.base_url),
            self.model,
            source,
        )

    def __repr__(self) -> str:
        return f"OpenAIChatSummarizer(model={self.model!r}, base_url={redact_url(self.base_url)!r})"

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        """One chat-completions call for ``request.prompt``."""
        messages: list[ChatCompletionMessageParam] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": request.prompt})
        try:
            async with asyncio.timeout(self.timeout):
                completion = await self._client.chat.completions.create(
                    model=self.model,
                    messages=messages,
                    timeout=self.timeout,
                    # Options travel in extra_body: the SDK's sentinel for "not sent" changed
                    # name across versions (NOT_GIVEN, omit), a plain dict works in all of them.
                    extra_body=self._options() or None,
                )
        except TimeoutError as exc:
            raise SummarizerError(
                f"{self.name} at {self.endpoint}: no answer within {self.timeout:g} s",
                summarizer=self.name,
                retryable=True,
                endpoint=self.endpoint,
            ) from exc
        except Exception as exc:
            raise summarizer_error(exc, summarizer=self.name, endpoint=self.endpoint) from exc
        if not completion.choices:
            raise SummarizerError(
                f"{self.name} at {self.endpoint}: the response has no choices",
                summarizer=self.name,
                retryable=True,
                endpoint=self.endpoint,
            )
        return SummaryResult(
            text=completion.choices[0].message.content or "",
            usage=usage_from_openai(completion.usage),
            model=completion.model or None,
        )

    async def aclose(self) -> None:
        """Close the HTTP client this summarizer created (a client passed in stays open)."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> OpenAIChatSummarizer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.max_output_tokens is not None:
            options[self.max_tokens_field] = self.max_output_tokens
        if self.temperature is not None:
            options["temperature"] = self.temperature
        return options


def usage_from_openai(usage: CompletionUsage | None) -> Usage | None:
    """A chat-completions usage as an episodic :class:`Usage`: prompt tokens are input, completion
    tokens output, ``prompt_tokens_details.cached_tokens`` cache reads and
    ``completion_tokens_details.reasoning_tokens`` reasoning. Compatible servers that leave a
    field out (or send ``null``) count it as 0."""
    if usage is None:
        return None
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    completion_details = getattr(usage, "completion_tokens_details", None)
    return Usage(
        input_tokens=_count(getattr(usage, "prompt_tokens", None)),
        output_tokens=_count(getattr(usage, "completion_tokens", None)),
        cache_read_tokens=_count(getattr(prompt_details, "cached_tokens", None)),
        reasoning_tokens=_count(getattr(completion_details, "reasoning_tokens", None)),
    )


def redact_url(url: str) -> str:
    """``url`` fit for a log line: a password in it becomes ``***`` and a query string ``?***``
    (some gateways take keys there); anything unparsable is returned as is."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            user = parts.username or ""
            host = netloc.rsplit("@", 1)[1]
            netloc = f"{user}:***@{host}"
    except ValueError:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query="***" if parts.query else ""))


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "OPENAI_BASE_URL",
    "PLACEHOLDER_API_KEY",
    "MaxTokensField",
    "OpenAIChatSummarizer",
    "redact_url",
    "usage_from_openai",
]
