"""The org: a generated Salesforce-style CRM in SQLite, cached on disk, copied per episode.

:func:`build_org` writes an org from ``(seed, size)`` with numpy's Generator only, so the same
pair always gives the same rows. :func:`cached_org` builds it once into the ``crm`` folder of
the shared cache (:func:`~benchmax_gym.core.cache.cache_root`), atomically: a temp file then a rename.
:class:`Org` loads that file into memory once per environment, and :meth:`Org.episode_copy`
copies it into a fresh in-memory database with SQLite's backup API, so an episode's updates never
reach the next one.

The schema follows the Salesforce objects CRMArena uses; ids are 18-character Salesforce ids
(key prefix, 12 characters, the case-insensitivity checksum). Distributions: orders peak around the
holidays (cases follow orders), issues depend on the product category, agents differ in speed,
issue specialities and how often they transfer, states differ in closure time. ``Organization.Today``
is the org's fixed "today": relative dates resolve against it.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from benchmax_gym.core.cache import cache_root, cached_file, whole_sqlite
from benchmax_gym.core.sqlite_heap import outside_query_bounds
from benchmax_gym.core.tasks import pick, rand_int

SCHEMA = """
CREATE TABLE Organization (Id TEXT PRIMARY KEY, Name TEXT NOT NULL, Today TEXT NOT NULL);
CREATE TABLE User (Id TEXT PRIMARY KEY, FirstName TEXT, LastName TEXT, Name TEXT, Email TEXT, Alias TEXT,
    Title TEXT, IsActive INTEGER NOT NULL, CreatedDate TEXT);
CREATE TABLE Account (Id TEXT PRIMARY KEY, Name TEXT, Industry TEXT, BillingState TEXT, BillingCountry TEXT,
    Phone TEXT, CreatedDate TEXT);
CREATE TABLE Contact (Id TEXT PRIMARY KEY, FirstName TEXT, LastName TEXT, Name TEXT, Email TEXT, Phone TEXT,
    AccountId TEXT REFERENCES Account(Id), MailingState TEXT, CreatedDate TEXT);
CREATE TABLE ProductCategory (Id TEXT PRIMARY KEY, Name TEXT, Description TEXT);
CREATE TABLE Product2 (Id TEXT PRIMARY KEY, Name TEXT, ProductCode TEXT, Description TEXT,
    ProductCategoryId TEXT REFERENCES ProductCategory(Id), IsActive INTEGER);
CREATE TABLE Pricebook2 (Id TEXT PRIMARY KEY, Name TEXT, IsStandard INTEGER, IsActive INTEGER);
CREATE TABLE PricebookEntry (Id TEXT PRIMARY KEY, Pricebook2Id TEXT REFERENCES Pricebook2(Id),
    Product2Id TEXT REFERENCES Product2(Id), UnitPrice REAL, IsActive INTEGER);
CREATE TABLE "Order" (Id TEXT PRIMARY KEY, OrderNumber TEXT, AccountId TEXT REFERENCES Account(Id),
    BillToContactId TEXT REFERENCES Contact(Id), Pricebook2Id TEXT REFERENCES Pricebook2(Id), Status TEXT,
    EffectiveDate TEXT);
CREATE TABLE OrderItem (Id TEXT PRIMARY KEY, OrderId TEXT REFERENCES "Order"(Id), Product2Id TEXT REFERENCES Product2(Id),
    PricebookEntryId TEXT REFERENCES PricebookEntry(Id), Quantity INTEGER, UnitPrice REAL);
CREATE TABLE Issue__c (Id TEXT PRIMARY KEY, Name TEXT, Description__c TEXT);
CREATE TABLE "Case" (Id TEXT PRIMARY KEY, CaseNumber TEXT UNIQUE, Subject TEXT, Description TEXT, Status TEXT,
    Priority TEXT, Origin TEXT, ContactId TEXT REFERENCES Contact(Id), AccountId TEXT REFERENCES Account(Id),
    OwnerId TEXT REFERENCES User(Id), IssueId__c TEXT REFERENCES Issue__c(Id),
    OrderItemId__c TEXT REFERENCES OrderItem(Id), Resolution__c TEXT, CreatedDate TEXT, ClosedDate TEXT);
CREATE TABLE CaseHistory__c (Id TEXT PRIMARY KEY, CaseId__c TEXT REFERENCES "Case"(Id), Field__c TEXT,
    OldValue__c TEXT, NewValue__c TEXT, CreatedDate TEXT);
CREATE TABLE Knowledge__kav (Id TEXT PRIMARY KEY, ArticleNumber TEXT, Title TEXT, UrlName TEXT, Summary TEXT,
    FAQ_Answer__c TEXT, Category__c TEXT, IssueId__c TEXT REFERENCES Issue__c(Id), Resolution__c TEXT,
    PublishStatus TEXT, LastPublishedDate TEXT);
CREATE TABLE EmailMessage (Id TEXT PRIMARY KEY, ParentId TEXT REFERENCES "Case"(Id), Subject TEXT, TextBody TEXT,
    FromAddress TEXT, ToAddress TEXT, Incoming INTEGER, MessageDate TEXT);
CREATE TABLE LiveChatTranscript (Id TEXT PRIMARY KEY, CaseId TEXT REFERENCES "Case"(Id),
    ContactId TEXT REFERENCES Contact(Id), OwnerId TEXT REFERENCES User(Id), Status TEXT, Body TEXT,
    StartTime TEXT, EndTime TEXT);
CREATE VIRTUAL TABLE Knowledge__kav_fts USING fts5(Title, Summary, FAQ_Answer__c, content='Knowledge__kav');
CREATE INDEX case_owner ON "Case"(OwnerId);
CREATE INDEX case_issue ON "Case"(IssueId__c);
CREATE INDEX case_item ON "Case"(OrderItemId__c);
CREATE INDEX history_case ON CaseHistory__c(CaseId__c);
CREATE INDEX item_order ON OrderItem(OrderId);
CREATE INDEX order_contact ON "Order"(BillToContactId);
CREATE INDEX email_case ON EmailMessage(ParentId);
CREATE INDEX chat_case ON LiveChatTranscript(CaseId);
"""

OBJECTS = (
    "Organization", "User", "Account", "Contact", "ProductCategory", "Product2", "Pricebook2", "PricebookEntry",
    "Order", "OrderItem", "Issue__c", "Case", "CaseHistory__c", "Knowledge__kav", "EmailMessage", "LiveChatTranscript",
)  # fmt: skip
"""The tables the model sees (the FTS index and SQLite's own tables are internal)."""

CASE_STATUSES = ("New", "Working", "Escalated", "Closed")
CASE_PRIORITIES = ("Low", "Medium", "High")
ORIGINS = ("Email", "Phone", "Web", "Chat")
RESOLUTIONS = ("Replacement sent", "Refund issued", "Troubleshooting resolved", "Repair scheduled", "No fault found")

# The policies written into the knowledge base; policy-violation answers apply them by SQL.
REFUND_WINDOW_DAYS = 30
HIGH_PRIORITY_RESPONSE_HOURS = 4
MAX_TRANSFERS = 2

DEFAULT_SIZE = 2000
MIN_SIZE, MAX_SIZE = 200, 100_000
CASES_PER_AGENT = 40

STATES = ("CA", "TX", "NY", "FL", "WA", "IL", "MA", "GA", "CO", "AZ", "OR", "NC", "MI", "PA", "MN")
STATE_WEIGHTS = (12, 9, 9, 7, 5, 5, 4, 4, 3, 3, 3, 3, 3, 4, 2)
CATEGORIES = (
    ("Smart Thermostats", ("Nimbus Thermostat", "Nimbus Thermostat Pro", "Aero Climate Hub", "Aero Climate Mini")),
    ("Security Cameras", ("Sentinel Cam 2", "Sentinel Cam Outdoor", "Vigil Doorbell", "Vigil Floodlight Cam")),
    ("Wireless Earbuds", ("Echo Buds", "Echo Buds Pro", "Pulse Sport Earbuds", "Pulse Lite Earbuds")),
    ("Robot Vacuums", ("Sweepo S1", "Sweepo S3 Max", "Dustra Mop Robot", "Dustra Compact")),
    ("E-Readers", ("Pagewise Reader", "Pagewise Reader Plus", "Lumen Tablet 7", "Lumen Tablet 10")),
    ("Fitness Trackers", ("Stride Band", "Stride Band HR", "Vita Watch", "Vita Watch Active")),
)
# Issue | what the customer reports | its usual resolution (one row per line)
ISSUES = tuple(tuple(cell.strip() for cell in line.split("|")) for line in """
Battery drains quickly | The device loses charge much faster than specified. | Replacement sent
Device will not power on | The device shows no sign of life after charging. | Replacement sent
Connectivity drops | The device loses its Wi-Fi or Bluetooth connection repeatedly. | Troubleshooting resolved
App pairing fails | The companion app cannot find or pair with the device. | Troubleshooting resolved
Damaged on arrival | The device arrived broken or scratched. | Replacement sent
Missing parts | Parts or accessories were missing from the box. | Replacement sent
Billing discrepancy | The customer was charged a different amount than expected. | Refund issued
Late delivery | The order arrived later than promised. | Refund issued
Firmware update fails | A firmware update stops part-way or bricks the device. | Repair scheduled
Overheating | The device becomes hot during normal use. | Repair scheduled
Unexpected noise | The device makes clicking, buzzing or grinding sounds. | No fault found
Display defect | The screen shows dead pixels, lines or flicker. | Repair scheduled
""".strip().splitlines())
FIRST_NAMES = (
    "Alice", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Keira", "Liam", "Maya",
    "Nikhil", "Olivia", "Pablo", "Quinn", "Rosa", "Samir", "Tara", "Umar", "Vera", "Wes", "Xena", "Yusuf", "Zoe",
    "Aaron", "Bianca", "Chloe", "Dmitri", "Emma", "Felix", "Gita", "Hugo", "Ivy", "Jack", "Kenji", "Lena", "Marco",
)  # fmt: skip
LAST_NAMES = (
    "Anderson", "Baker", "Castillo", "Dubois", "Edwards", "Fischer", "Garcia", "Hansen", "Ibrahim", "Jensen",
    "Kowalski", "Lopez", "Murphy", "Nakamura", "Okafor", "Patel", "Quinlan", "Rossi", "Schmidt", "Tanaka", "Usman",
    "Varga", "Walsh", "Xu", "Yilmaz", "Zhang", "Bennett", "Carter", "Dawson", "Ellis", "Foster", "Gupta", "Hughes",
)  # fmt: skip
COMPANY_WORDS = ("Acme", "Blue", "Cedar", "Delta", "Evergreen", "Falcon", "Granite", "Harbor", "Iris", "Juniper",
                 "Keystone", "Lumen", "Maple", "North", "Orbit", "Pioneer", "Quartz", "River", "Summit", "Terra")
COMPANY_KINDS = ("Labs", "Retail", "Holdings", "Partners", "Systems", "Outfitters", "Goods", "Supply", "Group", "Co")
INDUSTRIES = ("Retail", "Technology", "Healthcare", "Education", "Hospitality", "Manufacturing", "Finance")
WARRANTY_MONTHS = (6, 12, 18, 24, 36)
RESTOCKING_FEES = (0, 10, 15, 20, 25)
SUPPORT_EMAIL = "support@northwind.example"
_ORIGIN_CDF = np.cumsum((0.4, 0.25, 0.15, 0.2))
_PRIORITY_CDF = np.cumsum((0.3, 0.5, 0.2))

# Salesforce key prefixes (the first three characters of an id say its object).
PREFIXES = {
    "Organization": "00D", "User": "005", "Account": "001", "Contact": "003", "ProductCategory": "0ZG",
    "Product2": "01t", "Pricebook2": "01s", "PricebookEntry": "01u", "Order": "801", "OrderItem": "802",
    "Issue__c": "a03", "Case": "500", "CaseHistory__c": "a02", "Knowledge__kav": "ka0", "EmailMessage": "02s",
    "LiveChatTranscript": "570",
}  # fmt: skip

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_CHECKSUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
_UPPER_BITS = str.maketrans({ch: "1" if ch.isupper() else "0" for ch in _BASE62})
_SCRAMBLE = 0x9E3779B97F4A7C15 % 62**10  # odd and not a multiple of 31: a bijection modulo 62**10


def sf_id(obj: str, n: int, salt: int = 0) -> str:
    """The ``n``-th 18-character Salesforce id of ``obj``: prefix, 12 scrambled base-62 characters
    (a bijection of ``n``, so ids never collide), then Salesforce's case checksum."""
    x = ((n + 1 + salt * 1_000_003) * _SCRAMBLE) % 62**10
    body = ""
    for _ in range(10):
        x, r = divmod(x, 62)
        body += _BASE62[r]
    id15 = PREFIXES[obj] + "5g" + body
    # each 5-character chunk: a bit per upper-case letter (first character = lowest bit)
    return id15 + "".join(_CHECKSUM[int(id15[k:k + 5].translate(_UPPER_BITS)[::-1], 2)] for k in (0, 5, 10))


def _cdf(weights) -> np.ndarray:
    weights = np.asarray(weights, float)
    return np.cumsum(weights / weights.sum())


def _draw(rng: np.random.Generator, cdf: np.ndarray) -> int:
    """An index drawn with the probabilities behind ``cdf`` (much faster than ``rng.choice(p=...)``)."""
    return min(int(np.searchsorted(cdf, rng.random(), side="right")), len(cdf) - 1)


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S")


def _seasonal_days(rng: np.random.Generator, start: dt.date, days: int, n: int) -> np.ndarray:
    """``n`` day offsets in ``[0, days)``, denser around the holidays and growing over time."""
    dates = [start + dt.timedelta(days=i) for i in range(days)]
    weight = np.array([
        (1.0 + 0.45 * np.cos(2 * np.pi * ((d.month + d.day / 31) - 12.2) / 12)) * (1 + 0.4 * i / days)
        for i, d in enumerate(dates)
    ])
    return np.sort(rng.choice(days, size=n, p=weight / weight.sum()))


def build_org(path: str | os.PathLike, seed: int = 0, size: int = DEFAULT_SIZE) -> None:
    """Write the org for ``(seed, size)`` to a new SQLite file at ``path``; ``size`` is the number
    of cases (one agent per 40 cases; accounts, contacts and orders scale with it)."""
    rows = _OrgBuilder(seed, size).rows
    con = sqlite3.connect(path)
    try:
        con.executescript(SCHEMA)
        for obj, table_rows in rows.items():
            if table_rows:
                marks = ",".join("?" * len(table_rows[0]))
                con.executemany(f'INSERT INTO "{obj}" VALUES ({marks})', table_rows)
        con.execute("INSERT INTO Knowledge__kav_fts(Knowledge__kav_fts) VALUES ('rebuild')")
        con.commit()
        con.execute("VACUUM")
    finally:
        con.close()


class _OrgBuilder:
    """Draws every row of one org, object by object, into ``rows`` (object -> list of tuples)."""

    def __init__(self, seed: int, size: int):
        self.rng = rng = np.random.default_rng([seed, size, 7])
        self.seed = seed
        self.today = dt.date(2025, 1, 1) + dt.timedelta(days=int(rng.integers(0, 365)))
        self.midnight = dt.datetime.combine(self.today, dt.time())
        self.start = self.today - dt.timedelta(days=800)
        self.rows: dict[str, list[tuple]] = {obj: [] for obj in OBJECTS}
        self.rows["Organization"].append((self.id("Organization", 0), "Northwind Devices Support", self.today.isoformat()))
        self.agents(max(5, size // CASES_PER_AGENT))
        self.customers(max(20, size // 8), max(60, size // 2))
        self.catalog()
        self.knowledge()
        self.orders(int(size * 1.25))
        self.cases(size)

    def id(self, obj: str, n: int) -> str:
        return sf_id(obj, n, self.seed)

    def add(self, obj: str, *values: Any) -> str:
        """Append a row whose Id is the next id of ``obj``; returns that Id."""
        new = self.id(obj, len(self.rows[obj]))
        self.rows[obj].append((new, *values))
        return new

    def person(self) -> tuple[str, str]:
        return pick(self.rng, FIRST_NAMES), pick(self.rng, LAST_NAMES)

    def agents(self, n: int) -> None:
        """Support agents, each with a speed (a handle-time factor), a transfer propensity and two
        issue specialities (cases of those issues are routed to them more often)."""
        rng = self.rng
        self.speed = rng.lognormal(0.0, 0.35, n)
        self.transfer_rate = rng.gamma(2.0, 0.2, n)
        specialities = [set(rng.choice(len(ISSUES), size=2, replace=False).tolist()) for _ in range(n)]
        self.routing_cdf = [_cdf([4.0 if i in s else 1.0 for s in specialities]) for i in range(len(ISSUES))]
        taken = set()
        while len(taken) < n:
            first, last = self.person()
            if (first, last) in taken:
                continue
            taken.add((first, last))
            hired = dt.datetime.combine(self.start - dt.timedelta(days=rand_int(rng, 30, 900)), dt.time(9))
            self.add("User", first, last, f"{first} {last}", f"{first}.{last}@northwind.example".lower(),
                     (first[0] + last[:4]).lower(), "Support Agent", 1, _iso(hired))
        self.agent_ids = [r[0] for r in self.rows["User"]]

    def customers(self, n_accounts: int, n_contacts: int) -> None:
        """Accounts spread over states (weighted by population), contacts spread over accounts."""
        rng = self.rng
        weights = np.array(STATE_WEIGHTS, float)
        self.account_state = rng.choice(len(STATES), size=n_accounts, p=weights / weights.sum())
        since = _iso(self.midnight - dt.timedelta(days=900))
        for i in range(n_accounts):
            company = f"{pick(rng, COMPANY_WORDS)} {pick(rng, COMPANY_WORDS)} {pick(rng, COMPANY_KINDS)} #{i + 1}"
            self.add("Account", company, pick(rng, INDUSTRIES), STATES[self.account_state[i]], "US",
                     f"555-{1000 + i:04d}", since)
        self.account_ids = [r[0] for r in self.rows["Account"]]
        self.contact_account = rng.integers(n_accounts, size=n_contacts)
        for i in range(n_contacts):
            first, last = self.person()
            a = int(self.contact_account[i])
            self.add("Contact", first, last, f"{first} {last}", f"{first}.{last}{i}@mail.example".lower(),
                     f"555-{2000 + i:04d}", self.account_ids[a], STATES[self.account_state[a]], since)
        self.contact_ids = [r[0] for r in self.rows["Contact"]]

    def catalog(self) -> None:
        """Categories, products with list prices in the standard price book, issues, and how
        likely each issue is for each product."""
        rng = self.rng
        book = self.add("Pricebook2", "Standard Price Book", 1, 1)
        self.product_entry, self.product_price = [], []
        for c, (category, products) in enumerate(CATEGORIES):
            category_id = self.add("ProductCategory", category, f"All {category.lower()} we sell and support.")
            for product in products:
                p = len(self.rows["Product2"])
                price = float(np.round(rng.uniform(39, 399), 0)) - 0.01
                product_id = self.add("Product2", product, f"ND-{c + 1}{p + 1:03d}",
                                      f"{product}, one of our {category.lower()}.", category_id, 1)
                self.product_entry.append(self.add("PricebookEntry", book, product_id, price, 1))
                self.product_price.append(price)
        self.book = book
        self.product_ids = [r[0] for r in self.rows["Product2"]]
        for issue, description, _ in ISSUES:
            self.add("Issue__c", issue, description)
        self.issue_ids = [r[0] for r in self.rows["Issue__c"]]
        issue_p = rng.dirichlet(np.full(len(ISSUES), 0.6), size=len(self.product_ids))
        self.issue_cdf = [_cdf(row) for row in 0.85 * issue_p + 0.15 / len(ISSUES)]

    def knowledge(self) -> None:
        """Warranty and returns articles per category, a troubleshooting article per issue (with the
        resolution to close its cases with), and the three support policies."""
        articles = []
        for category, _ in CATEGORIES:
            months, fee = pick(self.rng, WARRANTY_MONTHS), pick(self.rng, RESTOCKING_FEES)
            articles += [
                (f"Warranty coverage for {category}", f"What the limited warranty on {category.lower()} covers.",
                 f"{category} are covered by a limited warranty of {months} months from the delivery date. "
                 "The warranty covers manufacturing defects, not accidental damage.", "Warranty", None, None),
                (f"Returns and restocking fees for {category}", f"How returns of {category.lower()} work.",
                 f"Unopened {category.lower()} can be returned for free. A restocking fee of {fee}% of the price "
                 "applies to opened items.", "Returns", None, None),
            ]
        for issue_id, (issue, description, resolution) in zip(self.issue_ids, ISSUES):
            articles.append((f"Troubleshooting: {issue}", description,
                             f"Walk the customer through the standard checks for '{issue.lower()}'. If the problem "
                             f"persists, close the case with the resolution '{resolution}'.",
                             "Troubleshooting", issue_id, resolution))
        articles += [
            ("Refund policy", "When a refund may be issued.",
             f"Refunds may be issued only when the customer opens the case within {REFUND_WINDOW_DAYS} days of the "
             "order date. Later requests are offered a repair or replacement instead.", "Policy", None, None),
            ("First response policy for high-priority cases", "How fast high-priority cases must be answered.",
             "High-priority cases must receive a first email response from an agent within "
             f"{HIGH_PRIORITY_RESPONSE_HOURS} hours of case creation.", "Policy", None, None),
            ("Case transfer policy", "How often a case may change hands.",
             f"A case may be transferred between agents at most {MAX_TRANSFERS} times; after that a supervisor "
             "must take it.", "Policy", None, None),
        ]
        published = self.today.isoformat() + "T09:00:00"
        for k, (title, summary, faq, category, issue, resolution) in enumerate(articles):
            url = "-".join("".join(ch for ch in title.lower() if ch.isalnum() or ch == " ").split())
            self.add("Knowledge__kav", f"{k + 1001:09d}", title, url, summary, faq, category, issue, resolution,
                     "Online", published)

    def orders(self, n: int) -> None:
        """Orders, denser around the holidays and growing over time, of one to three products."""
        rng = self.rng
        self.order_days = _seasonal_days(rng, self.start, 795, n)
        self.order_contact = rng.integers(len(self.contact_ids), size=n)
        self.item_order, self.item_product = [], []
        for o in range(n):
            c = int(self.order_contact[o])
            day = self.start + dt.timedelta(days=int(self.order_days[o]))
            order = self.add("Order", f"{o + 1:08d}", self.account_ids[int(self.contact_account[c])],
                             self.contact_ids[c], self.book, "Activated", day.isoformat())
            for p in rng.choice(len(self.product_ids), size=rand_int(rng, 1, 3), replace=False):
                self.add("OrderItem", order, self.product_ids[p], self.product_entry[p], rand_int(rng, 1, 3),
                         self.product_price[p])
                self.item_order.append(o)
                self.item_product.append(int(p))

    def cases(self, n: int) -> None:
        """Cases about order items, opened days after the order; each routed (or still new),
        maybe transferred, closed after a handle time set by the issue, the agent and the state,
        with emails for Email/Web cases and a transcript for Chat cases."""
        rng = self.rng
        opened = []
        for item in rng.integers(len(self.item_order), size=n):
            ordered = dt.datetime.combine(self.start + dt.timedelta(days=int(self.order_days[self.item_order[item]])),
                                          dt.time())
            created = ordered + dt.timedelta(days=float(rng.exponential(16.0)), hours=float(rng.uniform(8, 18)))
            if created >= self.midnight - dt.timedelta(hours=1):
                created = ordered + (self.midnight - ordered) * float(rng.uniform(0.1, 0.9))
            opened.append((created.replace(microsecond=0), int(item)))
        opened.sort()
        self.state_factor = rng.lognormal(0.0, 0.25, len(STATES))
        self.issue_hours = rng.uniform(10, 60, len(ISSUES))
        for n, (created, item) in enumerate(opened):
            self.case(n, created, item)

    def case(self, n: int, created: dt.datetime, item: int) -> None:
        rng = self.rng
        case_id = self.id("Case", n)
        p = self.item_product[item]
        issue = _draw(rng, self.issue_cdf[p])
        c = int(self.order_contact[self.item_order[item]])
        a = int(self.contact_account[c])
        origin = ORIGINS[_draw(rng, _ORIGIN_CDF)]
        priority = CASE_PRIORITIES[_draw(rng, _PRIORITY_CDF)]
        product = self.rows["Product2"][p][1]
        subject = f"{ISSUES[issue][0]} - {product}"
        self.add("CaseHistory__c", case_id, "Case Creation", None, None, _iso(created))
        owner = first_owner = closed = resolution = None
        status = "New"
        if (self.midnight - created).days >= 6 or rng.random() >= 0.6:  # else: not yet routed
            n_agents = len(self.agent_ids)
            owner = first_owner = _draw(rng, self.routing_cdf[issue])
            t = created + dt.timedelta(minutes=float(rng.uniform(2, 90)))
            self.add("CaseHistory__c", case_id, "Owner Assignment", None, self.agent_ids[owner], _iso(t))
            handle = dt.timedelta(hours=float(rng.lognormal(np.log(self.issue_hours[issue]), 0.5))
                                  * self.speed[owner] * self.state_factor[self.account_state[a]])
            transfers = int(rng.poisson(self.transfer_rate[owner]))
            for _ in range(transfers):
                t = t + handle * float(rng.uniform(0.1, 0.4))
                new = int(rng.integers(n_agents - 1))
                new += new >= owner
                self.add("CaseHistory__c", case_id, "Owner Assignment", self.agent_ids[owner], self.agent_ids[new],
                         _iso(t))
                owner = new
            closed = (created + handle * (1 + 0.35 * transfers)).replace(microsecond=0)
            backlog = (self.midnight - closed).days < 21 and rng.random() < 0.5  # recent cases wait longer
            if closed < self.midnight and not backlog:
                status = "Closed"
                resolution = ISSUES[issue][2] if rng.random() < 0.75 else pick(rng, RESOLUTIONS)
                self.add("CaseHistory__c", case_id, "Case Closed", None, "Closed", _iso(closed))
            else:
                status, closed = ("Working", "Escalated")[int(rng.random() < 0.2)], None
        self.rows["Case"].append((
            case_id, f"{n + 1001:08d}", subject, f"{ISSUES[issue][1]} Product: {product}.", status, priority, origin,
            self.contact_ids[c], self.account_ids[a], None if owner is None else self.agent_ids[owner],
            self.issue_ids[issue], self.id("OrderItem", item), resolution, _iso(created), closed and _iso(closed),
        ))
        if origin in ("Email", "Web"):
            self.emails(case_id, subject, c, first_owner, created, closed, priority)
        if origin == "Chat" and first_owner is not None:
            self.chat(case_id, c, first_owner, created, product, issue)

    def emails(self, case_id, subject, contact, agent, created, closed, priority) -> None:
        """The customer's email that opened the case, and the agent's first reply (its delay
        depends on the priority; some replies break the first-response policy)."""
        customer = self.rows["Contact"][contact]
        self.add("EmailMessage", case_id, subject, f"Hello, I need help: {subject.lower()}. Thanks, {customer[1]}",
                 customer[4], SUPPORT_EMAIL, 1, _iso(created))
        if agent is None:
            return
        median = {"High": 2.0, "Medium": 6.0, "Low": 12.0}[priority]
        reply = (created + dt.timedelta(hours=float(self.rng.lognormal(np.log(median), 0.6)))).replace(microsecond=0)
        if reply < (closed or self.midnight):
            self.add("EmailMessage", case_id, "Re: " + subject,
                     f"Hi {customer[1]}, thanks for reaching out. We are looking into it.", SUPPORT_EMAIL,
                     customer[4], 0, _iso(reply))

    def chat(self, case_id, contact, agent, created, product, issue) -> None:
        customer = self.rows["Contact"][contact]
        agent_name = self.rows["User"][agent][3]
        body = (f"Agent {agent_name}: Hi {customer[1]}, how can I help?\n"
                f"Customer: My {product} has a problem: {ISSUES[issue][1].lower()}\n"
                f"Agent {agent_name}: Sorry to hear that. I have opened a case and will follow up.\n"
                "Customer: Thanks.")
        end = (created + dt.timedelta(minutes=float(self.rng.uniform(4, 30)))).replace(microsecond=0)
        self.add("LiveChatTranscript", case_id, customer[0], self.agent_ids[agent], "Completed", body,
                 _iso(created), _iso(end))


def cached_org(seed: int = 0, size: int = DEFAULT_SIZE, directory: str | os.PathLike | None = None) -> Path:
    """The org file for ``(seed, size)``, built on first use (temp file, then an atomic rename, so
    concurrent builders and crashes never leave a half-written org behind; one cut short is rebuilt).
    Safe from another episode's query nearing its heap bound: a build that fails for memory is
    dropped and runs again (:func:`~benchmax_gym.core.sqlite_heap.outside_query_bounds`)."""
    target = cache_root("crm", directory) / f"org-v2-seed{seed}-size{size}.sqlite"
    return outside_query_bounds(cached_file, target, lambda path: build_org(path, seed, size), whole_sqlite)


class Org:
    """An org loaded into memory once; :meth:`episode_copy` gives each episode its own database.

    ``pristine`` is the in-memory master (never written to); graders compare episode copies with it.
    Loading it is safe from another episode's query nearing its heap bound (run again alone).
    """

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"org database {str(path)!r} does not exist")
        self.pristine, self.tables = outside_query_bounds(self._load, path)
        self.path = path

    @staticmethod
    def _load(path: Path) -> tuple[sqlite3.Connection, list[str]]:
        """``path`` copied into a new in-memory database, and its tables."""
        pristine = None
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            pristine = sqlite3.connect(":memory:", check_same_thread=False)
            source.backup(pristine)
            tables = [r[0] for r in pristine.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
                "AND name NOT LIKE '%_fts%' ORDER BY name")]
            return pristine, tables
        except BaseException as exc:
            if pristine is not None:
                pristine.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise ValueError(f"{str(path)!r} is not a SQLite database: {exc}") from None
            raise
        finally:
            source.close()

    def episode_copy(self) -> sqlite3.Connection:
        """A fresh in-memory copy of the org (SQLite backup API), private to one episode."""
        con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self.pristine.backup(con)
        return con

    def today(self) -> str | None:
        """The org's fixed "today" (``Organization.Today``), when it has one."""
        try:
            row = self.pristine.execute("SELECT Today FROM Organization LIMIT 1").fetchone()
        except sqlite3.Error:
            return None
        return row[0] if row else None

    def close(self) -> None:
        self.pristine.close()
