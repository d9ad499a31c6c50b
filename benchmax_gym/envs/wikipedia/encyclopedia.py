"""A seeded fictional encyclopedia, and multi-hop questions over it.

Every name is made of invented syllables, so no model can answer from memory: the task measures
searching and reading. The world is a small graph of people, cities, countries, organisations and
works whose facts agree everywhere they are mentioned (a person's article and her city's article
name the same birth year and city). Articles are written in the corpus conventions that
:mod:`~benchmax_gym.envs.wikipedia.backends` reads: ``== Section ==`` headings, ``#REDIRECT [[...]]``
pages (a surname held by one person redirects to her), and ``may refer to:`` disambiguation pages
(a surname held by several).

Questions follow HotpotQA's two types, with 2-4 supporting articles recorded:

* bridge - a chain of relations from a named entity to a fact ("In what year was the city where
  the author of *The Vorsa Lantern* was born founded?"),
* comparison - two entities (each perhaps reached through a relation) compared on a fact; the
  answer is one of their names, or ``yes``/``no``.

Everything is drawn from numpy Generators seeded by the caller, so a seed is the same world and
the same questions in any process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmax_gym.core.tasks import pick, rand_int

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kh", "l", "m", "n", "p", "r", "s", "sk", "t", "th", "v", "z",
           "y", "ch")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ia", "ou", "ei", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "k", "m", "x", "nd")

OCCUPATIONS = ("novelist", "painter", "composer", "engineer", "physician", "architect", "poet", "astronomer")
ORG_KINDS = ("Institute", "Company", "Orchestra", "Press", "Academy", "Foundry", "Society", "Observatory")
WORK_KINDS = {  # kind -> (verb for its creator, what its year means)
    "novel": ("written", "published"),
    "opera": ("composed", "first performed"),
    "film": ("directed", "released"),
    "painting": ("painted", "completed"),
    "album": ("recorded", "released"),
}
WORK_NOUNS = ("Lantern", "Orchard", "Harbour", "Mirror", "Tide", "Garden", "Crown", "Winter", "Bridge", "Letters",
              "Clock", "Voyage")


def invented_word(rng: np.random.Generator, syllables: int) -> str:
    """A pronounceable word that no dictionary holds, e.g. ``Vorsathen``."""
    parts = [pick(rng, _ONSETS) + pick(rng, _VOWELS) for _ in range(syllables)]
    return ("".join(parts) + pick(rng, _CODAS)).capitalize()


@dataclass(eq=False)  # compared by identity: entities are graph nodes
class Entity:
    """One article's subject: ``kind`` is person, city, country, organisation or work."""

    title: str
    kind: str
    facts: dict[str, Any] = field(default_factory=dict)
    links: dict[str, "Entity"] = field(default_factory=dict)  # relation -> entity


@dataclass(frozen=True)
class Question:
    """A generated question: its text, answer, type and the articles that support it, in order;
    for a comparison whose answer is one of two names, ``options``: those names (the grader gives
    an answer naming the other one 0, so "A or B" is no hedge)."""

    question: str
    answer: str
    type: str
    supporting: tuple[str, ...]
    options: tuple[str, ...] = ()


class Encyclopedia:
    """The world for one seed: its entities, their articles as ``{title, text}`` records, and
    a question generator.

    Args:
        seed: which world.
        entities: about how many articles of entities (redirect and disambiguation pages come on top).
    """

    def __init__(self, seed: int, entities: int = 300):
        self.seed = seed
        rng = np.random.default_rng([seed, 0x5EED])
        self._used: set[str] = set()
        counts = {
            "country": max(3, entities // 25),
            "city": max(6, entities // 6),
            "organisation": max(6, entities // 6),
            "person": max(10, entities * 2 // 5),
        }
        counts["work"] = max(6, entities - sum(counts.values()))
        self.countries = [self._country(rng) for _ in range(counts["country"])]
        self.cities = [self._city(rng) for _ in range(counts["city"])]
        for country in self.countries:  # every country has a capital among its cities
            capital = pick(rng, [c for c in self.cities if c.links["country"] is country] or self.cities)
            capital.links["country"] = country
            country.links["capital"] = capital
        surnames = [self._name(rng, 2) for _ in range(max(4, counts["person"] * 2 // 3))]
        self.people = [self._person(rng, surnames) for _ in range(counts["person"])]
        self.organisations = [self._organisation(rng) for _ in range(counts["organisation"])]
        for person in self.people:
            person.links["employer"] = pick(rng, self.organisations)
        self.works = [self._work(rng) for _ in range(counts["work"])]
        self.entities = self.countries + self.cities + self.people + self.organisations + self.works
        self.by_title = {e.title: e for e in self.entities}
        self.records = [{"title": e.title, "text": self._article(e)} for e in self.entities] + self._surname_pages()

    # -- the world ----------------------------------------------------------------------------

    def _name(self, rng: np.random.Generator, syllables: int) -> str:
        while True:
            word = invented_word(rng, syllables)
            if word not in self._used and len(word) > 3:
                self._used.add(word)
                return word

    def _unique(self, make) -> str:
        while True:
            title = make()
            if title not in self._used:
                self._used.add(title)
                return title

    def _country(self, rng):
        name = self._name(rng, 2)
        title = self._unique(lambda: name + pick(rng, ("ia", "and", "a", "ora")))
        return Entity(title, "country", {
            "established": rand_int(rng, 900, 1800),
            "currency": self._name(rng, 2).lower(),
        })

    def _city(self, rng):
        title = self._name(rng, rand_int(rng, 2, 3))
        city = Entity(title, "city", {
            "founded": rand_int(rng, 400, 1850),
            "population": rand_int(rng, 20, 2_000) * 1_000 + rand_int(rng, 0, 999),
            "river": self._name(rng, 2),
        })
        city.links["country"] = pick(rng, self.countries)
        return city

    def _person(self, rng, surnames):
        surname = pick(rng, surnames)
        title = self._unique(lambda: f"{invented_word(rng, rand_int(rng, 1, 2))} {surname}")
        person = Entity(title, "person", {
            "born": rand_int(rng, 1780, 1990),
            "occupation": pick(rng, OCCUPATIONS),
            "surname": surname,
        })
        person.links["birthplace"] = pick(rng, self.cities)
        return person

    def _organisation(self, rng):
        kind = pick(rng, ORG_KINDS)
        title = self._unique(lambda: f"{invented_word(rng, 2)} {kind}")
        org = Entity(title, "organisation", {"founded": rand_int(rng, 1700, 2000), "org_kind": kind.lower()})
        org.links["headquarters"] = pick(rng, self.cities)
        org.links["founder"] = pick(rng, self.people)
        org.facts["founded"] = max(org.facts["founded"], org.links["founder"].facts["born"] + 20)
        return org

    def _work(self, rng):
        kind = pick(rng, tuple(WORK_KINDS))
        noun = pick(rng, WORK_NOUNS)
        word = invented_word(rng, 2)
        title = self._unique(lambda: pick(rng, (f"The {word} {noun}", f"{noun} of {word}", f"The {noun} at {word}")))
        creator = pick(rng, self.people)
        work = Entity(title, "work", {"kind": kind, "year": creator.facts["born"] + rand_int(rng, 20, 60)})
        work.links["creator"] = creator
        work.links["publisher"] = pick(rng, self.organisations)
        return work

    # -- articles -------------------------------------------------------------------------------

    def _article(self, e: Entity) -> str:
        f, links = e.facts, e.links
        if e.kind == "country":
            capital = links["capital"].title
            cities = sorted(c.title for c in self.cities if c.links["country"] is e)
            return (
                f"{e.title} is a country established in {f['established']}. Its capital is {capital} and its "
                f"currency is the {f['currency']}.\n\n== Cities ==\nCities of {e.title}: {', '.join(cities)}."
            )
        if e.kind == "city":
            country = links["country"]
            people = sorted(p.title for p in self.people if p.links["birthplace"] is e)
            lead = (
                f"{e.title} is a city in {country.title}, founded in {f['founded']}. It lies on the "
                f"{f['river']} river and has a population of {f['population']:,}."
            )
            if country.links.get("capital") is e:
                lead += f" It is the capital of {country.title}."
            body = f"\n\n== Notable people ==\n{', '.join(people)}." if people else ""
            return lead + body
        if e.kind == "person":
            born, city = f["born"], links["birthplace"]
            works = sorted((w.facts["year"], w.title) for w in self.works if w.links["creator"] is e)
            pronoun = e.title.split()[-1]
            article = "an" if f["occupation"][0] in "aeiou" else "a"
            text = (  # the city, not its country: reaching the country is a hop of its own
                f"{e.title} (born {born}) is {article} {f['occupation']} born in {born} in {city.title}."
                f"\n\n== Career ==\n{pronoun} worked for the {links['employer'].title}."
            )
            founded = sorted(o.title for o in self.organisations if o.links["founder"] is e)
            if founded:
                text += f" {pronoun} founded the {', the '.join(founded)}."
            if works:
                text += "\n\n== Works ==\n" + "\n".join(f"* {title} ({year})" for year, title in works)
            return text
        if e.kind == "organisation":
            article = "an" if f["org_kind"][0] in "aeiou" else "a"
            return (
                f"The {e.title} is {article} {f['org_kind']} founded in {f['founded']} by "
                f"{links['founder'].title}. It is headquartered in {links['headquarters'].title}."
            )
        verb, year_means = WORK_KINDS[f["kind"]]
        return (
            f"{e.title} is a {f['kind']} {verb} by {links['creator'].title}. It was {year_means} in "
            f"{f['year']} by the {links['publisher'].title}."
        )

    def _surname_pages(self) -> list[dict[str, str]]:
        holders: dict[str, list[Entity]] = {}
        for person in self.people:
            holders.setdefault(person.facts["surname"], []).append(person)
        pages = []
        for surname, people in sorted(holders.items()):
            if len(people) == 1:
                pages.append({"title": surname, "text": f"#REDIRECT [[{people[0].title}]]"})
            else:
                lines = "\n".join(
                    f"* [[{p.title}]], {p.facts['occupation']} (born {p.facts['born']})"
                    for p in sorted(people, key=lambda p: p.title)
                )
                pages.append({"title": surname, "text": f"{surname} may refer to:\n{lines}"})
        return pages

    # -- questions ------------------------------------------------------------------------------

    def question(self, rng: np.random.Generator, min_hops: int = 2, max_hops: int = 4,
                 comparison: float = 0.3) -> Question:
        """One question with between ``min_hops`` and ``max_hops`` supporting articles."""
        hops = rand_int(rng, min_hops, max_hops)
        if rng.random() < comparison:
            return self._comparison(rng, hops)
        return self._bridge(rng, hops)

    def _walk(self, rng: np.random.Generator, start: Entity, steps: int) -> tuple[str, list[Entity]]:
        """Follow ``steps`` relations from ``start``: (noun phrase of the end, the entities passed)."""
        phrase, path = start.title, [start]
        for _ in range(steps):
            options = [(r, t) for r, t in path[-1].links.items() if t not in path]
            if not options:
                break
            relation, target = pick(rng, options)
            phrase = _RELATION_PHRASES[relation].format(phrase)
            path.append(target)
        return phrase, path

    def _start(self, rng: np.random.Generator, steps: int, kinds: tuple[str, ...]) -> tuple[str, list[Entity]]:
        """A walk of ``steps`` relations that ends at an entity of one of ``kinds``."""
        while True:
            phrase, path = self._walk(rng, pick(rng, self.entities), steps)
            if path[-1].kind in kinds and len(path) == steps + 1:
                return phrase, path

    def _bridge(self, rng: np.random.Generator, hops: int) -> Question:
        phrase, path = self._start(rng, hops - 1, tuple(_FACT_QUESTIONS))
        end = path[-1]
        template, fact = pick(rng, _FACT_QUESTIONS[end.kind])
        answer = end.links[fact].title if fact in end.links else str(end.facts[fact])
        question = template.format(phrase)
        return Question(question[0].upper() + question[1:], answer, "bridge", tuple(e.title for e in path))

    def _comparison(self, rng: np.random.Generator, hops: int) -> Question:
        left_steps = (hops - 2) // 2 if rng.random() < 0.5 else (hops - 1) // 2
        kinds = tuple(k for k in _COMPARISONS if hops == 2 or k != "work")  # no relation leads to a work
        kind = pick(rng, kinds)
        template, fact, pick_larger = pick(rng, _COMPARISONS[kind])
        want_same = rng.random() < 0.5
        while True:
            a_phrase, a_path = self._start(rng, left_steps, (kind,))
            b_phrase, b_path = self._start(rng, hops - 2 - left_steps, (kind,))
            a, b = a_path[-1], b_path[-1]
            if a is b or set(a_path) & set(b_path):
                continue
            if fact == "country":  # yes/no: are both in the same country?
                same = a.links["country"] is b.links["country"]
                if same != want_same:
                    continue
                answer, options = ("yes" if same else "no"), ()
            else:
                if a.facts[fact] == b.facts[fact]:
                    continue
                answer = (a if (a.facts[fact] > b.facts[fact]) == pick_larger else b).title
                options = (a.title, b.title)
            question = template.format(a_phrase, b_phrase)
            supporting = tuple(e.title for e in a_path + b_path)
            return Question(question[0].upper() + question[1:], answer, "comparison", supporting, options)


_RELATION_PHRASES = {
    "birthplace": "the city where {} was born",
    "employer": "the organisation {} worked for",
    "headquarters": "the city where {} is headquartered",
    "founder": "the founder of {}",
    "creator": "the creator of {}",
    "publisher": "the organisation that published {}",
    "country": "the country in which {} lies",
    "capital": "the capital of {}",
}

_FACT_QUESTIONS = {  # kind -> [(template, fact or relation whose name is the answer)]
    "person": [("in what year was {} born?", "born"), ("what was the occupation of {}?", "occupation"),
               ("in which city was {} born?", "birthplace")],
    "city": [("in what year was {} founded?", "founded"), ("on which river does {} lie?", "river"),
             ("in which country is {}?", "country")],
    "organisation": [("in what year was {} founded?", "founded"), ("who founded {}?", "founder"),
                     ("in which city is {} headquartered?", "headquarters")],
    "work": [("in what year was {} first made public?", "year"), ("who created {}?", "creator")],
    "country": [("what is the currency of {}?", "currency"), ("what is the capital of {}?", "capital")],
}

_COMPARISONS = {  # kind -> [(template, fact, whether the larger value wins)]
    "person": [("who was born first, {} or {}?", "born", False), ("who was born later, {} or {}?", "born", True)],
    "city": [("which was founded earlier, {} or {}?", "founded", False),
             ("which has the larger population, {} or {}?", "population", True),
             ("are {} and {} in the same country?", "country", None)],
    "organisation": [("which was founded earlier, {} or {}?", "founded", False)],
    "work": [("which was made public first, {} or {}?", "year", False)],
}
