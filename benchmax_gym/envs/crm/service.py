"""``benchmax/CRM-Service-v0``: a customer on the line (issue 31).

A generated task is a customer with an open case in the generated org. Their opening message names
the product and what they want (a refund, or news of their case) but not who they are: the agent
must ask for the order number and the email address on the order (facts only the simulated
customer holds, in ``task.private["user"]``), look the order and the case up with the CRM tools,
apply the service policy (:data:`SERVICE_POLICY`, in the system prompt) and change the org
accordingly (``issue_refund``, ``update_case``), telling the customer what it did.

Reward (``resolved``) is 1 only if both hold (a conjunction, kept as a ``min`` of the two
components until the rubric has ``all_of``; both are reported, weight 0):

* ``state``: the final org equals the expected one: the target case's expected values, exactly
  the expected refund (amount) and no other row changed (the CRM-v0 collateral check);
* ``statements``: every required statement was made to the customer (in an assistant reply the
  customer heard: without tool calls, parsed, not cut for its length), in a sentence that is not
  a question: the refunded amount; the 30-day rule and the replacement; the case number and its
  status (the number only when no other case's number is named: a list is a guess; the status
  with the number or the word "status"); or that the customer cannot be verified ("I cannot
  verify your identity", with no claim that they were).

Task types: ``refund_request`` (within 30 days of the order: a refund of the item's price, else a
replacement; a fifth of the customers give an email that is not the order's: say you cannot verify
them and change nothing; the type does not say which) and ``case_status`` (say the case's number
and status, change nothing). Like every generated split, contamination-free by construction: the org, its
people and products are generated, and the answers follow from its rows.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmax_gym.core.rubric import RewardFn, Rubric
from benchmax_gym.core.sources import GeneratedSource
from benchmax_gym.core.sqlite_heap import safe_grading
from benchmax_gym.core.tasks import GeneratedTasks, Task, pick
from benchmax_gym.core.users import STOP
from benchmax_gym.envs.crm.org import CASE_STATUSES, REFUND_WINDOW_DAYS
from benchmax_gym.envs.crm.rubric import collateral_changes
from benchmax_gym.envs.crm.tasks import outside_query_bounds_drawn

SERVICE_TYPES = ("refund_request", "case_status")
UNVERIFIED_SHARE = 0.2  # refund requests whose customer gives an email that is not the order's
OPEN_STATUSES = ("New", "Working", "Escalated")
REPLACEMENT = "Replacement sent"

SERVICE_POLICY = f"""# Service policy

1. Identify the customer first: ask for their order number and the email address on the order, and check in
   the CRM that the email is the one of the order's bill-to contact. If it is not, tell the customer you cannot
   verify their identity, and change nothing.
2. The customer's case is their open case (Status New, Working or Escalated) about the product they name, on
   that order.
3. Refunds: a refund may be issued only when the case was opened within {REFUND_WINDOW_DAYS} days of the order
   date (Case.CreatedDate minus Order.EffectiveDate). Refund the full price of the order item (UnitPrice times
   Quantity) with issue_refund, which closes the case, and tell the customer the amount refunded.
4. When a refund is not allowed, tell the customer that refunds are only possible within {REFUND_WINDOW_DAYS}
   days of the order date and offer a replacement instead: close the case with update_case, status Closed and
   resolution "{REPLACEMENT}", and tell the customer a replacement is on its way.
5. Asked about a case's progress, tell the customer the case number and its status; change nothing.
6. Never change anything the customer did not ask for. When the request is handled, tell the customer; they
   end the conversation."""

SYSTEM_PROMPT = (
    "You are a customer-service agent talking with a customer, with access to the company's Salesforce CRM in "
    "a SQLite database. Use the tools to look things up (read-only SQL with `query`, or the typed tools) and to "
    "change records (`update_case`, `issue_refund`). Today's date is Organization.Today in the database. "
    "Write to the customer in plain text (a reply without a tool call); they answer you. Follow the policy.\n\n"
    + SERVICE_POLICY
)

CASE_SQL = """SELECT c.Id, c.CaseNumber, c.Status, c.CreatedDate, o.OrderNumber, o.EffectiveDate, ct.Email, p.Name,
ROUND(i.UnitPrice * i.Quantity, 2), julianday(c.CreatedDate) - julianday(o.EffectiveDate), iss.Description__c
FROM "Case" c JOIN OrderItem i ON i.Id = c.OrderItemId__c JOIN "Order" o ON o.Id = i.OrderId
JOIN Contact ct ON ct.Id = o.BillToContactId JOIN Product2 p ON p.Id = i.Product2Id
JOIN Issue__c iss ON iss.Id = c.IssueId__c
WHERE c.Status IN ('New', 'Working', 'Escalated')
AND (SELECT COUNT(*) FROM "Case" d WHERE d.OrderItemId__c = c.OrderItemId__c
     AND d.Status IN ('New', 'Working', 'Escalated')) = 1
ORDER BY c.Id"""

# What the solver runs (the customer's order number, email and product are what the conversation gave it)
ORDER_SQL = """SELECT o.Id, o.EffectiveDate, ct.Email FROM "Order" o JOIN Contact ct ON ct.Id = o.BillToContactId
WHERE o.OrderNumber = :order"""
OPEN_CASE_SQL = """SELECT c.Id, c.CaseNumber, c.Status, c.CreatedDate, ROUND(i.UnitPrice * i.Quantity, 2)
FROM "Case" c JOIN OrderItem i ON i.Id = c.OrderItemId__c JOIN Product2 p ON p.Id = i.Product2Id
WHERE i.OrderId = :order_id AND p.Name = :product AND c.Status IN ('New', 'Working', 'Escalated')"""


def amount_text(amount: float) -> str:
    return f"{amount:.2f}"


def _service_task(rng: np.random.Generator, index: int, con: sqlite3.Connection, task_types: tuple[str, ...],
                  org_name: str) -> Task:
    cases = con.execute(CASE_SQL).fetchall()
    # a case too close to the refund window's edge would hang on the time of day: left out
    cases = [c for c in cases if abs(c[9] - REFUND_WINDOW_DAYS) >= 1]
    if not cases:
        raise ValueError(f"the org {org_name} has no open case for CRM-Service tasks; use a bigger org_size")
    task_type = pick(rng, task_types)
    if task_type == "refund_request":
        eligible = bool(rng.random() < 0.5)
        wanted = [c for c in cases if (c[9] <= REFUND_WINDOW_DAYS) == eligible] or cases
        case = pick(rng, wanted)
    else:
        case = pick(rng, cases)
    case_id, number, status, _, order, _, email, product, amount, days, issue = case
    eligible = days <= REFUND_WINDOW_DAYS
    unverified = task_type == "refund_request" and bool(rng.random() < UNVERIFIED_SHARE)
    if unverified:  # the customer gives the email of another account: the agent must not act
        email = pick(rng, [e for (e,) in con.execute("SELECT Email FROM Contact ORDER BY Id LIMIT 50") if e != email])
    facts = {"order number": order, "email": email}
    problem = issue.rstrip(".").lower()
    if task_type == "refund_request":
        prompt = f"Hi, I have a problem with my {product}: {problem}. I would like a refund, please."
        goal = f"You want a refund for your {product}; if the agent cannot refund it, you accept a replacement."
        if unverified:
            expected = {"Case": {}, "refunds": {}}
            statements = ["verify"]
        elif eligible:
            expected = {"Case": {case_id: {"Status": "Closed", "Resolution__c": "Refund issued"}},
                        "refunds": {case_id: amount_text(amount)}}
            statements = [amount_text(amount)]
        else:
            expected = {"Case": {case_id: {"Status": "Closed", "Resolution__c": REPLACEMENT}}, "refunds": {}}
            statements = [f"{REFUND_WINDOW_DAYS} days", "replacement"]
    else:
        prompt = f"Hi, I reported a problem with my {product} a while ago. What is happening with my case?"
        goal = f"You want to know the status of your case about your {product}."
        expected = {"Case": {}, "refunds": {}}
        statements = [number, status]
    user = {"facts": facts, "goal": goal, "problem": problem}
    return Task(
        id=f"crm-service-{org_name}-{index}",
        prompt=prompt,
        answer={**expected, "statements": statements},
        solution={"type": task_type, "params": {"product": product}},
        metadata={"source": "generated", "type": task_type, "reward_metric": "db_state+statements"},
        private={"user": user},
    )


@dataclass(frozen=True)
class GeneratedService(GeneratedSource):
    """``tasks="generated"``: customers with an open case in the generated org;
    ``task_types`` picks the kinds (default: all of :data:`SERVICE_TYPES`)."""

    task_types: Any = None

    def __post_init__(self):
        super().__post_init__()
        types = self.task_types
        if types is not None:
            types = (types,) if isinstance(types, str) else types
            if not isinstance(types, (list, tuple)) or not types or any(t not in SERVICE_TYPES for t in types):
                raise ValueError(f"task_types must be a non-empty list of {SERVICE_TYPES}, got {self.task_types!r}")

    def build(self, env: Any) -> GeneratedTasks:
        types = self.task_types or SERVICE_TYPES
        types = tuple(dict.fromkeys((types,) if isinstance(types, str) else types))
        con, name = env.org.pristine, env.org_name
        return GeneratedTasks(lambda rng, i: outside_query_bounds_drawn(_service_task, rng, i, con, types, name),
                              seed=self.task_seed, size=self.num_tasks)


# -- the scripted customer ----------------------------------------------------------------------

FACT_WORDS = {"order number": ("order number", "order #", "order no", "order id"),
              "email": ("email", "e-mail", "mail address")}
PROBLEM_WORDS = ("problem", "issue", "describe", "what happened", "wrong")
_SENTENCE = re.compile(r"(?<=[.?!\n])")  # split after each sentence's end: linear in hostile text


def scripted_customer(conversation: list[dict[str, str]], task: Task) -> str | None:
    """The default customer: deterministic. Answers each question the agent's last message asks
    about a fact they hold (order number, email) or about the problem; any other message ends the
    conversation (the agent is telling them the outcome). Never says anything else they know."""
    private = task.private["user"]
    last = conversation[-1]["content"] if conversation and conversation[-1]["role"] == "assistant" else ""
    questions = [q.lower() for q in _SENTENCE.split(last[:20_000]) if q.rstrip().endswith("?")]
    said = [f"My {fact} is {private['facts'][fact]}." for fact, words in FACT_WORDS.items()
            if any(w in q for q in questions for w in words)]
    if not said and any(w in q for q in questions for w in PROBLEM_WORDS):
        said = [f"The problem is: {private['problem']}."]
    return " ".join(said) if said else f"Thank you, that is all. {STOP}"


# -- grading ------------------------------------------------------------------------------------


def _refunds(con: sqlite3.Connection, case_id: str) -> list[str]:
    return [r[0] for r in con.execute("SELECT NewValue__c FROM CaseHistory__c WHERE CaseId__c = ? AND Field__c = "
                                      "'Refund' ORDER BY rowid", (case_id,))]


def said_to_customer(messages: list[dict[str, Any]], heard: set[int] | None = None) -> str:
    """What the agent wrote to the customer: its replies the customer heard (``heard``: the indices
    of the conversation, ``episode.user.turns``), else its replies without tool calls. A reply that
    failed to parse as a call, or was cut for its length, has no ``tool_calls`` and never reached
    the customer: a refund "told" only there was not told."""
    return "\n".join(str(m.get("content") or "") for i, m in enumerate(messages)
                     if m.get("role") == "assistant" and not m.get("tool_calls") and (heard is None or i in heard))


_DIGIT_GROUP = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # the comma of "1,196.97"


def made(statement: str, text: str) -> bool:
    """``statement`` appears in ``text`` as whole words (any case): "59.99" in "$59.99", not in
    "159.99"; "1196.97" in "$1,196.97" (digits grouped by commas, as amounts are often written)."""
    text = _DIGIT_GROUP.sub("", text)
    return re.search(rf"(?<![\w.]){re.escape(statement.lower())}(?![\w]|\.\d)", text.lower()) is not None


_STATUS = "|".join(CASE_STATUSES)
_STATUS_PAIRS = re.compile(  # two statuses side by side: "New, Working or Escalated", "New/Working"
    rf"\b({_STATUS})\b(?=(?:[\s,;/|()*'\"-]|\b(?:or|and|either|nor|maybe|perhaps|possibly)\b)+\b({_STATUS})\b)", re.I)


def statuses_listed(text: str) -> bool:
    """Whether ``text`` offers several statuses as alternatives (a list of them: a guess)."""
    return any(a.lower() != b.lower() for a, b in _STATUS_PAIRS.findall(text))


_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w]|\.\d)")  # a whole number, as :func:`made` reads one
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+|\n")  # (not the point of "59.99")


# a closing offer tagged onto a statement: "I refunded $59.99, anything else?", "... - is there
# anything else I can help with?" (the statement before it is told; the offer asks nothing of it)
_CLOSING_OFFER = re.compile(
    r"\s*[,;:\u2013\u2014-]\s*(?:(?:is|was)\s+there\s+|(?:can|could|may)\s+I\s+(?:help\s+(?:you\s+)?with|do)\s+"
    r"|do\s+you\s+need\s+)?anything\s+else(?:\s+\w+){0,6}\s*\?\s*$", re.I)
_ASKS = re.compile(  # a sentence that opens as a question ("Would you like a refund of $59.99, anything else?")
    r"\s*(?:would|could|shall|should|can|do|does|did|is|are|was|were|will|may|might|have|has|what|how|why|when|"
    r"where|which|who)\b", re.I)


def told(text: str) -> list[str]:
    """The sentences of ``text`` that tell the customer something: a question asks ("Is this a new
    case?", "Shall I check whether I can verify you?") and states nothing; a statement that ends
    in a closing offer ("I refunded $59.99, anything else?") is told, the offer left out."""
    sentences = []
    for sentence in _SENTENCE_END.split(text.replace("\u2019", "'")):
        statement = _CLOSING_OFFER.sub("", sentence)
        if statement != sentence and _ASKS.match(statement):
            continue
        if statement.strip() and not statement.rstrip().endswith("?"):
            sentences.append(statement)
    return sentences


_CLAUSE = re.compile(r"[;:]|\b(?:but|however|although|though)\b", re.I)
_NEGATION = re.compile(r"\bnot\b|n't\b|\bnever\b|\bcannot\b|\bunable\b|\bfailed\b", re.I)
_CANNOT_VERIFY = re.compile(  # "cannot verify", "unable to confirm", "won't be able to verify", "doesn't match"
    r"(?:\bnot|n't|\bnever|\bcannot|\bunable to|\bfailed to)\s+(?:be\s+able\s+to\s+)?(?:\w+\s+){0,2}?"
    r"(?:verify|verified|confirm|confirmed|authenticate|authenticated|match|matches|matched)\b|\bmismatch", re.I)
_CLAIMS_SUCCESS = re.compile(  # "I have verified your identity", "you are now verified", "I've refunded 59.99"
    r"\b(?:verified|confirmed|authenticated)\s+(?:you\b|your\s+identity|who\s+you\s+are)"
    r"|\b(?:identity|you)\s+(?:is|are|has\s+been|have\s+been|was|were)\s+(?:now\s+|successfully\s+)?"
    r"(?:verified|confirmed|authenticated)|\byou're\s+(?:now\s+)?(?:verified|confirmed|authenticated)"
    r"|\bverification\s+(?:is\s+|was\s+|has\s+been\s+)?(?:successful|complete|passed)"
    r"|(?:\bhave|'ve|\bhas\s+been|\bhave\s+been|\bwas|\bwere)\s+(?:\w+\s+)?refunded"
    r"|\brefund\s+(?:has\s+been|was|is)\s+(?:\w+\s+)?(?:issued|processed|on\s+its\s+way)"
    r"|\bissued\s+(?:you\s+)?(?:a|the|your)\s+refund", re.I)


# an aside of up to three words, not a negation: ", unfortunately," "— at this time —"
_ASIDE = re.compile(r"[,\u2013\u2014]\s*(?!(?:not|never|no)\b)\w+(?:\s+\w+){0,2}\s*[,\u2013\u2014]", re.I)
# "however" set off right after a negation ("I cannot, however, verify you") is an aside, not the
# start of a clause ("I could not verify you at first, however, I have verified you" is a hedge)
_NEGATION_HOWEVER = re.compile(
    r"(\bnot|n't|\bnever|\bcannot|\bunable to|\bfailed to)\s*[,\u2013\u2014]\s*(?:however|though)\s*[,\u2013\u2014]", re.I)


def told_cannot_verify(text: str) -> bool:
    """Whether ``text`` tells the customer they cannot be verified ("I cannot verify your identity",
    "the email doesn't match") and nowhere claims the opposite (a hedge: "I could not verify you at
    first, but I have verified your identity"; "I have refunded 59.99"). The required statement was
    the word "verify", which "Let me verify that for you" made. An aside set off by commas or dashes
    is read past ("I cannot, unfortunately, verify your identity" was not read as saying it), and so
    is a "however" set off right after the negation ("I cannot, however, verify you")."""
    clauses = [_ASIDE.sub(" ", c) for s in told(text) for c in _CLAUSE.split(_NEGATION_HOWEVER.sub(r"\1", s))]
    claimed = any(_CLAIMS_SUCCESS.search(c) and not _NEGATION.search(c) for c in clauses)
    return not claimed and any(_CANNOT_VERIFY.search(c) for c in clauses)


def status_told(status: str, number: str, text: str) -> bool:
    """Whether ``text`` tells the case's status: in a sentence (not a question) that names the case's
    number or says "status". Statuses are common words: "I am working on it", "Is this a new
    problem?" made the statement "Working", "New"."""
    return any(made(status, s) and (made(number, s) or re.search(r"\bstatus\b", s, re.I)) for s in told(text))


def statement_made(statement: str, statements: list[str], text: str) -> bool:
    """Whether one of a task's required ``statements`` was made in ``text`` (what the agent told the
    customer): in a sentence that is not a question ("Would you like a replacement?" offers one, it
    does not say one is on its way; "Would a refund of $59.99 work?" refunds nothing)."""
    if statement == "verify":  # (the unverified customer's: that they cannot be verified)
        return told_cannot_verify(text)
    if statement in CASE_STATUSES and len(statements) == 2:  # (a status task's: [number, status])
        return status_told(statement, statements[0], text)
    return made(statement, "\n".join(told(text)))


def other_cases_named(con: sqlite3.Connection, text: str, allowed: set[str]) -> set[str]:
    """The CaseNumbers of the org that ``text`` names, besides ``allowed``: an agent that lists
    every open case's number (73 of them, without asking the customer anything) "made" the
    statement of the right one."""
    numbers = sorted(set(_NUMBER.findall(text)) - allowed)
    if not numbers:
        return set()
    return {n for (n,) in con.execute('SELECT CaseNumber FROM "Case" WHERE CaseNumber IN (SELECT value FROM '
                                      "json_each(?))", (json.dumps(numbers),))}


@safe_grading
def service_grade(episode: Any, messages: list[dict[str, Any]]) -> dict[str, float]:
    """``{"state", "statements"}``, computed once per episode (the components share it)."""
    state = episode.state
    if "service_grade" in state:
        return state["service_grade"]
    answer, db = episode.task.answer, state["db"]
    expected_cases = answer["Case"]
    collateral = db.con.total_changes - db.tool_changes  # writes that bypassed the tools: none expected
    if db.touched:
        collateral += collateral_changes(db.con, state["org"].pristine, {"Case": expected_cases}, db.touched)
    values_hold = all(
        db.con.execute(f'SELECT "{column}" FROM "Case" WHERE Id = ?', (case_id,)).fetchone() == (value,)
        for case_id, columns in expected_cases.items() for column, value in columns.items())
    refunds_hold = all(_refunds(db.con, case_id) == ([answer["refunds"][case_id]] if case_id in answer["refunds"] else [])
                       for case_id in set(db.touched) | set(answer["refunds"]))
    user = getattr(episode, "user", None)
    text = said_to_customer(messages, getattr(user, "turns", None))
    said = all(statement_made(s, answer["statements"], text) for s in answer["statements"])
    if said and set(answer["statements"]) & set(CASE_STATUSES):
        said = not statuses_listed(text)  # "New, Working or Escalated" names the status too: a guess
    pristine = state["org"].pristine
    if said and other_cases_named(pristine, "\n".join(answer["statements"]), set()):
        # the case's number is one to state: naming others besides it is a guess, not a statement
        said = not other_cases_named(pristine, text, {*answer["statements"], *_customer_numbers(episode.task)})
    state["service_grade"] = {
        "state": float(collateral == 0 and values_hold and refunds_hold),
        "statements": float(said),
    }
    return state["service_grade"]


def _customer_numbers(task: Task) -> set[str]:
    """The numbers the customer gave (their order number may look like a CaseNumber)."""
    facts = (task.private or {}).get("user", {}).get("facts", {})
    return set(_NUMBER.findall(" ".join(map(str, facts.values()))))


def state(episode, messages) -> float:
    """1.0 when the final org is the expected one (reported; part of ``resolved``)."""
    return service_grade(episode, messages)["state"]


def statements(episode, messages) -> float:
    """1.0 when every required statement was made to the customer (reported; part of ``resolved``)."""
    return service_grade(episode, messages)["statements"]


def resolved(episode, messages) -> float:
    """The reward: the org is right AND the customer was told (a min: ``all_of(state, statements)``
    once the rubric has it)."""
    grade = service_grade(episode, messages)
    return min(grade["state"], grade["statements"])


def service_rubric() -> Rubric:
    return Rubric([RewardFn("resolved", resolved, 1.0), RewardFn("state", state, 0.0),
                   RewardFn("statements", statements, 0.0)])


# -- the reference solver -----------------------------------------------------------------------

_ORDER_NUMBER = re.compile(r"order number is (\S+?)\.?(?:\s|$)")
_EMAIL = re.compile(r"email is (\S+@\S+?)\.?(?:\s|$)")


def _rows(result: str) -> list[list[Any]]:
    import json

    return json.loads(result)["rows"]


def service_plan(task: Task):
    """One episode of the reference agent: yields ``("say", text)`` (to the customer; receives
    their answer) or ``(tool, arguments)`` (receives the result). It knows the product (the opening
    message names it) and learns the rest from the customer and the tools; it applies the policy
    itself (it never reads the task's answer)."""
    from benchmax_gym.envs.crm.tasks import render_sql

    product = task.solution["params"]["product"]
    heard = yield "say", "I can help with that. What is your order number, and what is the email address on the order?"
    order, email = _ORDER_NUMBER.search(heard).group(1), _EMAIL.search(heard).group(1)
    found = _rows((yield "query", {"sql": render_sql(ORDER_SQL, {"order": order})}))
    if not found or found[0][2].lower() != email.lower():
        yield "say", "I am sorry, I cannot verify your identity with this email address, so I cannot change anything."
        return
    order_id, ordered, _ = found[0]
    case_id, number, status, created, amount = _rows(
        (yield "query", {"sql": render_sql(OPEN_CASE_SQL, {"order_id": order_id, "product": product})}))[0]
    if task.solution["type"] == "case_status":
        yield "say", f"Your case {number} about the {product} has the status {status}."
        return
    days = _rows((yield "query", {"sql": f"SELECT julianday('{created}') - julianday('{ordered}')"}))[0][0]
    if days <= REFUND_WINDOW_DAYS:
        yield "issue_refund", {"case_id": case_id, "amount": amount}
        yield "say", f"I have refunded {amount_text(amount)} for your {product} (case {number})."
    else:
        yield "update_case", {"case_id": case_id, "status": "Closed", "resolution": REPLACEMENT}
        yield "say", (f"Refunds are only possible within {REFUND_WINDOW_DAYS} days of the order date, so I cannot "
                      f"refund it, but a replacement for your {product} is on its way (case {number}).")


class ServiceSolver:
    """``solver(obs, info) -> action`` for CRM-Service-v0: plays :func:`service_plan`; after its
    last statement it stays polite until the customer ends the conversation."""

    def __init__(self, env: Any):
        self.env = env.unwrapped
        self.plan = None

    def __call__(self, obs: str, info: dict[str, Any]) -> str:
        if info.get("turn") == 0:
            self.plan = service_plan(self.env.episode.task)
            step = next(self.plan)
        else:
            messages = info.get("messages", [])
            result = next((m["content"] for m in messages if m["role"] in ("tool", "user")), "")
            if any(m["role"] == "tool" for m in messages) and result.startswith("Error"):
                raise RuntimeError(f"task {self.env.episode.task.id}: the solver's call failed: {result}")
            try:
                step = self.plan.send(result)
            except StopIteration:
                step = ("say", "Thank you for contacting us.")
        name, arguments = step
        return arguments if name == "say" else self.env.format.render_calls([(name, arguments)])
