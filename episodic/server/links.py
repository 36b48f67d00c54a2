"""OpenAPI links: which operation's response feeds which operation's parameters. A client
generator or a stateful tester (schemathesis) follows them from a created conversation to
every route that takes its id."""

from __future__ import annotations

from typing import Any

#: operations that take the conversation id in their path, by operation id
BY_CONVERSATION_ID = (
    "get_conversation",
    "append",
    "read_events",
    "load_context",
    "mark_run_completed",
    "export_conversation",
)
#: where each source operation's response carries a conversation id
SOURCES = {
    "create_conversation": "$response.body#/conversation/conversation_id",
    "get_conversation": "$response.body#/conversation/conversation_id",
    "append": "$response.body#/events/0/conversation_id",
}


def add_links(schema: dict[str, Any]) -> None:
    """Declare, on each source's success response, a link to every operation taking the
    conversation id it returned."""
    operations = {
        operation["operationId"]: operation
        for item in schema.get("paths", {}).values()
        for operation in item.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    for source, expression in SOURCES.items():
        operation = operations.get(source)
        if operation is None:
            continue
        success = next(
            (r for code, r in operation["responses"].items() if code.startswith("2")), None
        )
        if success is None:
            continue
        success["links"] = {
            target: {
                "operationId": target,
                "parameters": {"conversation_id": expression},
            }
            for target in BY_CONVERSATION_ID
            if target in operations and target != source
        }
