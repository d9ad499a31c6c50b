"""``benchmax-gym tasks from-corpus``: tasks from a folder of documents (tests/data/corpus: text,
Markdown, HTML, JSON Lines), played by benchmax/Wikipedia-v0 over the same documents; the model
path against the loopback chat server, its filters rejecting bad candidates."""

import json
import re
from pathlib import Path

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.cli import main
from benchmax_gym.data import load_tasks
from benchmax_gym.data.corpus import chunk_document, load_documents
from benchmax_gym.data.questions import parse_candidate
from benchmax_gym.testing import play
from benchmax_gym.testing.openai_server import FakeChatServer

CORPUS = Path(__file__).resolve().parent / "corpus"
KEY = "sk-corpus-test-5555"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path / "cache"))


def test_every_format_is_read_titled_and_sectioned():
    docs = {d.title: d for d in load_documents(CORPUS)}
    assert sorted(docs) == ["Ilsa Marrow", "Kesh River", "Orrin", "Teodor Vane", "Velmora Harbour"]
    assert "== Course ==" in docs["Kesh River"].text  # Markdown's ## heading, in the backend's convention
    assert "== Economy ==" in docs["Orrin"].text and "secret" not in docs["Orrin"].text  # no script text
    assert "color: red" not in docs["Orrin"].text
    assert all(len(c.text) <= 400 for c in chunk_document(docs["Kesh River"], 200))


def from_corpus(capsys, *args):
    code = main(["tasks", "from-corpus", str(CORPUS), *args, "--json", "--quiet"])
    return code, json.loads(capsys.readouterr().out)


def test_offline_templates_make_single_and_multi_hop_tasks_the_env_plays(tmp_path, capsys):
    out = tmp_path / "tasks.jsonl"
    code, summary = from_corpus(capsys, "--out", str(out))
    assert code == 0 and summary["documents"] == 5 and summary["generator"] == "template"
    assert {"single", "bridge", "comparison"} <= set(summary["kept_by_type"])
    assert [f["filter"] for f in summary["filters"]] == ["answer_in_support", "question_free_of_answer", "unique"]
    tasks = load_tasks(out).tasks
    assert len(tasks) == summary["kept"]
    for task in tasks:
        assert task.answer and task.answer.casefold() not in task.prompt.casefold() or task.metadata["type"] == "comparison"
    bridge = next(t for t in tasks if t.metadata["type"] == "bridge")
    assert len(bridge.solution["supporting"]) == 2 and bridge.solution["supporting"][1] not in bridge.prompt
    # deterministic: the same documents and seed give the same file
    again = tmp_path / "again.jsonl"
    from_corpus(capsys, "--out", str(again))
    assert again.read_text() == out.read_text()
    # playable: the env searches the same documents; its reference solver reads every supporting
    # article through the tools and reaches reward 1 on every task
    env = gym.make("benchmax/Wikipedia-v0", tasks="file", task_args={"dataset": str(out)},
                   backend="local", backend_args={"corpus": str(CORPUS)})
    for i in range(len(tasks)):
        played = play(env, seed=0, options={"task_index": i})
        assert played.reward == 1.0, played.transcript
    env.reset(seed=0, options={"task_index": 0})
    obs, *_ = env.step('<tool_call>{"name": "search", "arguments": {"query": "salt caravans ford"}}</tool_call>')
    assert "Orrin" in obs
    env.close()


def test_single_hop_only_and_max_questions(tmp_path, capsys):
    code, summary = from_corpus(capsys, "--out", str(tmp_path / "t.jsonl"), "--single-hop-only", "--max-questions", "3")
    assert code == 0 and summary["kept"] == 3 and set(summary["candidates"]) == {"single", "total"}


@pytest.mark.parametrize("reply, parsed", [
    ('{"question": "How long is the Kesh River?", "answer": "212 kilometres"}',
     ("How long is the Kesh River?", "212 kilometres")),
    ('Sure!\n```json\n{"question": "When was Orrin founded?", "answer": 1390}\n```', ("When was Orrin founded?", "1390")),
    ("When was Orrin founded? 1390", None),
    ('{"question": "Why?", "answer": "x"}', None),  # too short to be a question
    ('{"question": "What is the answer to this long question?", "answer": "' + "a" * 500 + '"}', None),
    ('{"question": ["a list"], "answer": "x"}', None),
    (None, None),
])
def test_a_model_reply_is_taken_only_as_a_bounded_json_object(reply, parsed):
    assert parse_candidate(reply) == parsed


def scripted_model(golds):
    """Single-hop: one good, one answer not in the passage, one answer in the question, one not
    JSON, one good that the verifier will contradict; bridges all the same question; comparisons good."""
    def reply(body):
        prompt = body["messages"][0]["content"]
        if prompt.startswith("Answer the question using only the passages."):
            question = prompt.rsplit("Question: ", 1)[1].strip()
            gold = golds.get(question, "nothing")
            if question.startswith("Which place is named in both"):  # the bridge: the second passage's entry
                gold = re.findall(r'Passage from "([^"]+)"', prompt)[1]
            return {"content": "<answer>300</answer>" if "kilometres" in question else f"<answer>{gold}</answer>"}
        if prompt.startswith("Write one question that the passage"):
            title = re.search(r'Passage from "([^"]+)"', prompt)[1]
            qa = {"Orrin": ("Around what was the city of Orrin founded?", "a ford"),
                  "Ilsa Marrow": ("Where did Ilsa Marrow die?", "Atlantis"),
                  "Teodor Vane": ("Did Teodor Vane design the Grey Needle lighthouse?", "Grey Needle"),
                  "Velmora Harbour": None,
                  "Kesh River": ("How many kilometres long is the Kesh River?", "212")}[title]
            if qa is None:
                return {"content": "Here is a great question about the harbour: how many boats? About 140."}
        elif prompt.startswith("Write one two-step question"):
            bridge = re.search(r'names the entry "([^"]+)"', prompt)[1]
            qa = ("Which place is named in both passages as the destination?", bridge)
        elif prompt.startswith("Write one comparison question"):
            a, b = re.search(r'comparison question about "([^"]+)" and "([^"]+)"', prompt).groups()
            qa = (f"Which is older, {a} or {b}?", a)
        else:  # the client's preflight
            return {"content": "ok"}
        golds[qa[0]] = qa[1]
        return {"content": json.dumps({"question": qa[0], "answer": qa[1]})}
    return reply


def test_the_model_path_filters_bad_candidates_and_never_writes_the_key(tmp_path, capsys, monkeypatch):
    golds: dict = {}
    monkeypatch.setenv("CORPUS_TEST_KEY", KEY)
    out = tmp_path / "tasks.jsonl"
    with FakeChatServer(scripted_model(golds), api_key=KEY, models=("gen-model", "check-model")) as server:
        code, summary = from_corpus(capsys, "--out", str(out), "--model", "gen-model", "--base-url", server.url,
                                    "--api-key-env", "CORPUS_TEST_KEY", "--verify-model", "check-model")
        asked = [r["model"] for r in server.requests]
    assert code == 0 and summary["generator"] == "model:gen-model"
    assert summary["unparsed_replies"] == 1  # Velmora Harbour's reply was prose
    bridges, comparisons = summary["candidates"].get("bridge", 0), summary["candidates"].get("comparison", 0)
    assert bridges >= 2 and comparisons >= 1 and summary["candidates"]["single"] == 4
    steps = {s["filter"]: (s["in"], s["kept"]) for s in summary["filters"]}
    total = summary["candidates"]["total"]
    assert steps["answer_in_support"] == (total, total - 1)  # Atlantis
    assert steps["question_free_of_answer"] == (total - 1, total - 2)  # Grey Needle
    assert steps["unique"] == (total - 2, total - 2 - (bridges - 1))  # the bridges' one question, once
    kept_before = total - 2 - (bridges - 1)
    assert steps["verified"] == (kept_before, kept_before - 1)  # the verifier said 300 for the Kesh River
    prompts = [t.prompt for t in load_tasks(out).tasks]
    assert "Around what was the city of Orrin founded?" in prompts
    assert not any("Kesh River" in p and "kilometres" in p for p in prompts)
    assert "check-model" in asked and "gen-model" in asked
    assert KEY not in out.read_text()


@pytest.mark.parametrize("args, says", [
    (["--model", "m", "--concurrency", "0"], "--concurrency must be a positive number"),
    (["--verify-model", "m"], "give --model too"),
    (["--chunk-chars", "50"], "--chunk-chars must be at least 200"),
    (["--max-questions", "0"], "--max-questions must be a positive number"),
    (["--seed", "-1"], "--seed must be a non-negative int"),  # (numpy's "expected non-negative integer" alone)
])
def test_bad_options_fail_in_one_line(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-corpus", str(CORPUS), "--out", str(tmp_path / "t.jsonl"), "--quiet", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and len(err.strip().splitlines()) == 1


def test_an_unreachable_endpoint_fails_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-corpus", str(CORPUS), "--out", str(tmp_path / "t.jsonl"), "--model", "m",
              "--base-url", "http://127.0.0.1:9/v1", "--quiet"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "cannot reach" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("url, env, says", [
    ("http://127.0.0.1:abc/v1", None, "--base-url http://127.0.0.1:abc/v1: not a valid URL (its port is not a number)"),
    (None, "ftp://127.0.0.1/v1", "$OPENAI_BASE_URL ftp://127.0.0.1/v1: expected http(s)://"),
])
def test_a_malformed_endpoint_is_named_by_its_flag_before_any_work(tmp_path, capsys, monkeypatch, url, env, says):
    """It was named ``base_url`` (ModelGenerator's field, met at the first request), as eval names it."""
    if env is None:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("OPENAI_BASE_URL", env)
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-corpus", str(CORPUS), "--out", str(tmp_path / "t.jsonl"), "--model", "m", "--quiet",
              *(["--base-url", url] if url else [])])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"benchmax-gym: error: {says}"), err
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("kwargs, says", [
    ({"base_url": "http://127.0.0.1:abc/v1"}, "base_url 'http://127.0.0.1:abc/v1': not a valid URL"),
    ({"timeout": 0}, "timeout must be a positive number"),
    ({"max_retries": -1}, "max_retries must be an int from 0"),
    ({"temperature": True}, "temperature must be a finite number"),
    ({"concurrency": 0}, "concurrency must be a positive int"),
    ({"verify_model": ""}, "verify_model must be a non-empty string"),
    ({"api_key": 5}, "api_key must be a string"),
])
def test_model_generator_checks_its_client_arguments_when_made(kwargs, says):
    """Its ChatPolicy is made at the first request: a bad argument failed there, after the corpus work."""
    from benchmax_gym.data.questions import ModelGenerator

    with pytest.raises(ValueError, match=re.escape(says)):
        ModelGenerator("m", **kwargs)


def minimal_pdf(lines):
    """A one-page PDF whose text is ``lines`` (Helvetica), written by hand: no PDF writer needed."""
    stream = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({line}) '" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = "%PDF-1.4\n", []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{body}\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n" + "".join(f"{o:010d} 00000 n \n" for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n"
    return out.encode("latin-1")


def test_a_pdf_document_is_read_with_the_pdf_extra(tmp_path, capsys):
    pytest.importorskip("pypdf")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "Quarn_Abbey.pdf").write_bytes(minimal_pdf(["Quarn Abbey is a ruined abbey on the Kesh River.",
                                                         "It was founded in 1140 by monks from Orrin."]))
    (doc,) = load_documents(docs)
    assert doc.title == "Quarn Abbey" and "founded in 1140" in doc.text
    code, summary = main(["tasks", "from-corpus", str(docs), "--out", str(tmp_path / "t.jsonl"), "--json",
                          "--quiet"]), json.loads(capsys.readouterr().out)
    assert code == 0 and any(t.answer == "1140" for t in load_tasks(tmp_path / "t.jsonl").tasks)


def test_a_suffixed_title_never_collides_with_another_documents_own(tmp_path):
    """"X", "X" and a document titled "X (2)": the second X became "X (2)" too, and the index keeps
    one article per title (one document lost)."""
    for name, title in (("a.md", "X"), ("b.md", "X"), ("c.md", "X (2)")):
        (tmp_path / name).write_text(f"# {title}\n\nText of {name}.\n")
    titles = [d.title for d in load_documents(tmp_path)]
    assert len(set(titles)) == 3 and titles[:2] == ["X", "X (2)"]


def test_byte_order_marks_and_crlf_are_read_as_the_text_they_mark(tmp_path):
    """A UTF-8 byte-order mark hid a Markdown file's ``# Title`` (the file name became the title,
    the mark and the heading stayed in the text); UTF-16 with its mark was read as noise."""
    (tmp_path / "notes.md").write_bytes("# Kesh Delta\r\n\r\nThe delta was mapped in 1822.\r\n".encode("utf-8-sig"))
    (tmp_path / "wide.txt").write_bytes("The Orrin mill opened in 1870.".encode("utf-16"))
    docs = {d.title: d.text for d in load_documents(tmp_path)}
    assert docs == {"Kesh Delta": "The delta was mapped in 1822.", "wide": "The Orrin mill opened in 1870."}


@pytest.mark.parametrize("name, content, says", [
    # decoded with replacement characters, "café" went into the index and the questions as "caf\ufffd"
    ("latin1.txt", "The café opened in 1901.".encode("latin-1"), r"latin1\.txt: not UTF-8 text \(byte 7: b'\\xe9'\)"),
    # json.loads' RecursionError ended the command with a traceback
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, r"deep\.json: JSON nested too deeply"),
])
def test_an_unreadable_document_is_refused_naming_the_file(tmp_path, capsys, name, content, says):
    (tmp_path / "good.md").write_text("# Good\n\nThe good document was written in 1999.\n")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=says):
        load_documents(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-corpus", str(tmp_path), "--out", str(tmp_path / "t.jsonl"), "--quiet"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and name in err and "Traceback" not in err


def test_a_fifo_as_docs_is_refused_without_opening_it(tmp_path):
    """(It was called "no such file or folder".)"""
    import os

    os.mkfifo(tmp_path / "docs.md")
    with pytest.raises(ValueError, match="not a regular file or folder"):
        load_documents(tmp_path / "docs.md")


def test_a_text_without_sentence_ends_is_still_chunked_to_size(tmp_path):
    """A log or a table (no ". X" anywhere) was one chunk however long: 100,000 characters for
    chunk_chars=1200, the whole of it in one model prompt."""
    words = " ".join(f"reading{i}" for i in range(10_000))
    chunks = chunk_document(load_documents_from(tmp_path, words)[0], 1200)
    assert max(len(c.text) for c in chunks) <= 1200
    assert " ".join(c.text for c in chunks) == words  # nothing lost, every word whole
    unbroken = "x" * 5000  # (no space at all: cut anyway)
    assert [len(c.text) for c in chunk_document(load_documents_from(tmp_path, unbroken)[0], 1200)] == [1200] * 4 + [200]


def load_documents_from(folder, text):
    (folder / "doc.txt").write_text(text)
    return load_documents(folder / "doc.txt")


def _copy_of_the_corpus(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for file in CORPUS.rglob("*.md"):
        (docs / file.name).write_bytes(file.read_bytes())
    return docs


@pytest.mark.parametrize("case", ["out is corpus-out", "out is a document", "out links to a document",
                                  "corpus-out is a document"])
def test_an_output_that_is_another_output_or_an_input_is_refused_up_front(tmp_path, capsys, monkeypatch, case):
    """(--out t.jsonl --corpus-out t.jsonl said "2 tasks written" over a file holding only the corpus;
    --out docs/a.txt --overwrite replaced a document.)"""
    docs = _copy_of_the_corpus(tmp_path)
    document = sorted(docs.iterdir())[0]
    (tmp_path / "link.txt").symlink_to(document)
    monkeypatch.chdir(tmp_path)
    args, says = {
        "out is corpus-out": (["--out", "t.jsonl", "--corpus-out", "./t.jsonl"],
                              "--out t.jsonl and --corpus-out ./t.jsonl are one file"),
        "out is a document": (["--out", f"docs/{document.name}"], f"--out docs/{document.name} is a document of DOCS"),
        "out links to a document": (["--out", "link.txt"], "--out link.txt is a document of DOCS"),
        "corpus-out is a document": (["--out", "t.jsonl", "--corpus-out", str(document)], "--corpus-out"),
    }[case]
    before = document.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-corpus", "docs", *args, "--overwrite", "--quiet"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert document.read_bytes() == before and not (tmp_path / "t.jsonl").exists()


def test_an_existing_corpus_out_is_replaced_only_with_overwrite(tmp_path, capsys):
    corpus_out = tmp_path / "corpus.jsonl"
    corpus_out.write_text("mine\n")
    with pytest.raises(SystemExit):
        from_corpus(capsys, "--out", str(tmp_path / "t.jsonl"), "--corpus-out", str(corpus_out))
    assert "--corpus-out" in capsys.readouterr().err and corpus_out.read_text() == "mine\n"
    code, _ = from_corpus(capsys, "--out", str(tmp_path / "t.jsonl"), "--corpus-out", str(corpus_out), "--overwrite")
    assert code == 0 and corpus_out.read_text() != "mine\n"


@pytest.mark.parametrize("flag, value", [("--temperature", "0.5"), ("--timeout", "3"), ("--max-retries", "2"),
                                         ("--concurrency", "2"), ("--base-url", "http://127.0.0.1:9/v1")])
def test_a_model_option_without_model_is_refused(tmp_path, capsys, flag, value):
    """(They were accepted and did nothing; eval refuses the same.)"""
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-corpus", str(CORPUS), "--out", str(tmp_path / "t.jsonl"), "--quiet", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"{flag}: for --model only" in err and len(err.strip().splitlines()) == 1


def test_the_summary_counts_one_document_chunk_and_task_in_the_singular(tmp_path, capsys):
    doc = tmp_path / "tower.txt"
    doc.write_text("The Eiffel Tower is in Paris. It was built in 1889 by Gustave Eiffel for the World Fair. "
                   "It is 330 metres tall and made of wrought iron.\n")
    out = tmp_path / "t.jsonl"
    assert main(["tasks", "from-corpus", str(doc), "--out", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("1 document, 1 chunk; generator template: "), lines  # (it said "1 documents, 1 chunks")
    kept = len(out.read_text().splitlines())
    assert lines[-1].startswith(f"{kept} task{'' if kept == 1 else 's'} written to {out} in "), lines
