"""One episodic version's writer and reader for T17 (rolling upgrade), run as a script by the
Python of either version: it imports nothing but the standard library and the ``episodic`` it
finds, and uses only the API both versions have.

``write URL LABEL STOP_FILE [CONVERSATION ...]``: append finished turns (a user message and a
long answer, each batch with an idempotency key, retried with it on a transient error) round
robin to the conversations (with none given, it creates 4 and prints their ids as the first
line), loading the context after every append, until STOP_FILE exists; then print one JSON
line: what was acknowledged, every error, how many loads and how many of them began with a
boundary's handoff. Then, once STOP_FILE.read exists, the same process reads (as ``read``)
and prints that as the last line.

``read URL CONVERSATION ...``: print one JSON line with every event of each conversation
(seq, kind, and the text or the boundary's cut) and its context (the seqs and texts).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from episodic import EpisodicError, EpisodicStore, Message, TransientDatabaseError

ANSWER = " ".join(
    f"line {n} of the answer, with the detail the next turn needs." for n in range(12)
)
RETRIES = 100


async def write(url: str, label: str, stop_file: Path, given: list[str]) -> None:
    store = await EpisodicStore.open(url)
    acked: list[list[str]] = []
    errors: list[str] = []
    loads = from_boundary = 0
    convs = list(given)
    try:
        if not convs:
            convs = [str(await store.create_conversation()) for _ in range(4)]
            print(json.dumps(convs), flush=True)
        number = 0
        while not stop_file.exists():  # noqa: ASYNC240 (a stat between appends)
            number += 1
            conv = convs[number % len(convs)]
            tag = f"{label}.{number}"
            batch = [Message.user(f"{tag} question"), Message.assistant(f"{tag} {ANSWER}")]
            for _ in range(RETRIES):
                try:
                    await store.append(conv, batch, idempotency_key=tag)
                except TransientDatabaseError as exc:
                    errors.append(f"transient {type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.05)
                    continue
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    break
                acked.append([conv, tag])
                break
            try:
                context = await store.load_context(conv)
            except Exception as exc:
                errors.append(f"load {type(exc).__name__}: {exc}")
            else:
                loads += 1
                from_boundary += context.boundary is not None
            await asyncio.sleep(0.01)
    except EpisodicError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    written = {"acked": acked, "errors": errors, "loads": loads, "from_boundary": from_boundary}
    print(json.dumps(written), flush=True)
    read_file = stop_file.with_name(stop_file.name + ".read")
    while not read_file.exists():  # noqa: ASYNC110 (told by a file: another process)
        await asyncio.sleep(0.05)
    try:
        print(json.dumps(await read(store, convs)), flush=True)
    finally:
        await store.close()


def _event(event: Any) -> list[Any]:
    if event.kind == "message":
        return [event.seq, "message", event.message.text]
    if event.kind == "boundary":
        return [event.seq, "boundary", event.covers_through_seq]
    return [event.seq, event.kind]


async def read(store: EpisodicStore, convs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for conv in convs:
        events: list[Any] = []
        while page := await store.read_events(conv, after_seq=len(events)):
            events += page
        context = await store.load_context(conv)
        out[conv] = {
            "events": [_event(event) for event in events],
            "context": [[m.seq, m.role, m.text] for m in context.messages],
            "boundary": None if context.boundary is None else context.boundary.seq,
        }
    return out


async def read_anew(url: str, convs: list[str]) -> None:
    store = await EpisodicStore.open(url)
    try:
        print(json.dumps(await read(store, convs)), flush=True)
    finally:
        await store.close()


def main(argv: list[str]) -> None:
    command, url, *rest = argv
    if command == "write":
        label, stop_file, *convs = rest
        asyncio.run(write(url, label, Path(stop_file), convs))
    else:
        asyncio.run(read_anew(url, rest))


if __name__ == "__main__":
    main(sys.argv[1:])
