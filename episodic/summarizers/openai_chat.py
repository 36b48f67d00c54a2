"""A summarizer for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama,
LiteLLM, ...), through the ``openai`` package (the ``episodic[openai]`` extra).

One request per call, no retries of the SDK's own: the worker owns retries and backoff, and
two retry loops stacked would multiply the attempts and hide them from the attempts ledger.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

from episodic.compaction import CompactionRequest
from episodic.errors import ConfigurationError
from episodic.models import Usage
from episodic.summarizers.base import SummarizerError, SummaryResult
from episodic.summarizers.classify import summarizer_error

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.completion_usage import CompletionUsage

#: Where requests go when no ``base_url`` is given. Explicit, so the SDK never falls back to
#: ``OPENAI_BASE_URL`` from the environment: configuration comes from episodic's settings.
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
    passed in is used with its retries turned off and is not closed by :meth:`aclose`.

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
                "pip install 'episodic[openai]'"
            ) from exc
        self.model = model
        self.name = name or f"openai-chat:{model}"
        self.base_url = base_url or OPENAI_BASE_URL
        self.timeout = timeout
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.max_tokens_field: MaxTokensField = max_tokens_field
        self._owns_client = client is None
        if client is None:
            self._client = AsyncOpenAI(
                api_key=api_key or PLACEHOLDER_API_KEY,
                base_url=self.base_url,
                timeout=timeout,
                max_retries=0,
            )
        else:
            self._client = client.with_options(max_retries=0)

    def __repr__(self) -> str:
        return f"OpenAIChatSummarizer(model={self.model!r}, base_url={self.base_url!r})"

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
                f"{self.name}: no answer from {self.base_url} within {self.timeout:g}s",
                summarizer=self.name,
                retryable=True,
            ) from exc
        except Exception as exc:
            raise summarizer_error(exc, summarizer=self.name) from exc
        if not completion.choices:
            raise SummarizerError(
                f"{self.name}: the response from {self.base_url} has no choices",
                summarizer=self.name,
                retryable=True,
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


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "OPENAI_BASE_URL",
    "PLACEHOLDER_API_KEY",
    "MaxTokensField",
    "OpenAIChatSummarizer",
    "usage_from_openai",
]
