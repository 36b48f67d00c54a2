"""Schemathesis against a live ``episodic serve`` (issue 19): every operation of the OpenAPI
schema with valid and with invalid requests, then stateful chains along the schema's links
(create -> append -> append on the head's ETag -> read, context, export, compact, erase...),
each bounded by an example count.

Every request made is counted, the checks' own probes included, and the store is read
directly (not through the API) before and after each one. The run prints its counts and
holds: no server error, no response the schema does not describe (status, content type,
headers, body), no 4xx after which the store had changed, no conversation of one tenant
reachable with another tenant's key, and no request the schema accepts refused for its
content: of the positive-data cases answered 4xx, none is a 422 ValidationError (the
other 4xx depend on the state, which no schema states: an unknown id, a stale If-Match, a
result whose call is not open, a reused Idempotency-Key)."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import asyncpg
import httpx
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.core.errors import InvalidSchema
from schemathesis.core.failures import FailureGroup
from schemathesis.engine.errors import is_inconsistent_replay
from schemathesis.generation.stateful.state_machine import APIStateMachine

from episodic.formats.anthropic import messages_to_anthropic
from episodic.formats.openai_chat import messages_to_openai
from episodic.formats.responses import messages_to_responses
from episodic.models import Message, ToolCall
from tests.acceptance.test_cli import clean_env, run_cli
from tests.server.conftest import AnswerWatch
from tests.server.live import Served, serving
from tests.support import TerminalSummary, asyncpg_dsn

pytestmark = pytest.mark.postgres_only

#: generated requests per operation and generation mode
EXAMPLES = 50
#: stateful scenarios, each a chain of at most STEPS linked calls
SCENARIOS = 200
STEPS = 15
SEED = 19
#: new-seed runs after Hypothesis found the live server's answers flaky (see `stateful`)
MAX_RESTARTS = 20
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
#: the checks that compare a response with what the schema documents for it
SCHEMA_CHECKS = frozenset(
    {
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
    }
)
#: operations that need an operator key (a tenant's key gets 403)
OPERATOR_OPERATIONS = frozenset({"compaction_status", "compact_now", "erase_conversation"})
#: every table the API writes to (alembic's version table it never touches)
TABLES = (
    "episodic_conversations",
    "episodic_events",
    "episodic_compaction_attempts",
    "episodic_erasures",
    "episodic_shared_state",
    "episodic_api_keys",
)
#: each table's row count and the sum of its rows' hashes: any insert, update or delete of
#: any row, in any tenant, changes it (the superuser is not subject to row-level security)
SNAPSHOT = " UNION ALL ".join(
    f"SELECT '{table}', count(*), coalesce(sum(hashtextextended(t::text, 0)), 0) FROM {table} t"
    for table in TABLES
)
APPEND = "POST /v1/conversations/{conversation_id}/messages"
USER_MESSAGE = {"role": "user", "content": "what is the capital of France?"}
#: ETag-shaped If-Match values whose "digits" are the Latin-1 characters str.isdigit() takes
#: but int() refuses (a header is Latin-1): schemathesis seldom draws them by itself, so each
#: is sent once, on a valid append
ODD_ETAGS = ('"\u00b2"', 'W/"1\u00b9"', '"\u00b3"')
#: a message's text (no lone surrogates: JSON can spell them, but no text column stores them)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=80)
#: text with a visible character (Anthropic's format leaves blank text out)
VISIBLE = TEXT.filter(str.strip)
#: the problem type of a refusal for what the request holds: for a positive-data case (one
#: the schema accepts), a rule the schema should have stated...
CONTENT_REFUSAL = "https://episodic.dev/errors/ValidationError"
#: ...but for a client id twice in one batch: a key unique across the batch's messages, which
#: JSON Schema cannot state (``uniqueItems`` compares whole items). (A tool call id twice is a
#: DuplicateToolCallError; the other 4xx depend on the conversation's state.)
UNSTATEABLE_FIELD = re.compile(r"messages\[\d+\]\.client_id")
#: each format an append takes, and how a batch of episodic's messages reads in it
FORMATS: dict[str, Callable[[list[Message]], list[dict[str, Any]]]] = {
    "episodic": lambda messages: [m.model_dump(mode="json", exclude_none=True) for m in messages],
    "openai": messages_to_openai,
    "responses": messages_to_responses,
    "anthropic": messages_to_anthropic,
}

Snapshot = tuple[tuple[str, int, Decimal], ...]


class Database:
    """The test's database, read over a connection of its own as the superuser."""

    def __init__(self, url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._connection: asyncpg.Connection = self._loop.run_until_complete(
            asyncpg.connect(asyncpg_dsn(url))
        )

    def snapshot(self) -> Snapshot:
        rows = self._loop.run_until_complete(self._connection.fetch(SNAPSHOT))
        return tuple((row[0], row[1], row[2]) for row in rows)

    def close(self) -> None:
        self._loop.run_until_complete(self._connection.close())
        self._loop.close()


def changed_tables(before: Snapshot, after: Snapshot) -> list[str]:
    return [b[0] for b, a in zip(before, after, strict=True) if b != a]


@dataclass
class Tally:
    """What the run saw, over every request made."""

    database: Database
    phase: str = "setup"
    by_phase: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    by_operation: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    schema_violations: list[str] = field(default_factory=list)
    changed_on_4xx: list[str] = field(default_factory=list)
    other_failures: Counter[str] = field(default_factory=Counter)
    other_examples: dict[str, str] = field(default_factory=dict)
    other_all: list[str] = field(default_factory=list)
    #: positive-data cases answered 4xx, by status and problem type; and those refused for
    #: their content (a 422 ValidationError: a rule the schema does not state)
    positive_4xx: Counter[str] = field(default_factory=Counter)
    refused_valid: list[str] = field(default_factory=list)
    refused_unstateable: int = 0
    cross_tenant: Counter[int] = field(default_factory=Counter)
    cross_tenant_leaks: list[str] = field(default_factory=list)
    ungenerated: Counter[str] = field(default_factory=Counter)
    scenarios: int = 0
    restarts: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_phase.values())

    @property
    def client_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if 400 <= status < 500)

    def sent(self, method: str, url: str, response: requests.Response, changed: list[str]) -> None:
        """One request on the wire, as the store saw it."""
        self.by_phase[self.phase] += 1
        status = response.status_code
        self.statuses[status] += 1
        sent = {
            name: value
            for name, value in response.request.headers.items()
            if name.lower() in ("content-type", "if-match", "idempotency-key")
        }
        body = response.request.body
        body = body[:200] if isinstance(body, bytes | str) else body
        what = f"{method} {urlsplit(url).path} {sent} {body!r} -> {status} {response.text[:300]!r}"
        if status >= 500:
            self.server_errors.append(what)
        if 400 <= status < 500 and changed:
            self.changed_on_4xx.append(f"{what}; changed: {', '.join(changed)}")

    def checked(
        self, case: Case[Any], response: schemathesis.Response, failures: FailureGroup
    ) -> None:
        for failure in failures.exceptions:
            check = failure.checks[0] if failure.checks else type(failure).__name__
            if check == "not_a_server_error":
                continue  # every 5xx on the wire is counted by `sent`, probes included
            what = (
                f"[{self.phase}] {case.operation.label} -> {response.status_code}: "
                f"{failure.title}: {failure.message}\n    {case.as_curl_command()}\n    "
                f"-> {response.text[:300]!r}"
            )
            if check in SCHEMA_CHECKS:
                self.schema_violations.append(what)
            else:
                self.other_failures[check] += 1
                self.other_examples.setdefault(check, what)
                self.other_all.append(f"{check}: {what}")

    def answered(self, case: Case[Any], response: schemathesis.Response) -> None:
        """Count a positive-data case (one the schema accepts) answered 4xx, by its problem
        type; one refused for its content is a rule the schema does not state."""
        status = response.status_code
        if case.meta is None or not case.meta.generation.mode.is_positive:
            return
        if not 400 <= status < 500:
            return
        kind, refused_field = problem_of(response)
        self.positive_4xx[f"{status} {kind.rsplit('/', 1)[-1]}"] += 1
        if status != 422 or kind != CONTENT_REFUSAL:
            return
        if UNSTATEABLE_FIELD.fullmatch(refused_field):
            self.refused_unstateable += 1
        else:
            self.refused_valid.append(
                f"[{self.phase}] {case.operation.label}\n    {case.as_curl_command()}\n"
                f"    -> {response.text[:500]!r}"
            )

    def asked_across_tenants(self, label: str, cid: str, response: schemathesis.Response) -> None:
        """A request with one tenant's key on another tenant's conversation: 404 or a 4xx
        the request earned by itself (never its data, never a write)."""
        self.cross_tenant[response.status_code] += 1
        if response.status_code < 400:
            self.cross_tenant_leaks.append(
                f"{label} {cid} -> {response.status_code} {response.text[:300]!r}"
            )

    def summary(self, seconds: float) -> list[str]:
        phases = ", ".join(f"{phase} {n}" for phase, n in self.by_phase.items())
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        others = ", ".join(f"{check} {n}" for check, n in self.other_failures.most_common())
        lines = [
            f"schemathesis {schemathesis.__version__} against a live episodic serve: "
            f"{self.total} requests in {seconds:.1f} s ({phases}); "
            f"{EXAMPLES} examples per operation and mode; {self.scenarios} stateful "
            f"scenarios of at most {STEPS} steps ({self.restarts} restarts)",
            f"statuses: {statuses}",
            f"server errors (5xx): {len(self.server_errors)}; schema violations: "
            f"{len(self.schema_violations)}; 4xx responses: {self.client_errors}, after which "
            f"the store had changed: {len(self.changed_on_4xx)}",
            f"cross-tenant probes: {sum(self.cross_tenant.values())} "
            f"({', '.join(f'{s}: {n}' for s, n in sorted(self.cross_tenant.items()))}), "
            f"answered with another tenant's data: {len(self.cross_tenant_leaks)}",
            f"positive-data cases answered 4xx: {sum(self.positive_4xx.values())} "
            f"({', '.join(f'{k}: {n}' for k, n in sorted(self.positive_4xx.items()))}); "
            f"refused for what the schema accepts (422 ValidationError): "
            f"{len(self.refused_valid)}, and for a client id twice in one batch (a rule no "
            f"schema states): {self.refused_unstateable}",
            f"draws schemathesis could not generate (dropped): "
            f"{', '.join(f'{e} x{n}' for e, n in self.ungenerated.items()) or 'none'}",
            f"other checks failed: {others or 'none'}",
        ]
        lines += [f"  e.g. {example}" for example in self.other_examples.values()]
        operations: dict[str, dict[str, list[str]]] = {}
        for (label, kind, status), n in sorted(self.by_operation.items()):
            operations.setdefault(label, {}).setdefault(kind, []).append(f"{status}: {n}")
        lines.append("statuses by operation, stateless; stateful:")
        lines += [
            f"  {label}: {', '.join(kinds.get('stateless', ['-']))}; "
            f"{', '.join(kinds.get('stateful', ['-']))}"
            for label, kinds in operations.items()
        ]
        return lines


@dataclass(frozen=True)
class Keys:
    tenant: str  # acme's
    operator: str  # acme's operator key
    other: str  # globex's

    def natural(self, operation_id: str | None) -> str:
        return self.operator if operation_id in OPERATOR_OPERATIONS else self.tenant

    def tenant_of(self, key: str) -> str:
        return "globex" if key == self.other else "acme"

    def drawn(self, operation_id: str | None) -> list[str]:
        """Mostly the key the operation is meant for; sometimes the other acme key (an
        operator's operation asked with a tenant key: 403) or globex's (acme's
        conversations are not there for it)."""
        natural = self.natural(operation_id)
        swapped = self.tenant if natural == self.operator else self.operator
        return [natural, natural, natural, swapped, self.other]


def problem_of(response: schemathesis.Response) -> tuple[str, str]:
    """The ``type`` and ``field`` of a problem+json answer ("" for what it has not)."""
    try:
        body = response.json()
    except ValueError:
        return "", ""
    found = body if isinstance(body, dict) else {}
    kind, refused = found.get("type"), found.get("field")
    return (kind if isinstance(kind, str) else ""), (refused if isinstance(refused, str) else "")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def credentials(case: Case[Any], key: str) -> dict[str, str]:
    """The key's header, unless the case is one whose invalid part is its credentials (then
    it goes as generated: none, or a bad one)."""
    return {} if case.operation.schema.is_security_param_negated(case) else bearer(key)


@pytest.fixture
def server(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Served, Keys]]:
    """``episodic serve`` on a fresh migrated database, with acme's tenant and operator keys
    and globex's key."""
    env = clean_env(EPISODIC_DATABASE_URL=postgres_url)
    keys: list[str] = []
    for extra in ([], ["--operator"], []):
        tenant = "globex" if len(keys) == 2 else "acme"
        made = run_cli("keys", "create", "--tenant", tenant, *extra, cwd=tmp_path, env=env)
        assert made.code == 0, made.output
        keys.append(made.stdout.strip())
    with serving(tmp_path, env) as served:
        yield served, Keys(*keys)


def seed_conversation(base: str, key: str) -> str:
    """A conversation with a user message and an answer, made through the API."""
    made = httpx.post(f"{base}/v1/conversations", json={}, headers=bearer(key))
    assert made.status_code == 201, made.text
    cid: str = made.json()["conversation"]["conversation_id"]
    answer = {"role": "assistant", "content": "Paris."}
    appended = httpx.post(
        f"{base}/v1/conversations/{cid}/messages",
        json={"messages": [USER_MESSAGE, answer]},
        headers=bearer(key),
    )
    assert appended.status_code == 201, appended.text
    return cid


def valid_batches() -> st.SearchStrategy[list[Message]]:
    """Messages the library accepts: user and assistant turns, and tool calls answered in
    the same batch."""
    user = VISIBLE.map(lambda text: [Message.user(text)])
    answer = VISIBLE.map(lambda text: [Message.assistant(text)])
    tool_round = st.builds(
        lambda call_id, name, result: [
            Message.assistant(tool_calls=[ToolCall(id=call_id, name=name)]),
            Message.tool_result(call_id, result),
        ],
        st.uuids().map(str),
        st.from_regex(r"[a-z_]{1,20}", fullmatch=True),
        VISIBLE,
    )
    turns = st.lists(st.one_of(user, answer, tool_round), min_size=1, max_size=3)
    return turns.map(lambda listed: [message for turn in listed for message in turn])


def valid_bodies() -> st.SearchStrategy[dict[str, Any]]:
    """A valid batch in any format an append takes: ``format`` and ``messages``."""
    return st.builds(
        lambda name, messages: {"format": name, "messages": FORMATS[name](messages)},
        st.sampled_from(sorted(FORMATS)),
        valid_batches(),
    )


def looks_like_etag(value: str) -> bool:
    """What the server reads as a head's ETag (``"12"``, ``W/"12"``): its digits only."""
    return value.strip().removeprefix("W/").strip('"').isdigit()


def offer_valid_batches(schema: Any) -> None:
    """Give valid appends a valid variant too. A generated batch the schema accepts seldom
    gets through all the same: its tool results answer calls that are not open, its calls
    reuse ids (rules of the conversation's state, which no schema states), so the stateful
    chains would stop at their first append. Each generated case still runs as it is; this
    adds, for a valid append, the same request with a batch the library takes, in any of the
    formats, and no If-Match but an ETag (the one a link sent)."""

    def flatmap_case(
        context: schemathesis.HookContext, case: Case[Any]
    ) -> st.SearchStrategy[Case[Any]]:
        if (
            context.operation is None
            or schema.get_operation_id(context.operation) != "append"
            or case.meta is None
            or not case.meta.generation.mode.is_positive
            or not isinstance(case.body, dict)
        ):
            return st.just(case)
        body: dict[str, Any] = case.body

        def with_batch(valid: dict[str, Any]) -> Case[Any]:
            batch: Any = {**body, **valid}
            case.body = batch
            for name in [n for n in case.headers or {} if n.lower() == "if-match"]:
                if not looks_like_etag(str(case.headers[name])):
                    del case.headers[name]
            return case

        return st.one_of(st.just(case), valid_bodies().map(with_batch))

    schema.hooks.register_hook_with_name(flatmap_case, "flatmap_case")


def count_every_request(tally: Tally, monkeypatch: pytest.MonkeyPatch) -> None:
    """Route every request schemathesis sends (its checks' probes too) through the tally,
    with a snapshot of the store before and after it."""
    send = requests.Session.request

    def request(
        self: requests.Session, method: str, url: str, *args: Any, **kwargs: Any
    ) -> requests.Response:
        before = tally.database.snapshot()
        response = send(self, method, url, *args, **kwargs)
        _ = response.content  # the whole answer: the server is done with the request
        tally.sent(method, url, response, changed_tables(before, tally.database.snapshot()))
        return response

    monkeypatch.setattr(requests.Session, "request", request)


def validate(
    tally: Tally, case: Case[Any], response: schemathesis.Response, check: Callable[[], None]
) -> None:
    """Run schemathesis's checks on a response (``check``), counting what they find rather
    than stopping at it."""
    kind = "stateful" if tally.phase == "stateful" else "stateless"
    tally.by_operation[(case.operation.label, kind, response.status_code)] += 1
    tally.answered(case, response)
    try:
        check()
    except FailureGroup as failures:
        tally.checked(case, response, failures)


def generated(strategy: st.SearchStrategy[Case[Any]], tally: Tally) -> st.SearchStrategy[Case[Any]]:
    """``strategy``, less the draws schemathesis cannot finish: now and then, making a
    schema invalid gives one it cannot generate from ("Cannot generate an array with 1
    demanded elements"); such a draw is dropped, and counted."""

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case[Any]:
        try:
            return draw(strategy)
        except InvalidSchema as exc:
            tally.ungenerated[str(exc)] += 1
            hypothesis.reject()

    return draw_case()


def stateless(schema: Any, keys: Keys, known: dict[str, str], tally: Tally) -> None:
    """Each operation, in each generation mode: EXAMPLES requests, some of them on the
    seeded conversations (``known``: acme's and globex's, by id) rather than on random ids;
    those asked with the other tenant's key are cross-tenant probes. First, appends with
    ETag-shaped If-Match values of odd digits."""
    acme = next(cid for cid, tenant in known.items() if tenant == "acme")
    tally.phase = "odd ETags"
    append = schema["/v1/conversations/{conversation_id}/messages"]["POST"]
    for tag in ODD_ETAGS:
        case = append.Case(
            path_parameters={"conversation_id": acme},
            headers={"If-Match": tag},
            body={"messages": [USER_MESSAGE]},
            media_type="application/json",
        )
        headers = bearer(keys.tenant)
        response = case.call(headers=headers)
        validate(
            tally,
            case,
            response,
            partial(
                case.validate_response,
                response,
                headers=headers,
                transport_kwargs={"headers": headers},
            ),
        )

    for result in schema.get_all_operations():
        operation = result.ok()
        operation_id = schema.get_operation_id(operation)
        takes_id = "conversation_id" in operation.path_parameters
        others = bool(operation.body) or any(
            p.location != "path" for p in operation.iter_parameters()
        )
        for mode in MODES:
            if mode is GenerationMode.NEGATIVE and not (takes_id or others):
                continue  # nothing to make invalid (/healthz, /readyz)
            strategies = [operation.as_strategy(generation_mode=mode)]
            if takes_id and (mode is GenerationMode.POSITIVE or others):
                strategies += [
                    operation.as_strategy(
                        generation_mode=mode, path_parameters={"conversation_id": cid}
                    )
                    for cid in known
                ]
            tally.phase = f"stateless {mode.value}"

            @hypothesis.settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(
                case=generated(st.one_of(strategies), tally),
                key=st.sampled_from(keys.drawn(operation_id)),
            )
            def run(case: Case[Any], key: str) -> None:
                headers = credentials(case, key)
                response = case.call(headers=headers)
                cid = str((case.path_parameters or {}).get("conversation_id"))
                if headers and known.get(cid, keys.tenant_of(key)) != keys.tenant_of(key):
                    tally.asked_across_tenants(case.operation.label, cid, response)
                validate(
                    tally,
                    case,
                    response,
                    partial(
                        case.validate_response,
                        response,
                        headers=headers,
                        transport_kwargs={"headers": headers},
                    ),
                )

            run()


def stateful(schema: Any, keys: Keys, tally: Tally) -> None:
    """Chains of calls along the schema's links, valid and invalid steps mixed; after each
    conversation acme creates, globex asks for it and appends to it (404 both)."""
    machine: type[APIStateMachine] = schema.as_state_machine()
    get = schema["/v1/conversations/{conversation_id}"]["GET"]
    append = schema["/v1/conversations/{conversation_id}/messages"]["POST"]

    def probe_as_other_tenant(cid: str) -> None:
        for probe in (
            get.Case(path_parameters={"conversation_id": cid}),
            append.Case(
                path_parameters={"conversation_id": cid},
                body={"messages": [USER_MESSAGE]},
                media_type="application/json",
            ),
        ):
            headers = bearer(keys.other)
            response = probe.call(headers=headers)
            tally.asked_across_tenants(f"{probe.operation.label} as globex", cid, response)
            if response.status_code != 404:
                tally.cross_tenant_leaks.append(f"{probe.operation.label} {cid}: not 404")
            validate(
                tally,
                probe,
                response,
                partial(
                    probe.validate_response,
                    response,
                    headers=headers,
                    transport_kwargs={"headers": headers},
                ),
            )

    class Workflow(machine):  # type: ignore[misc,valid-type]
        def teardown(self) -> None:
            tally.scenarios += 1
            super().teardown()

        def get_call_kwargs(self, case: Case[Any]) -> dict[str, Any]:
            key = keys.natural(schema.get_operation_id(case.operation))
            return {"headers": credentials(case, key)}

        def after_call(self, response: schemathesis.Response, case: Case[Any]) -> None:
            super().after_call(response, case)
            operation_id = schema.get_operation_id(case.operation)
            if operation_id == "create_conversation" and response.status_code == 201:
                created = response.json()["conversation"]["conversation_id"]
                probe_as_other_tenant(str(UUID(created)))

        def validate_response(
            self,
            response: schemathesis.Response,
            case: Case[Any],
            additional_checks: Any = None,
            **kwargs: Any,
        ) -> None:
            validate(
                tally,
                case,
                response,
                partial(
                    super().validate_response,
                    response,
                    case,
                    additional_checks=additional_checks,
                    **kwargs,
                ),
            )

    tally.phase = "stateful"
    # The server's state is not Hypothesis's: a replayed prefix can meet another response
    # (a conversation id taken since, a head that moved) and draw differently. Hypothesis
    # then gives up on the run as flaky; the next run goes on with a new seed, as
    # schemathesis's own runner does, until SCENARIOS scenarios have run.
    for attempt in range(MAX_RESTARTS + 1):
        remaining = SCENARIOS - tally.scenarios
        if remaining <= 0:
            break
        try:
            hypothesis.seed(SEED + attempt)(Workflow).run(
                settings=hypothesis.settings(
                    max_examples=remaining,
                    stateful_step_count=STEPS,
                    deadline=None,
                    database=None,
                    phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
            )
        except InvalidSchema as exc:  # see `generated`: a draw it cannot finish
            tally.ungenerated[str(exc)] += 1
            tally.restarts += 1
        except Exception as exc:
            if not isinstance(exc, hypothesis.errors.Flaky) and not is_inconsistent_replay(exc):
                raise
            tally.restarts += 1


def test_schemathesis_against_live_server(
    server: tuple[Served, Keys],
    postgres_url: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
    answers_hold_no_internals: AnswerWatch,
) -> None:
    live, keys = server
    known = {
        seed_conversation(live.base, keys.tenant): "acme",
        seed_conversation(live.base, keys.other): "globex",
    }
    schema = schemathesis.openapi.from_url(
        f"{live.base}/openapi.json", config=schemathesis.Config()
    )
    schema.config.update(base_url=live.base)
    schema.config.generation.update(modes=list(MODES), max_examples=EXAMPLES)
    offer_valid_batches(schema)

    database = Database(postgres_url)
    tally = Tally(database)
    started = time.monotonic()
    try:
        with pytest.MonkeyPatch.context() as patch:
            count_every_request(tally, patch)
            stateless(schema, keys, known, tally)
            stateful(schema, keys, tally)
    finally:
        database.close()
    lines = tally.summary(time.monotonic() - started)
    failures = tmp_path / "failures.txt"
    failures.write_text(
        "\n".join(
            [f"server error: {line}" for line in tally.server_errors]
            + [f"schema violation: {line}" for line in tally.schema_violations]
            + [f"changed on 4xx: {line}" for line in tally.changed_on_4xx]
            + [f"refused, though the schema accepts it: {line}" for line in tally.refused_valid]
            + tally.other_all
        )
    )
    lines.append(f"every failure, in full: {failures}")
    print("\n".join(lines))
    record_property("schemathesis", "\n".join(lines))
    request.config.pluginmanager.register(
        TerminalSummary("schemathesis against episodic serve", lines)
    )

    # the server's log without its access log: what it said about the requests that failed
    log = "\n".join(
        line
        for line in live.log.read_text(errors="replace").splitlines()
        if " episodic.access " not in line and " uvicorn.access " not in line
    )[-5000:]
    assert not tally.server_errors, "\n".join(tally.server_errors[:20]) + "\n" + log
    assert not tally.schema_violations, "\n".join(tally.schema_violations[:20])
    assert not tally.changed_on_4xx, "\n".join(tally.changed_on_4xx[:20])
    assert not tally.cross_tenant_leaks, "\n".join(tally.cross_tenant_leaks[:20])
    assert not tally.refused_valid, "\n".join(tally.refused_valid[:20])
    # the run was what it says: invalid requests sent (and refused), chains that wrote
    assert tally.by_phase["stateless negative"] > 0
    assert tally.client_errors > 0
    assert tally.by_operation[(APPEND, "stateful", 201)] > 0, "no stateful append got through"
    assert sum(tally.positive_4xx.values()) > 0  # the count counts: some are state-dependent
    assert sum(tally.cross_tenant.values()) > 0
    # the watch on the internals' text (tests/server/conftest.py) read every answer
    assert answers_hold_no_internals.answers >= tally.total
