"""The compactors the handoff benchmark compares, by the name the report gives them.

Each is imported only when it runs, so a peer whose package is missing is skipped (and the
report says so) instead of stopping the run."""

from __future__ import annotations

import importlib

from bench.handoff.compactors.base import Compactor

#: name -> "module:class", in the report's order
COMPACTORS = {
    "episodic": "bench.handoff.compactors.episodic_compactors:EpisodicWorker",
    "episodic_inrun": "bench.handoff.compactors.episodic_compactors:EpisodicInRun",
    "langchain": "bench.handoff.compactors.langchain_summarization:LangChainSummarization",
    "adk": "bench.handoff.compactors.adk_summarizer:AdkEventSummarizer",
    "truncation": "bench.handoff.compactors.baselines:Truncation",
    "masking": "bench.handoff.compactors.baselines:ObservationMasking",
}
#: compactors that check the scoring, or episodic as an application that pins nothing gets
#: it: never in a report unless asked for
CHECKS = {
    "keep_all": "bench.handoff.compactors.baselines:KeepAll",
    "keep_nothing": "bench.handoff.compactors.baselines:KeepNothing",
    "episodic_unpinned": "bench.handoff.compactors.episodic_compactors:EpisodicUnpinned",
}


def load(name: str) -> type[Compactor] | str:
    """The compactor class, or why it cannot be imported here."""
    where = {**COMPACTORS, **CHECKS}.get(name)
    if where is None:
        known = ", ".join([*COMPACTORS, *CHECKS])
        raise ValueError(f"unknown compactor {name!r}; expected one of {known}")
    module, _, attribute = where.partition(":")
    try:
        found: type[Compactor] = getattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError as exc:
        return f"{exc.name or exc} is not installed"
    except ImportError as exc:  # installed, but not as this adapter expects
        return f"cannot be imported: {exc}"
    return found
