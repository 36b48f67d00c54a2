from episodic import EpisodicStore, Message


async def test_append_and_read(store: EpisodicStore) -> None:
    conv = await store.create_conversation(tenant_id="acme", metadata={"model": "x"})
    events = await store.append(conv, [Message.user("hello"), Message.assistant("hi")])
    assert [e.seq for e in events] == [1, 2]
    stored = await store.read_events(conv)
    assert [e.seq for e in stored] == [1, 2]
