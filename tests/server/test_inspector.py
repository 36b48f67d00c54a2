"""The ``/ui`` inspector in process (httpx over ASGI), on PostgreSQL and SQLite: signing in
with an operator key (a tenant key refused, a revoked one signed out), the conversations of
the tenant chosen, a compacted conversation's page (boundary, handoff summary, token counts
before and after, a retraction, the attempts with their errors), tenant isolation, and HTML
escaping of what agents wrote."""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

import httpx
import pytest
from pydantic import JsonValue

from episodic import EpisodicStore, Message, ToolCall, Usage
from episodic.compaction import CompactionRequest
from episodic.formats.claude_code import ENTRY_PROTOCOL
from episodic.models import MessageEvent, NativePayload
from episodic.server import create_app
from episodic.server.inspector import COOKIE, safe_next
from episodic.server.keys import KeyStore
from episodic.summarizers import SummarizerError, SummaryResult
from episodic.view import in_view
from episodic.worker import CompactionOptions, compact_claimed

SUMMARY = "Three requests answered; the deploy is pending approval."
SUMMARIZER_ERROR = "upstream said 503: overloaded"
RETRACTED = "oops, ignore this"
SCRIPT = '<script>alert("owned")</script>'
UNKNOWN = uuid.uuid4()


class StepSummarizer:
    """Raises, then answers: each call takes the next step."""

    name = "step"

    def __init__(self, *steps: str | BaseException) -> None:
        self.steps = list(steps)

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return SummaryResult(text=step, usage=Usage(input_tokens=40, output_tokens=12), model="m")


@dataclass(frozen=True)
class Compacted:
    conversation_id: UUID
    tokens_before: int
    tokens_after: int


async def compacted_conversation(store: EpisodicStore) -> Compacted:
    """Three turns with tool calls, a failed compaction attempt then a successful one, two
    messages after the boundary, and one more taken back (a retraction). Returns the token
    figures the inspector must show: the history in view uncompacted, and the context."""
    conv = await store.create_conversation(metadata={"topic": "deploys"})
    for turn in range(3):
        await store.append(
            conv,
            [
                Message.user(f"request {turn}: deploy service {turn}"),
                Message.assistant(None, tool_calls=[ToolCall(id=f"c{turn}", name="deploy")]),
                Message.tool_result(f"c{turn}", "output " * 40, name="deploy"),
                Message.assistant(f"answer {turn}: deployed"),
            ],
        )
    summarizer = StepSummarizer(
        SummarizerError(SUMMARIZER_ERROR, summarizer="step", retryable=True, status_code=503),
        SUMMARY,
    )
    for expected in ("failed", "succeeded"):
        claim = await store.claim_conversation(conv, "inspector-test", lease_seconds=60)
        assert claim is not None
        result = await compact_claimed(
            store, summarizer, claim, worker="inspector-test", options=CompactionOptions()
        )
        assert result.outcome == expected, result
    await store.append(conv, [Message.user("one more thing"), Message.assistant("sure")])
    await store.append(conv, [Message.user(RETRACTED)])
    assert (await store.retract_last(conv)) is not None
    context = await store.load_context(conv)
    assert context.boundary is not None
    events = await store.read_events(conv)
    before = sum(
        e.token_estimate
        for e in in_view(events)
        if isinstance(e, MessageEvent) and e.message.role != "system"
    )
    assert before > context.estimated_tokens
    return Compacted(conv, before, context.estimated_tokens)


@pytest.fixture
async def browser(store: EpisodicStore, keys: KeyStore) -> AsyncIterator[httpx.AsyncClient]:
    """A client sending no key, keeping cookies as a browser does."""
    transport = httpx.ASGITransport(app=create_app(store, keys))
    async with httpx.AsyncClient(transport=transport, base_url="http://episodic.test") as http:
        yield http


@pytest.fixture
async def operator(keys: KeyStore) -> str:
    """An operator key of tenant ops."""
    _, secret = await keys.create("ops", operator=True, label="inspector")
    return secret


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _html(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("text/html"), response.text[:300]
    return response.text


def _figure(page: str, name: str) -> str:
    found = re.search(rf'data-testid="{name}">([^<]*)<', page)
    assert found, f"no {name} on the page"
    return found.group(1)


async def test_no_key_shows_the_sign_in_form(browser: httpx.AsyncClient) -> None:
    for path in ("/ui", f"/ui/conversations/{uuid.uuid4()}"):
        response = await browser.get(path)
        assert response.status_code == 401
        page = _html(response)
        assert '<form method="post" action="/ui/sign-in"' in page
        assert 'type="password" name="key"' in page
        assert f'name="next" value="{path}"' in page
        assert "script-src" not in response.headers["content-security-policy"]
        assert "default-src 'none'" in response.headers["content-security-policy"]
        assert response.headers["cache-control"] == "no-store"
    assert "/ui" not in (await browser.get("/openapi.json")).text


async def test_sign_in_sets_a_strict_http_only_cookie_and_sign_out_clears_it(
    browser: httpx.AsyncClient, keys: KeyStore, operator: str
) -> None:
    target = "/ui?tenant=ops&limit=10"
    signed = await browser.post(
        "/ui/sign-in", data={"key": operator, "next": target}, follow_redirects=False
    )
    assert signed.status_code == 303
    assert signed.headers["location"] == target
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={operator};")
    attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "path=/ui", "samesite=strict"} <= attributes
    assert "secure" not in attributes  # plain http here; see the https test
    page = await browser.get("/ui")
    assert page.status_code == 200
    assert 'data-testid="tenant">tenant ops<' in _html(page)
    assert "Sign out" in page.text

    out = await browser.post("/ui/sign-out", follow_redirects=False)
    assert out.status_code == 303
    assert out.headers["location"] == "/ui"
    assert f'{COOKIE}=""' in out.headers["set-cookie"]
    assert "max-age=0" in out.headers["set-cookie"].lower()
    assert (await browser.get("/ui")).status_code == 401


async def test_another_site_may_not_sign_in_or_out(
    browser: httpx.AsyncClient, operator: str
) -> None:
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
        forged = await browser.post(
            "/ui/sign-in", data={"key": operator}, headers=headers, follow_redirects=False
        )
        assert forged.status_code == 403
        assert "set-cookie" not in forged.headers
    same = {"Sec-Fetch-Site": "same-origin", "Origin": "https://evil.example"}
    signed = await browser.post(
        "/ui/sign-in", data={"key": operator}, headers=same, follow_redirects=False
    )
    assert signed.status_code == 303  # the browser's own word wins over an Origin
    out = await browser.post("/ui/sign-out", headers={"Sec-Fetch-Site": "same-site"})
    assert out.status_code == 403
    # a proxy's Basic credentials beside the cookie: the cookie still signs in
    behind_proxy = await browser.get("/ui", headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert behind_proxy.status_code == 200


async def test_a_revoked_key_is_signed_out(
    browser: httpx.AsyncClient, keys: KeyStore, operator: str
) -> None:
    await browser.post("/ui/sign-in", data={"key": operator})
    assert (await browser.get("/ui")).status_code == 200
    await keys.revoke(operator.split("_")[1])
    response = await browser.get("/ui")
    assert response.status_code == 401
    assert "was revoked" in _html(response)
    assert 'action="/ui/sign-in"' in response.text
    assert f'{COOKIE}=""' in response.headers["set-cookie"]


async def test_over_https_the_cookie_is_secure(store: EpisodicStore, keys: KeyStore) -> None:
    _, secret = await keys.create("ops", operator=True)
    transport = httpx.ASGITransport(app=create_app(store, keys))
    async with httpx.AsyncClient(transport=transport, base_url="https://episodic.test") as http:
        signed = await http.post("/ui/sign-in", data={"key": secret}, follow_redirects=True)
        assert signed.history[0].status_code == 303
        assert "secure" in signed.history[0].headers["set-cookie"].lower()
        assert signed.status_code == 200  # followed, with the cookie


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "Paste an API key"), ("nonsense", "malformed"), ("ep_abc_def", "unknown")],
)
async def test_a_bad_key_is_refused_on_the_form(
    browser: httpx.AsyncClient, key: str, message: str
) -> None:
    response = await browser.post("/ui/sign-in", data={"key": key}, follow_redirects=False)
    assert response.status_code == 401
    assert message in _html(response)
    assert "set-cookie" not in response.headers


async def test_a_tenant_key_is_refused(browser: httpx.AsyncClient, keys: KeyStore) -> None:
    tenant_key, secret = await keys.create("acme")
    response = await browser.post("/ui/sign-in", data={"key": secret}, follow_redirects=False)
    assert response.status_code == 403
    page = html.unescape(_html(response))
    assert f"The key {tenant_key.key_id} is tenant 'acme''s" in page
    assert "needs an operator key" in page
    assert "set-cookie" not in response.headers
    scripted = await browser.get("/ui", headers=_bearer(secret))
    assert scripted.status_code == 403
    assert "needs an operator key" in _html(scripted)
    # a tenant key's cookie (set by hand) is refused just the same, and cleared
    browser.cookies.set(COOKIE, secret, domain="episodic.test", path="/ui")
    by_cookie = await browser.get("/ui")
    assert by_cookie.status_code == 403
    assert f'{COOKIE}=""' in by_cookie.headers["set-cookie"]


async def test_the_compacted_conversation_page(
    browser: httpx.AsyncClient, store: EpisodicStore, keys: KeyStore
) -> None:
    _, secret = await keys.create("acme", operator=True)
    made = await compacted_conversation(store.for_tenant("acme"))
    cid = made.conversation_id
    listing = await browser.get("/ui", headers=_bearer(secret))
    assert listing.status_code == 200
    assert f"/ui/conversations/{cid}?tenant=acme" in _html(listing)
    assert "compacted · #" in listing.text

    response = await browser.get(f"/ui/conversations/{cid}", headers=_bearer(secret))
    assert response.status_code == 200
    page = _html(response)
    assert _figure(page, "tokens-before") == f"{made.tokens_before:,}"
    assert _figure(page, "tokens-after") == f"{made.tokens_after:,}"
    assert _figure(page, "tokens-saved") == f"{made.tokens_before - made.tokens_after:,}"
    # the handoff summary, first of what the next request sees, and the retained messages
    context = page.split('data-testid="context"')[1].split('id="log"')[0]
    handoff = context.split('data-testid="handoff"')[1].split("</article>")[0]
    assert "handoff summary" in handoff
    assert SUMMARY in handoff
    assert "retained user message" in context
    assert "request 2: deploy service 2" in context
    assert "one more thing" in context
    assert RETRACTED not in context
    # the boundary in the log, marked
    boundary = page.split('data-testid="boundary"')[1].split("</tr>")[0]
    assert "Summary boundary" in boundary
    assert "covers through #12" in boundary
    assert SUMMARY in boundary
    assert ">current<" in boundary
    # the retraction and the message it took back
    retracted = page.split('data-testid="retracted"')[1].split("</tr>")[0]
    assert RETRACTED in retracted
    assert ">retracted<" in retracted
    assert 'data-testid="retraction">takes back <a href="#seq-16">#16</a>' in page
    assert 'class="message summarized"' in page  # the compacted messages, marked
    # the attempts, newest first, the failed one with its error
    attempts = page.split('data-testid="attempts"')[1].split("</table>")[0]
    assert attempts.index(">succeeded<") < attempts.index(">failed<")
    assert SUMMARIZER_ERROR in html.unescape(attempts)
    assert 'data-testid="attempt-error"' in attempts
    # the head and pressure
    assert 'data-testid="pressure-tokens"' in page
    assert "deploys" in page  # metadata

    paged = await browser.get(
        f"/ui/conversations/{cid}", params={"limit": 5, "after_seq": 5}, headers=_bearer(secret)
    )
    assert paged.status_code == 200
    log = paged.text.split('id="log"')[1].split('id="attempts"')[0]
    assert re.findall(r'<tr id="seq-(\d+)"', log) == ["6", "7", "8", "9", "10"]
    assert f"/ui/conversations/{cid}?tenant=acme&amp;after_seq=10&amp;limit=5#log" in log
    assert f"/ui/conversations/{cid}?tenant=acme&amp;limit=5#log" in log  # back to the start


async def test_a_mirrored_claude_code_compaction_is_shown_as_a_boundary(
    store: EpisodicStore, browser: httpx.AsyncClient, operator: str
) -> None:
    # what EpisodicSessionStore keeps of Claude Code's transcript (no SDK needed to read it)
    def line(entry: dict[str, JsonValue]) -> Message:
        native = NativePayload(protocol=ENTRY_PROTOCOL, data=entry)
        role = "user" if entry["type"] == "user" else "system"
        return Message(role=role, content=str(entry.get("content", "")), native=native)

    cid = await store.for_tenant("ops").create_conversation()
    await store.for_tenant("ops").append(
        cid,
        [
            line({"type": "user", "content": "fix the flaky test", "uuid": "u1"}),
            line({
                "type": "system", "subtype": "compact_boundary", "uuid": "c1",
                "content": "Conversation compacted",
                "compactMetadata": {"trigger": "auto", "preTokens": 154_321},
            }),
        ],
    )  # fmt: skip
    page = _html(await browser.get(f"/ui/conversations/{cid}", headers=_bearer(operator)))
    (_, row) = page.split('data-testid="framework-boundary"')
    row = row.split("</tr>")[0]
    assert "Claude Code compaction boundary (auto, 154,321 tokens)" in row
    assert 'class="boundary' in page.split('data-testid="framework-boundary"')[0][-200:]
    assert page.count('data-testid="framework-boundary"') == 1  # the user line is a message


async def test_an_operator_views_another_tenant_only_when_it_asks(
    browser: httpx.AsyncClient, store: EpisodicStore, keys: KeyStore, operator: str
) -> None:
    acme = store.for_tenant("acme")
    theirs = await acme.create_conversation()
    await acme.append(theirs, [Message.user("the secret plan of acme")])
    ours = await store.for_tenant("ops").create_conversation()
    await keys.create("acme")  # so acme is among the tenants offered
    headers = _bearer(operator)

    own = _html(await browser.get("/ui", headers=headers))
    assert str(ours) in own
    assert str(theirs) not in own
    assert '<option value="acme">' in own  # the picker offers the tenants of the keys
    other = await browser.get("/ui", params={"tenant": "acme"}, headers=headers)
    assert 'data-testid="tenant">tenant acme<' in _html(other)
    assert str(theirs) in other.text
    assert str(ours) not in other.text

    hidden = await browser.get(f"/ui/conversations/{theirs}", headers=headers)
    assert hidden.status_code == 404
    assert "the secret plan of acme" not in _html(hidden)
    assert "Not found" in hidden.text
    for tenant in ("nobody", "ops"):
        elsewhere = await browser.get(
            f"/ui/conversations/{theirs}", params={"tenant": tenant}, headers=headers
        )
        assert elsewhere.status_code == 404
        assert "the secret plan of acme" not in elsewhere.text
    shown = await browser.get(
        f"/ui/conversations/{theirs}", params={"tenant": "acme"}, headers=headers
    )
    assert shown.status_code == 200
    assert "the secret plan of acme" in _html(shown)
    empty = await browser.get("/ui", params={"tenant": "nobody"}, headers=headers)
    assert "has no conversations" in _html(empty)


async def test_what_agents_wrote_is_escaped(
    browser: httpx.AsyncClient, store: EpisodicStore, operator: str
) -> None:
    ops = store.for_tenant("ops")
    conv = await ops.create_conversation(metadata={"title": SCRIPT})
    await ops.append(
        conv,
        [
            Message.user(SCRIPT),
            Message.assistant(None, tool_calls=[ToolCall(id="x", name="<b>tool</b>")]),
            Message.tool_result("x", "<img src=x onerror=alert(1)>\u202eevil", name="<i>t</i>"),
        ],
    )
    page = _html(await browser.get(f"/ui/conversations/{conv}", headers=_bearer(operator)))
    for raw in (SCRIPT, "<b>tool</b>", "<img src=x", "<i>t</i>", "\u202e"):
        assert raw not in page
    assert "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;" in page
    assert "\\u202eevil" in page  # a reordering mark shown, not obeyed


@pytest.mark.parametrize(
    ("path", "status", "text"),
    [
        ("/ui/conversations/not-a-uuid", 404, "is not a conversation id"),
        ("/ui/conversations/%3Cscript%3E", 404, "is not a conversation id"),
        (f"/ui/conversations/{UNKNOWN}", 404, f"No conversation {UNKNOWN} is visible in"),
        (f"/ui/conversations/{uuid.uuid4()}?after_seq=x", 422, "after_seq must be"),
        ("/ui?before=nope", 422, "before must be a conversation id"),
        ("/ui?limit=0", 422, "limit must be"),
        ("/ui?tenant=" + "t" * 300, 422, "tenant_id"),
    ],
)
async def test_bad_requests_are_html_pages(
    browser: httpx.AsyncClient, operator: str, path: str, status: int, text: str
) -> None:
    response = await browser.get(path, headers=_bearer(operator))
    assert response.status_code == status
    assert text in html.unescape(_html(response))
    assert "<script>" not in response.text


async def test_conversations_page_through(
    browser: httpx.AsyncClient, store: EpisodicStore, operator: str
) -> None:
    ops = store.for_tenant("ops")
    made = [await ops.create_conversation() for _ in range(3)]
    first = _html(await browser.get("/ui", params={"limit": 2}, headers=_bearer(operator)))
    assert str(made[2]) in first
    assert str(made[1]) in first
    assert str(made[0]) not in first
    older = re.search(r'href="(/ui\?tenant=ops&amp;before=[^"]+)">Older', first)
    assert older
    second = _html(await browser.get(html.unescape(older.group(1)), headers=_bearer(operator)))
    assert str(made[0]) in second
    assert str(made[2]) not in second


@pytest.mark.parametrize(
    ("target", "safe"),
    [
        (None, "/ui"),
        ("/ui", "/ui"),
        ("/ui?tenant=a", "/ui?tenant=a"),
        ("/ui/conversations/x", "/ui/conversations/x"),
        ("https://evil.example/ui", "/ui"),
        ("//evil.example/ui", "/ui"),
        ("/ui//evil.example", "/ui"),
        ("/uix", "/ui"),
        ("/ui/\\evil", "/ui"),
        ("/v1/conversations", "/ui"),
        ("/ui\r\nSet-Cookie: x", "/ui"),
    ],
)
def test_sign_in_goes_back_only_into_the_inspector(target: str | None, safe: str) -> None:
    assert safe_next(target) == safe


async def test_empty_cleared_and_deleted_conversations_render(
    browser: httpx.AsyncClient, store: EpisodicStore, operator: str
) -> None:
    ops = store.for_tenant("ops")
    empty = await ops.create_conversation()
    page = _html(await browser.get(f"/ui/conversations/{empty}", headers=_bearer(operator)))
    assert "the next request starts from an empty history" in page
    assert "No compaction attempts yet" in page

    cleared = await ops.create_conversation()
    await ops.append(cleared, [Message.user("before the clear"), Message.assistant("ok")])
    await ops.clear(cleared)
    await ops.append(cleared, [Message.user("after the clear")])
    await ops.mark_run_completed(cleared)
    page = _html(await browser.get(f"/ui/conversations/{cleared}", headers=_bearer(operator)))
    assert page.count('<span class="badge s-cleared">cleared</span>') == 3  # legend + 2 rows
    assert 'class="message in-context"' in page
    context = page.split('data-testid="context"')[1].split('id="log"')[0]
    assert "after the clear" in context
    assert "before the clear" not in context
    assert _figure(page, "tokens-before") == _figure(page, "tokens-after")

    deleted = await ops.create_conversation()
    await ops.append(deleted, [Message.user("gone soon")])
    await ops.delete_conversation(deleted)
    response = await browser.get(f"/ui/conversations/{deleted}", headers=_bearer(operator))
    assert response.status_code == 200
    page = _html(response)
    assert "a deleted conversation is not loaded" in page
    assert "gone soon" in page  # the log is kept, and shown
