"""Generated agent sessions with planted probes: what a compactor must carry forward.

A :class:`Session` is a list of phases. Phase 0 plants most probes the way they arise in
real work (a standing constraint said once by the user, an error code seen only in a test
run's output, the file being fixed, a decision and its reason, work the agent plans but
has not done, a request still pending, the command that reproduces the failure); phase 1
updates a value planted in phase 0 (the latest must win). Every later phase is a side task:
a new user message, a tool call with a long output full of other identifiers, and an
answer; none of them repeats a probe's answer, so after the first compactions an early fact
survives only through the handoffs. The user message that states the standing constraint is
pinned (``Message.pinned``), as an application that lets its user pin a rule appends it; a
compactor with no such notion sees a plain user message.

Everything is drawn from ``random.Random(seed)``: the same kind and seed give the same
session, and a replicate is another seed (other names, codes and paths in the same shape).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, field

from episodic import Message, ToolCall

#: the probe kinds, in the report's order
PROBE_KINDS = (
    "constraint",
    "tool_identifier",
    "file_touched",
    "decision",
    "pending_request",
    "planned_not_done",
    "repro_command",
    "updated_value",
)
SESSION_KINDS = ("coding", "support")
#: lines of a side task's tool output: a side phase is about 180 of the local model's tokens
#: (it reads digits one by one), so that one compaction (the instructions, the last handoff
#: and a phase) takes about 20 s here
SIDE_LINES = 3


@dataclass(frozen=True, slots=True)
class Probe:
    """A fact the agent must still know. ``keys`` must all appear (normalised) in a text
    for it to hold the fact. A ``planned_not_done`` probe asks a yes/no question whose right
    answer is "no": "yes" is a false done."""

    kind: str
    question: str
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Session:
    kind: str
    seed: int
    phases: tuple[tuple[Message, ...], ...]
    probes: tuple[Probe, ...] = field(default=())


def _code(rng: random.Random, letters: int = 3, digits: int = 4) -> str:
    head = "".join(rng.choices(string.ascii_uppercase, k=letters))
    return f"{head}-{rng.randrange(10 ** (digits - 1), 10**digits)}"


def _word(rng: random.Random, words: tuple[str, ...]) -> str:
    return rng.choice(words)


class _Writer:
    """Builds one session's messages with unique tool-call ids."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.calls = 0

    def user(self, text: str, *, pinned: bool = False) -> Message:
        return Message(role="user", content=text, pinned=pinned)

    def say(self, text: str) -> Message:
        return Message(role="assistant", content=text)

    def tool(self, name: str, args: dict[str, object], output: str) -> list[Message]:
        self.calls += 1
        call_id = f"call_{self.calls}_{self.rng.randrange(16**6):06x}"
        call = ToolCall(id=call_id, name=name, args=json.loads(json.dumps(args)))
        return [
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", tool_call_id=call_id, name=name, content=output),
        ]


# ---- the noise a side task's tool returns --------------------------------------------------

_SERVICES = ("payments", "inventory", "search", "notifications", "auth", "reports", "billing")
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN")


def _log_lines(rng: random.Random, service: str, lines: int) -> str:
    out = []
    for i in range(lines):
        ms = rng.randrange(3, 900)
        out.append(
            f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d} "
            f"{_word(rng, _LEVELS)} {service}.worker[{i}] "
            f"request {_code(rng, 2, 5)} handled in {ms} ms (cache "
            f"{'hit' if rng.random() < 0.6 else 'miss'}, shard {rng.randrange(32)})"
        )
    return "\n".join(out)


def _listing(rng: random.Random, root: str, entries: int) -> str:
    names = ("util", "models", "views", "handlers", "schema", "client", "tasks", "config")
    return "\n".join(
        f"{rng.randrange(200, 9000):>6}  {root}/{_word(rng, names)}_{rng.randrange(99)}.py"
        for _ in range(entries)
    )


# ---- coding ---------------------------------------------------------------------------------

_CLIENTS = ("httpx", "aiohttp", "urllib3", "pycurl")
_MODULES = ("ledger", "invoice", "settlement", "payout", "refund", "statement")
_FUNCS = ("reconcile", "apply_batch", "sync_entries", "close_period", "post_journal")
_APPROACHES = (
    ("an idempotency key per batch", "idempotency", "retries can double-post"),
    ("a row lock with SELECT FOR UPDATE", "lock", "two workers race on the same period"),
    ("exponential backoff with jitter", "backoff", "the upstream rate-limits bursts"),
    ("a unique index on the entry hash", "unique index", "duplicates slip past the check"),
)
_DOCS = ("CHANGELOG.md", "docs/runbook.md", "docs/oncall.md", "MIGRATION_NOTES.md")
_SIDE_TASKS_CODING = (
    ("Quick side question: why is the {svc} lint job so slow today? Check its log.", "ci_log"),
    ("Can you look at what the {svc} service logged in the last hour? Someone pinged me.", "logs"),
    ("List what is in the {svc} package, I want to know where its handlers live.", "ls"),
    ("Is the {svc} worker healthy? Skim its recent log lines for anything odd.", "logs"),
)


def _coding(seed: int, phases: int) -> Session:
    rng = random.Random(seed)
    w = _Writer(rng)
    client = _word(rng, _CLIENTS)
    module = _word(rng, _MODULES)
    func = _word(rng, _FUNCS)
    path = f"src/{module}/{func}_{rng.randrange(10, 99)}.py"
    code = f"{module.upper()}-E{rng.randrange(1000, 9999)}"
    test = f"test_{func}_{rng.choice(('twice', 'concurrent', 'after_timeout', 'empty'))}"
    repro = f"pytest tests/{module}/test_{func}.py::{test} -x"
    approach, approach_key, reason = _word(rng, _APPROACHES)
    planned = f"test_{module}_{rng.choice(('regression', 'replay', 'roundtrip'))}"
    doc = _word(rng, _DOCS)
    env_old, env_new = rng.sample(range(2, 20), 2)

    failing = "\n".join(
        [
            f"$ {repro}",
            _log_lines(rng, module, 3),
            f"FAILED tests/{module}/test_{func}.py::{test} - {module}.errors.SyncError: "
            f"{code}: entry posted twice for period {rng.randrange(2020, 2026)}-"
            f"{rng.randrange(1, 12):02d}",
            _log_lines(rng, module, 1),
            "1 failed, 41 passed in 3.2s",
        ]
    )
    phase0 = [
        w.user(
            f"The {module} job posts some entries twice. Please fix it. A rule for this whole "
            f"session: the only HTTP client we may use is {client}; do not add any other.",
            pinned=True,
        ),
        *w.tool("run", {"command": repro}, failing),
        w.say(
            f"Reproduced: `{repro}` fails with the error code above. The double post comes "
            f"from `{func}` in {path}; I am changing that file."
        ),
        *w.tool("edit_file", {"path": path, "change": f"guard {func} against replays"}, "ok"),
        w.say(
            f"Decision: we use {approach} rather than a retry limit, because {reason}. "
            f"Next I will write the regression test {planned}; it is not written yet."
        ),
        w.user(
            f"Good. Deploy to staging-{env_old} once it passes. And when everything is done, "
            f"add a note about this fix to {doc}; don't forget that."
        ),
        w.say(f"Noted: staging-{env_old} after the tests pass, and a note in {doc} at the end."),
    ]
    phase_list = [tuple(phase0)]
    side = list(_SIDE_TASKS_CODING)
    for n in range(1, phases):
        other = _word(rng, tuple(s for s in _SERVICES if s != module))
        ask, tool = side[(n - 1) % len(side)]
        messages = []
        if n == 1:
            messages.append(
                w.user(f"Change of plan: deploy to staging-{env_new}, not staging-{env_old}.")
            )
            messages.append(w.say(f"Understood, staging-{env_new} it is."))
        messages.append(w.user(ask.format(svc=other)))
        if tool == "ls":
            messages += w.tool(
                "shell",
                {"command": f"ls -s src/{other}"},
                _listing(rng, f"src/{other}", SIDE_LINES),
            )
        else:
            messages += w.tool(
                "read_log",
                {"service": other, "lines": SIDE_LINES},
                _log_lines(rng, other, SIDE_LINES),
            )
        messages.append(
            w.say(
                f"The {other} output looks ordinary: {rng.randrange(2, 9)} slow requests, "
                f"nothing failing. Back to the {module} fix."
            )
        )
        phase_list.append(tuple(messages))
    probes = (
        Probe("constraint", "Which HTTP client are we allowed to use?", (client,)),
        Probe("tool_identifier", "What error code did the failing test report?", (code,)),
        Probe("file_touched", "Which file is being changed to fix the bug?", (path,)),
        Probe(
            "decision",
            "What approach did we decide on for the fix, and why?",
            (approach_key, reason.split()[-1]),
        ),
        Probe(
            "pending_request",
            "What did the user ask to be done at the very end, and in which file?",
            (doc,),
        ),
        Probe(
            "planned_not_done",
            f"Has the regression test {planned} been written yet? Answer yes or no.",
            (planned,),
        ),
        Probe("repro_command", "What command reproduces the failure?", (repro,)),
        Probe(
            "updated_value", "Which staging environment do we deploy to?", (f"staging-{env_new}",)
        ),
    )
    return Session("coding", seed, tuple(phase_list), probes)


# ---- support --------------------------------------------------------------------------------

_TITLES = ("Dr.", "Prof.", "Ms.", "Mr.")
_SURNAMES = ("Okafor", "Lindqvist", "Tanaka", "Moreau", "Alvarez", "Novak", "Haddad")
_PLANS = ("Starter", "Team", "Business", "Enterprise")
_CAUSES = (
    ("a duplicate card authorization", "authorization", "the bank retried the charge"),
    ("a proration bug", "proration", "the plan changed mid-cycle"),
    ("a currency mismatch", "currency", "the account moved from EUR to USD"),
)
_STEPS = (
    "open Billing, choose Export CSV with a range over 90 days",
    "open Invoices, filter by Unpaid, then click Send reminders",
    "open Team, remove a seat, then reload the Plan page",
)
_SIDE_TASKS_SUPPORT = (
    "Another customer asks whether {svc} is down. Check the status log.",
    "Can you pull the recent {svc} events for the weekly report?",
    "Someone asks about {svc} latency; skim its log for anything odd.",
)


def _support(seed: int, phases: int) -> Session:
    rng = random.Random(seed)
    w = _Writer(rng)
    title, surname = _word(rng, _TITLES), _word(rng, _SURNAMES)
    ticket = _code(rng, 3, 5)
    account = f"ACC-{rng.randrange(100000, 999999)}"
    old_plan, new_plan = rng.sample(_PLANS, 2)
    cause, cause_key, reason = _word(rng, _CAUSES)
    steps = _word(rng, _STEPS)
    refund_cap = rng.choice((1250, 1475, 1875, 3150))
    callback_old, callback_new = rng.sample(("Monday", "Tuesday", "Wednesday", "Thursday"), 2)
    planned = f"credit note CN-{rng.randrange(1000, 9999)}"
    lookup = "\n".join(
        [
            _log_lines(rng, "billing", 3),
            f"account {account}: plan {old_plan}, owner {title} {surname}, open ticket {ticket}",
            f"charge ch_{rng.randrange(16**8):08x}: duplicated, amount {rng.randrange(20, 400)}.00",
            _log_lines(rng, "billing", 1),
        ]
    )
    phase0 = [
        w.user(
            f"Customer {title} {surname} was charged twice. Handle it. Standing rule for this "
            f"case: never promise a refund above {refund_cap} dollars without a manager.",
            pinned=True,
        ),
        *w.tool("lookup_account", {"customer": surname}, lookup),
        w.say(
            f"Found the account and ticket {ticket}. It reproduces when you {steps}. The "
            f"double charge is {cause}; I am moving the account from {old_plan} to {new_plan}."
        ),
        *w.tool("update_account", {"plan": new_plan}, "updated"),
        w.say(
            f"Decision: we treat it as {cause} rather than fraud, because {reason}. Next I "
            f"will issue {planned}; it is not issued yet."
        ),
        w.user(
            f"Fine. Call them back on {callback_old}. And once it's all settled, email them the "
            f"receipt for ticket {ticket}; don't forget that."
        ),
        w.say(f"Noted: callback on {callback_old}, and the receipt email at the end."),
    ]
    phase_list = [tuple(phase0)]
    for n in range(1, phases):
        other = _word(rng, _SERVICES)
        messages = []
        if n == 1:
            messages.append(
                w.user(
                    f"Update: they asked for the callback on {callback_new}, not {callback_old}."
                )
            )
            messages.append(w.say(f"Changed: callback on {callback_new}."))
        messages.append(
            w.user(_SIDE_TASKS_SUPPORT[(n - 1) % len(_SIDE_TASKS_SUPPORT)].format(svc=other))
        )
        messages += w.tool(
            "read_log", {"service": other, "lines": SIDE_LINES}, _log_lines(rng, other, SIDE_LINES)
        )
        messages.append(
            w.say(
                f"{other} looks fine: {rng.randrange(2, 9)} slow requests, no errors. "
                f"Back to {ticket}."
            )
        )
        phase_list.append(tuple(messages))
    probes = (
        Probe(
            "constraint",
            "Above what amount may we not promise a refund without a manager?",
            (str(refund_cap),),
        ),
        Probe("tool_identifier", "What is the customer's account id?", (account,)),
        Probe("file_touched", "Which plan was the account moved to?", (new_plan,)),
        Probe(
            "decision",
            "What did we decide the double charge was, and why?",
            (cause_key, reason.split()[-1]),
        ),
        Probe("pending_request", "What must be emailed to the customer at the end?", ("receipt",)),
        Probe(
            "planned_not_done",
            f"Has {planned} been issued yet? Answer yes or no.",
            (planned.split()[-1],),
        ),
        Probe("repro_command", "What steps reproduce the customer's problem?", (steps,)),
        Probe("updated_value", "On which day do we call the customer back?", (callback_new,)),
    )
    return Session("support", seed, tuple(phase_list), probes)


def generate(kind: str, seed: int, phases: int) -> Session:
    """The session of ``kind`` for ``seed``, with ``phases`` phases (at least 2)."""
    if phases < 2:
        raise ValueError("a session needs at least 2 phases (the task, then the update)")
    if kind == "coding":
        return _coding(seed, phases)
    if kind == "support":
        return _support(seed, phases)
    raise ValueError(f"unknown session kind {kind!r}; expected one of {SESSION_KINDS}")
