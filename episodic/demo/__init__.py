"""``episodic demo``: a long agent session played into a throwaway SQLite file, compacted by the
worker, and the raw log shown beside what the next request would load. Imported only by the
command that runs it."""

from episodic.demo.play import (
    DEMO_CONVERSATION_ID,
    DEMO_DATABASE_FILE,
    DEMO_TENANT,
    DemoError,
    DemoReport,
    run_demo,
)

__all__ = [
    "DEMO_CONVERSATION_ID",
    "DEMO_DATABASE_FILE",
    "DEMO_TENANT",
    "DemoError",
    "DemoReport",
    "run_demo",
]
