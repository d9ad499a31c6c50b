"""Question/answer tasks from a user's documents: ``benchmax-gym tasks from-corpus DOCS --out tasks.jsonl``.

The documents (:mod:`.corpus`) are chunked and indexed with the Wikipedia family's local backend
(SQLite FTS5, the index ``benchmax/Wikipedia-v0`` then searches), and candidates come from one
of two generators:

* templates (offline, deterministic, the default): facts read from the text by rules - a
  sentence's year or number (a cloze: "which year fills the blank"), a document's defining first
  sentence ("X is a ..." -> "What is the name of a ...?"); bridge questions (document A names
  document B's title: find B through A, then read B's fact, B's name never said); comparison
  questions (two documents with a dated event of the same kind: "Which was founded earlier?").
* a model (``ModelGenerator``: any OpenAI-compatible endpoint through eval's client, so its
  retries, timeouts and key handling): single-hop prompts over one chunk, bridge prompts over a
  chunk and the document it names, comparison prompts over two documents the index finds alike.
  A reply is hostile text: only a JSON object with a short ``question`` and ``answer`` is taken.

Every candidate then passes filters that need no model, in order, each counted:
``answer_in_support`` (the answer occurs in its supporting chunks, titles included: a question
whose answer the documents do not hold cannot be graded), ``question_free_of_answer`` (the
question does not give the answer away; for comparisons, where both names are the options, the
compared values must not appear), ``unique`` (no two questions the same after normalisation,
nor two with the same answer from the same chunks and kind); and, with a ``verify_model``,
``verified``: a second call answers from the chunks alone, kept only if it agrees (EM, or F1 >=
0.8 after SQuAD normalisation). Tasks are written as JSON Lines for ``tasks="file"``:
``{id, prompt, answer, solution: {supporting: [titles]}, metadata: {source, type, generator}}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, TextIO

import numpy as np

from benchmax_gym.data.corpus import Chunk, Document, chunk_document, corpus_records, read_documents, sentences
from benchmax_gym.envs.wikipedia.rubric import exact_match, f1_score, normalize_answer

FILTERS = ("answer_in_support", "question_free_of_answer", "unique", "verified")
KINDS = ("single", "bridge", "comparison")
MAX_QUESTION_CHARS = 600
MAX_ANSWER_CHARS = 120
MAX_PER_DOCUMENT = {"single": 4, "bridge": 2, "comparison": 1}

_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
_NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\w,]|\.\d)")
_DEFINITION = re.compile(r"^(?P<subject>.{1,120}?)\s+(?:\([^)]*\)\s+)?(?:is|was|are|were)\s+(?P<desc>(?:a|an|the|one)\s.{8,200}?)\.?$")
_EVENT = re.compile(r"\b(founded|established|born|built|opened|released|published|completed|discovered|formed|"
                    r"launched|introduced)\b[^.;]{0,40}?\b(1[0-9]{3}|20[0-9]{2})\b", re.IGNORECASE)


@dataclass
class Candidate:
    question: str
    answer: str
    supporting: list[Chunk]
    kind: str  # single, bridge or comparison
    generator: str  # "template" or "model:NAME"
    values: tuple[str, ...] = ()  # what a comparison compares (must not appear in its question)

    def support_text(self) -> str:
        return "\n".join(f"{c.title}\n{c.text}" for c in self.supporting)

    def task(self, index: int) -> dict[str, Any]:
        titles = list(dict.fromkeys(c.title for c in self.supporting))
        return {"id": f"corpus-{index}", "prompt": self.question, "answer": self.answer,
                "solution": {"supporting": titles, "chunks": [[c.title, c.index] for c in self.supporting]},
                "metadata": {"source": "corpus", "type": self.kind, "generator": self.generator, "hops": len(titles)}}


# -- the offline template generator -----------------------------------------------------------------


def _mask_title(sentence: str, title: str, replacement: str) -> str | None:
    found = re.search(re.escape(title), sentence, re.IGNORECASE)
    if not found:
        return None
    if found.start() == 0:
        replacement = replacement[:1].upper() + replacement[1:]
    return sentence[:found.start()] + replacement + sentence[found.end():]


def _usable(sentence: str) -> bool:
    return 30 <= len(sentence) <= 320 and "==" not in sentence


def _cloze_facts(chunk: Chunk) -> list[tuple[str, str, str]]:
    """``(kind, sentence, value)`` for the years and numbers of ``chunk``'s sentences."""
    facts = []
    for sentence in sentences(chunk.text):
        if not _usable(sentence):
            continue
        year = _YEAR.search(sentence)
        if year:
            facts.append(("year", sentence, year.group()))
            continue
        number = _NUMBER.search(sentence)
        if number:
            facts.append(("number", sentence, number.group()))
    return facts


def _cloze_question(title: str, sentence: str, kind: str, value: str, subject: str | None = None) -> str | None:
    cloze = re.sub(rf"(?<![\d,.]){re.escape(value)}(?![\d,]|\.\d)", "____", sentence)  # every occurrence
    if subject is not None:  # a bridge: the entity's own name is not said
        cloze = _mask_title(cloze, title, subject) or cloze
    what = "year" if kind == "year" else "number"
    where = f'the article "{title}"' if subject is None else "that entry's own article"
    return f'According to {where}, which {what} fills the blank: "{cloze}"?'


def _definition(doc: Document, chunk: Chunk) -> str | None:
    """The description in the document's defining first sentence ("X is a ..."), or None."""
    first = next((s for s in sentences(chunk.text) if _usable(s)), None)
    if first is None:
        return None
    found = _DEFINITION.match(first)
    if not found or normalize_answer(found["subject"]) not in (normalize_answer(doc.title), ""):
        return None
    if normalize_answer(doc.title) in normalize_answer(found["desc"]):
        return None
    return found["desc"].strip()


class TemplateGenerator:
    """Deterministic candidates from facts the rules read (see the module docstring)."""

    name = "template"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def candidates(self, documents: list[Document], chunks: dict[str, list[Chunk]], index: Any,
                   multi_hop: bool = True, progress: bool = False) -> list[Candidate]:
        from tqdm import tqdm

        rng = np.random.default_rng(self.seed)
        out: list[Candidate] = []
        events: dict[str, list[tuple[Document, Chunk, str, int]]] = {}
        for doc in tqdm(documents, desc="templates", unit="doc", disable=not progress):
            count = 0
            first = chunks[doc.title][0]
            desc = _definition(doc, first)
            if desc:
                out.append(Candidate(f"What is the name of {desc}?", doc.title, [first], "single", self.name))
                count += 1
            for chunk in chunks[doc.title]:
                facts = _cloze_facts(chunk)
                for i in rng.permutation(len(facts))[:2]:
                    if count >= MAX_PER_DOCUMENT["single"]:
                        break
                    kind, sentence, value = facts[int(i)]
                    out.append(Candidate(_cloze_question(doc.title, sentence, kind, value), value, [chunk], "single",
                                         self.name))
                    count += 1
                for sentence in sentences(chunk.text):
                    event = _EVENT.search(sentence)
                    if event and _usable(sentence) and (normalize_answer(doc.title) in normalize_answer(sentence)
                                                       or chunk.index == 0):
                        events.setdefault(event[1].lower(), []).append((doc, chunk, event[2], event.start()))
                        break
        if multi_hop:
            out += self._bridges(documents, chunks, index, rng)
            out += self._comparisons(events, rng)
        return out

    def _bridges(self, documents, chunks, index, rng) -> list[Candidate]:
        """A names B's title; B has a year or number fact: ask B's fact, reached through A."""
        from benchmax_gym.envs.wikipedia.backends import CorpusBackend

        backend = CorpusBackend(index)
        try:
            return self._bridges_with(backend, documents, chunks, rng)
        finally:
            backend.close()

    def _bridges_with(self, backend, documents, chunks, rng) -> list[Candidate]:
        out = []
        for b in documents:
            if len(b.title) < 4:
                continue
            facts = [(c, f) for c in chunks[b.title] for f in _cloze_facts(c)]
            if not facts:
                continue
            made = 0
            for a_title, a_chunk, a_sentence in mentions(backend, chunks, b.title):
                if made >= MAX_PER_DOCUMENT["bridge"]:
                    break
                chunk_b, (kind, sentence, value) = facts[int(rng.integers(len(facts)))]
                masked = _mask_title(a_sentence, b.title, "____")
                if masked is None or value in masked:
                    continue
                second = _cloze_question(b.title, sentence, kind, value, subject="it")
                question = f'In the article "{a_title}", an entry fills the blank in: "{masked}" {second}'
                out.append(Candidate(question, value, [a_chunk, chunk_b], "bridge", self.name))
                made += 1
        return out

    def _comparisons(self, events, rng) -> list[Candidate]:
        out = []
        for verb, found in sorted(events.items()):
            order = [found[int(i)] for i in rng.permutation(len(found))]
            for (d1, c1, y1, _), (d2, c2, y2, _) in zip(order[::2], order[1::2]):
                if y1 == y2 or d1.title == d2.title:
                    continue
                earlier = d1.title if int(y1) < int(y2) else d2.title
                question = f"Which was {verb} earlier: {d1.title} or {d2.title}?"
                out.append(Candidate(question, earlier, [c1, c2], "comparison", self.name, values=(y1, y2)))
        return out


def mentions(backend: Any, chunks: dict[str, list[Chunk]], title: str, limit: int = 8) -> Iterable[tuple[str, Chunk, str]]:
    """``(other title, chunk, sentence)`` where another document names ``title``: the FTS5 index
    (``backend``, a :class:`CorpusBackend`) finds the documents, the exact phrase is checked in
    their chunks' sentences."""
    hits = backend.search(title, limit + 1)
    needle = title.casefold()
    for hit in hits:
        if hit.title == title:
            continue
        for chunk in chunks.get(hit.title, ()):
            if needle not in chunk.text.casefold():
                continue
            for sentence in sentences(chunk.text):
                if needle in sentence.casefold() and _usable(sentence):
                    yield hit.title, chunk, sentence
                    break
            break


# -- the model generator ---------------------------------------------------------------------------

SINGLE_PROMPT = """Write one question that the passage below answers, for a reader who can search a collection of documents but has not seen this passage.
Rules: the answer is a short span copied exactly from the passage (a name, date, number or short phrase, at most 8 words); the question does not contain the answer; the question names enough to be unambiguous.
Reply with only a JSON object: {{"question": "...", "answer": "..."}}

Passage from "{title}":
{text}"""

BRIDGE_PROMPT = """Write one two-step question: the first passage names the entry "{bridge}"; the answer must come from the second passage, about "{bridge}".
Rules: do not say "{bridge}" in the question (describe it through the first passage); the answer is a short span copied exactly from the second passage (at most 8 words); the question does not contain the answer.
Reply with only a JSON object: {{"question": "...", "answer": "..."}}

First passage, from "{title_a}":
{text_a}

Second passage, from "{title_b}":
{text_b}"""

COMPARISON_PROMPT = """Write one comparison question about "{title_a}" and "{title_b}" that needs both passages (which is older, larger, first, ...).
Rules: the answer is exactly "{title_a}" or "{title_b}", or yes or no; the question names both.
Reply with only a JSON object: {{"question": "...", "answer": "..."}}

Passage from "{title_a}":
{text_a}

Passage from "{title_b}":
{text_b}"""

VERIFY_PROMPT = """Answer the question using only the passages. Reply with the answer alone inside <answer></answer>, as short as possible.

{passages}

Question: {question}"""

_JSON_OBJECT = re.compile(r"\{[^{}]{0,4000}\}", re.DOTALL)


def parse_candidate(reply: Any) -> tuple[str, str] | None:
    """``(question, answer)`` from a model's reply, or None: the first JSON object in it with a
    ``question`` and an ``answer`` of bounded length (a model's text is hostile: anything else
    is refused, never repaired)."""
    if not isinstance(reply, str) or len(reply) > 50_000:
        return None
    for found in _JSON_OBJECT.finditer(reply):
        try:
            value = json.loads(found.group())
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        question, answer = value.get("question"), value.get("answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if (isinstance(question, str) and isinstance(answer, str) and 10 <= len(question.strip()) <= MAX_QUESTION_CHARS
                and 0 < len(answer.strip()) <= MAX_ANSWER_CHARS):
            return " ".join(question.split()), " ".join(answer.split())
    return None


@dataclass
class ModelGenerator:
    """Candidates from a model over an OpenAI-compatible endpoint (eval's :class:`ChatPolicy`
    client: its retries with backoff, timeouts, reply-size bound; the key is never written).
    ``verify_model``: a second model (same endpoint) for the ``verified`` filter."""

    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    concurrency: int = 16
    timeout: float = 120.0
    max_retries: int = 4
    verify_model: str | None = None
    temperature: float | None = None
    errors: Counter = field(default_factory=Counter)

    def __post_init__(self):
        # (its ChatPolicy is made at the first request: a bad argument failed there, past the work before it)
        from benchmax_gym.core import checks
        from benchmax_gym.eval.policies import CLIENT_ARGS, check_client_args

        check_client_args(model=self.model, base_url=self.base_url, api_key=self.api_key, timeout=self.timeout,
                          max_retries=self.max_retries, temperature=self.temperature)
        checks.optional(CLIENT_ARGS["model"])("verify_model", self.verify_model)
        checks.positive_int("concurrency", self.concurrency)

    @property
    def name(self) -> str:
        return f"model:{self.model}"

    def _policy(self, model: str):
        from benchmax_gym.eval.policies import ChatPolicy

        return ChatPolicy(model, base_url=self.base_url, api_key=self.api_key, timeout=self.timeout,
                          max_retries=self.max_retries, temperature=self.temperature)

    async def _ask(self, client: Any, policy: Any, model: str, prompt: str, gate: asyncio.Semaphore) -> str | None:
        """The model's reply to ``prompt``, or None (counted in ``errors``) where the request failed
        past its retries: one failed request (a reply over the size cap too) drops its candidate,
        not the whole run's."""
        import openai

        from benchmax_gym.eval.policies import PolicyError

        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}]}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        async with gate:
            try:
                response = await client.post("/chat/completions", body=body, cast_to=object)
            except (openai.OpenAIError, PolicyError, ValueError) as exc:
                self.errors[policy.scrub(type(exc).__name__)] += 1
                return None
        try:
            content = response["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            self.errors["malformed reply"] += 1
            return None
        return content if isinstance(content, str) else None

    def prompts(self, documents: list[Document], chunks: dict[str, list[Chunk]], index: Any,
                multi_hop: bool) -> list[tuple[str, list[Chunk], str]]:
        """``(kind, chunks, prompt)`` for every request this generator sends."""
        out = []
        for doc in documents:
            for chunk in chunks[doc.title][:MAX_PER_DOCUMENT["single"]]:
                out.append(("single", [chunk], SINGLE_PROMPT.format(title=doc.title, text=chunk.text)))
        if not multi_hop:
            return out
        from benchmax_gym.envs.wikipedia.backends import CorpusBackend

        backend = CorpusBackend(index)
        try:
            for doc in documents:
                first = chunks[doc.title][0]
                for a_title, a_chunk, _ in list(mentions(backend, chunks, doc.title))[:MAX_PER_DOCUMENT["bridge"]]:
                    out.append(("bridge", [a_chunk, first], BRIDGE_PROMPT.format(
                        bridge=doc.title, title_a=a_title, text_a=a_chunk.text, title_b=doc.title, text_b=first.text)))
                words = " ".join(first.text.split()[:40])
                alike = next((h.title for h in backend.search(words, 3) if h.title != doc.title and h.title in chunks),
                             None)
                if alike is not None and doc.title < alike:  # each pair once
                    other = chunks[alike][0]
                    out.append(("comparison", [first, other], COMPARISON_PROMPT.format(
                        title_a=doc.title, text_a=first.text, title_b=alike, text_b=other.text)))
        finally:
            backend.close()
        return out

    async def acandidates(self, requests: list[tuple[str, list[Chunk], str]], progress: bool) -> tuple[list, int]:
        """The parsed candidates and how many replies did not parse."""
        from tqdm import tqdm

        policy = self._policy(self.model)
        await policy.preflight()
        client, gate = policy.client(), asyncio.Semaphore(self.concurrency)
        bar = tqdm(total=len(requests), desc=f"asking {self.model}", unit="req", disable=not progress)

        async def one(kind, support, prompt):
            reply = await self._ask(client, policy, self.model, prompt, gate)
            bar.update(1)
            return kind, support, parse_candidate(reply)

        try:
            results = await asyncio.gather(*(one(*r) for r in requests))
        finally:
            bar.close()
            await client.close()
        candidates, unparsed = [], 0
        for kind, support, parsed in results:
            if parsed is None:
                unparsed += 1
                continue
            question, answer = parsed
            candidates.append(Candidate(question, answer, support, kind, self.name))
        return candidates, unparsed

    async def averify(self, candidates: list[Candidate], progress: bool) -> list[bool]:
        """Whether the verify model, answering from the chunks alone, agrees with each candidate."""
        from tqdm import tqdm

        from benchmax_gym.core.rubric import final_answer

        policy = self._policy(self.verify_model)
        await policy.preflight()
        client, gate = policy.client(), asyncio.Semaphore(self.concurrency)
        bar = tqdm(total=len(candidates), desc=f"verifying with {self.verify_model}", unit="q", disable=not progress)

        async def one(candidate):
            passages = "\n\n".join(f"Passage from \"{c.title}\":\n{c.text}" for c in candidate.supporting)
            reply = await self._ask(client, policy, self.verify_model,
                                    VERIFY_PROMPT.format(passages=passages, question=candidate.question), gate)
            bar.update(1)
            said = final_answer(reply) if isinstance(reply, str) else None
            if said is None or len(said) > MAX_ANSWER_CHARS * 4:
                return False
            return bool(exact_match(said, candidate.answer) or f1_score(said, candidate.answer) >= 0.8)

        try:
            return list(await asyncio.gather(*(one(c) for c in candidates)))
        finally:
            bar.close()
            await client.close()


# -- filters ------------------------------------------------------------------------------------------


def _contains(haystack: str, needle: str) -> bool:
    """Whether normalised ``needle`` occurs in normalised ``haystack`` on word boundaries."""
    needle = normalize_answer(needle)
    return bool(needle) and f" {needle} " in f" {normalize_answer(haystack)} "


def answer_in_support(candidate: Candidate) -> bool:
    return _contains(candidate.support_text(), candidate.answer)


def question_free_of_answer(candidate: Candidate) -> bool:
    if candidate.kind == "comparison":  # both names are the options: the compared values must not leak
        return not any(_contains(candidate.question, v) for v in candidate.values)
    return not _contains(candidate.question, candidate.answer)


def filter_candidates(candidates: list[Candidate], verify: Any = None, progress: bool = False
                      ) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """The candidates every filter keeps, and per filter ``{filter, in, kept}``."""
    steps = []

    def step(name: str, kept: list[Candidate], before: list[Candidate]) -> list[Candidate]:
        steps.append({"filter": name, "in": len(before), "kept": len(kept)})
        return kept

    current = step("answer_in_support", [c for c in candidates if answer_in_support(c)], candidates)
    current = step("question_free_of_answer", [c for c in current if question_free_of_answer(c)], current)
    seen_questions, seen_facts, unique = set(), set(), []
    for c in current:
        question = normalize_answer(c.question)
        fact = (normalize_answer(c.answer), c.kind, tuple((s.title, s.index) for s in c.supporting))
        if question in seen_questions or fact in seen_facts:
            continue
        seen_questions.add(question)
        seen_facts.add(fact)
        unique.append(c)
    current = step("unique", unique, current)
    if verify is not None:
        agreed = asyncio.run(verify.averify(current, progress)) if current else []
        current = step("verified", [c for c, ok in zip(current, agreed) if ok], current)
    return current, steps


# -- the command --------------------------------------------------------------------------------------


def generate_from_corpus(docs: str | os.PathLike, out: str | os.PathLike, *, model: ModelGenerator | None = None,
                         max_questions: int | None = None, chunk_chars: int = 1200, multi_hop: bool = True,
                         corpus_out: str | os.PathLike | None = None, seed: int = 0, progress: bool = False,
                         cache_dir: str | None = None) -> dict[str, Any]:
    """Read ``docs``, generate and filter candidates, write the kept tasks to ``out`` (nothing when none
    is kept); returns the summary (documents, chunks, candidates per kind, each filter's in/kept, kept,
    seconds)."""
    from benchmax_gym.data import write_jsonl
    from benchmax_gym.envs.wikipedia.backends import CorpusIndex, records_digest

    if max_questions is not None and max_questions <= 0:
        raise ValueError(f"--max-questions must be a positive number, got {max_questions}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:  # (numpy's error did not name it)
        raise ValueError(f"--seed must be a non-negative int, got {seed!r}")
    start = time.perf_counter()
    documents, duplicates = read_documents(docs)  # (duplicates: one title and text twice, kept once)
    chunks = {d.title: chunk_document(d, chunk_chars) for d in documents}
    documents = [d for d in documents if chunks[d.title]]
    records = corpus_records(documents)
    index = CorpusIndex.on_disk(records, records_digest(records), cache_dir)  # what the env will search
    unparsed = None
    if model is None:
        candidates = TemplateGenerator(seed).candidates(documents, chunks, index, multi_hop, progress)
        generator = "template"
    else:
        requests = model.prompts(documents, chunks, index, multi_hop)
        candidates, unparsed = asyncio.run(model.acandidates(requests, progress))
        generator = model.name
    kept, steps = filter_candidates(candidates, model if model is not None and model.verify_model else None, progress)
    if max_questions is not None:
        kept = kept[:max_questions]
    if kept:  # nothing kept writes nothing: an empty --out (or one --overwrite emptied) is no task set
        write_jsonl(out, [c.task(i) for i, c in enumerate(kept)])
        if corpus_out:
            write_jsonl(corpus_out, records)
    seconds = time.perf_counter() - start
    summary = {
        "documents": len(documents), "duplicates_dropped": duplicates, "chunks": sum(len(c) for c in chunks.values()),
        "generator": generator,
        "candidates": dict(Counter(c.kind for c in candidates)) | {"total": len(candidates)},
        "filters": steps, "kept": len(kept), "kept_by_type": dict(Counter(c.kind for c in kept)),
        "seconds": round(seconds, 3), "seconds_per_1000_documents": round(seconds * 1000 / max(len(documents), 1), 2),
        "out": os.fspath(out) if kept else None,
    }
    if unparsed is not None:
        summary["unparsed_replies"] = unparsed
        summary["request_errors"] = dict(model.errors)
    return summary


def print_summary(summary: dict[str, Any], stream: TextIO) -> None:
    from benchmax_gym.cli import counted

    candidates = summary["candidates"]
    dropped = summary.get("duplicates_dropped")
    same = f" ({dropped} dropped: the same title and text as another)" if dropped else ""
    print(f"{counted(summary['documents'], 'document')}{same}, {counted(summary['chunks'], 'chunk')}; generator "
          f"{summary['generator']}: {counted(candidates['total'], 'candidate')} ("
          + ", ".join(f"{k} {candidates.get(k, 0)}" for k in KINDS) + ")", file=stream)
    if "unparsed_replies" in summary:
        print(f"  replies that were not a question/answer object: {summary['unparsed_replies']}", file=stream)
    for step in summary["filters"]:
        print(f"  {step['filter']:<24} kept {step['kept']} of {step['in']}", file=stream)
    where = f"to {summary['out']}" if summary["out"] else "(nothing kept: no file written)"
    print(f"{counted(summary['kept'], 'task')} written {where} in {summary['seconds']:.2f} s "
          f"({summary['seconds_per_1000_documents']:.1f} s per 1,000 documents)", file=stream)
