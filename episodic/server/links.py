"""OpenAPI links: which operation's response feeds which operation's parameters. A client
generator or a stateful tester (schemathesis) follows them from a created conversation to
every route that takes its id, and from a response's ``ETag`` (the head's last seq) to an
append's ``If-Match``."""

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
    "compact_now",
    "erase_conversation",
)
#: where each source operation's success response carries a conversation id (a list's or a
#: page's first item: an empty one links nowhere)
SOURCES = {
    "create_conversation": "$response.body#/conversation/conversation_id",
    "get_conversation": "$response.body#/conversation/conversation_id",
    "list_conversations": "$response.body#/items/0/conversation_id",
    "append": "$response.body#/events/0/conversation_id",
    "mark_run_completed": "$response.body#/events/0/conversation_id",
    "read_events": "$response.body#/events/0/conversation_id",
    "load_context": "$response.body#/conversation_id",
    "erase_conversation": "$response.body#/conversation_id",
}
#: sources whose success response's ETag is the head's (its last seq): an append on top of
#: that head sends it back as If-Match
HEADS = ("create_conversation", "get_conversation", "append", "mark_run_completed", "load_context")
#: the link from a head to an append that expects it
APPEND_ON_HEAD = "append_on_head"


def add_links(schema: dict[str, Any]) -> None:
    """Declare, on each source's success response, a link to every operation taking the
    conversation id it returned (and, from a head, to an append with its ETag as If-Match)."""
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
        links: dict[str, Any] = {
            target: {
                "operationId": target,
                "parameters": {"conversation_id": expression},
            }
            for target in BY_CONVERSATION_ID
            if target in operations and target != source
        }
        if_match = _header(operations.get("append"), "If-Match")
        if source in HEADS and if_match is not None:
            links[APPEND_ON_HEAD] = {
                "operationId": "append",
                "parameters": {
                    "path.conversation_id": expression,
                    f"header.{if_match}": "$response.header.ETag",
                },
                "description": "append on top of the head just seen (412 if it moved)",
            }
        success["links"] = links


def _header(operation: dict[str, Any] | None, name: str) -> str | None:
    """The name ``operation`` declares a header by (HTTP's are case-insensitive)."""
    for parameter in (operation or {}).get("parameters", []):
        if parameter.get("in") == "header" and parameter.get("name", "").lower() == name.lower():
            declared: str = parameter["name"]
            return declared
    return None
