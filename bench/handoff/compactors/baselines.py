"""The two baselines without a model, as the field runs them.

- ``truncation``: keep the newest messages, as many as the handoff's budget plus the
  verbatim budget hold (what a context window does when nothing compacts).
- ``masking``: observation masking (JetBrains, "The Complexity Trap"): every message is
  kept, but tool outputs older than the kept recent turns become a placeholder.

And two that exist to prove the scoring (tests/bench): ``keep_all`` keeps everything,
``keep_nothing`` keeps nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.handoff.compactors.base import Compactor, keep_from
from episodic import Message

MASKED = "[tool output omitted to save context]"


class _History(Compactor):
    needs_model = False

    async def open(self) -> None:
        self.messages: list[Message] = []

    async def add(self, messages: Sequence[Message]) -> None:
        self.messages.extend(messages)

    async def context(self) -> list[Message]:
        return list(self.messages)


class Truncation(_History):
    name = "truncation"
    describes = "keep the newest messages within the handoff and verbatim budgets; no model"

    async def compact(self) -> None:
        start = keep_from(self.messages, self.budget.handoff_tokens + self.budget.keep_tokens)
        self.messages = self.messages[start:]


class ObservationMasking(_History):
    name = "masking"
    describes = "observation masking: old tool outputs replaced by a placeholder; no model"

    async def compact(self) -> None:
        start = keep_from(self.messages, self.budget.keep_tokens)
        self.messages = [
            message.model_copy(update={"content": MASKED})
            if message.role == "tool" and index < start
            else message
            for index, message in enumerate(self.messages)
        ]


class KeepAll(_History):
    name = "keep_all"
    describes = "keeps every message (a check of the scoring: context recall must be 100%)"

    async def compact(self) -> None:
        return None


class KeepNothing(_History):
    name = "keep_nothing"
    describes = "keeps no message (a check of the scoring: context recall must be 0%)"

    async def compact(self) -> None:
        self.messages = []
