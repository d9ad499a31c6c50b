"""A user's corpus and question files for the Wikipedia family are untrusted input: a record
without text, a bad line, or a FIFO in place of a file fails at ``gym.make`` (or ``load_corpus``)
in one line naming the file and the record or line, and nothing is indexed under a made-up text."""

import os

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.envs.wikipedia.tasks import load_corpus

WIKI = "benchmax/Wikipedia-v0"


@pytest.mark.parametrize("text, says", [
    ("null", "line 2: 'text' must be text, got null"),
    ('["a", "b"]', "line 2: 'text' must be text, got list"),
    ('{"p": "a"}', "line 2: 'text' must be text, got dict"),
], ids=["null", "list", "object"])
def test_a_record_without_text_is_refused_naming_it(tmp_path, text, says):
    """(null was indexed as the article text "None", a list as its repr.)"""
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"title": "A", "text": "Alpha."}\n{"title": "B", "text": ' + text + "}\n")
    with pytest.raises(ValueError, match="^corpus .*corpus\\.jsonl") as raised:
        load_corpus(path)
    assert says in str(raised.value)


def test_a_null_title_is_refused_naming_the_record(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"title": null, "text": "Alpha."}\n')
    with pytest.raises(ValueError, match=r"record 1: 'title' must be text, got null"):
        load_corpus(path)


def test_good_records_are_indexed_as_they_are(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"title": "A", "text": "Alpha."}\n\n{"title": 1875, "text": ""}\n')
    records, _ = load_corpus(path)
    assert records == [{"title": "A", "text": "Alpha."}, {"title": "1875", "text": ""}]


@pytest.mark.parametrize("content, says", [
    (b'{"title": "A", "text": "Alpha."}\n{"title": "B", oops}\n', "corpus.jsonl' line 2: not JSON"),
    (b'{"title": "A", "text": "Alpha."}\n\n{"title": "B", "text": "caf\xe9"}\n',
     r"corpus\.jsonl: not UTF-8 text \(line 3, "),
    (b'{"title": "A", "text": "Alpha."}\n{"title": "B", "text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n",
     "corpus.jsonl' line 2: JSON nested too deeply"),
    (b'[\n  {"title": "A", "text": "Alpha."},\n  {"title": "B", oops}\n]\n', "is not a JSON array: .*line 3 column"),
], ids=["not-json", "not-utf8", "too-deep", "array"])
def test_a_bad_line_is_named_by_its_own_line_number(tmp_path, content, says):
    """(every bad line was reported as "line 1 column N": each line's own position.)"""
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=says) as raised:
        load_corpus(path)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("line, says", [
    ("5", r"record 1: not a HotpotQA question \(a JSON object\), got int"),
    ('{"question": "Q?", "answer": "A", "supporting_facts": [["A"]]}', r"record 1: supporting_facts must be"),
], ids=["not-object", "bad-supporting-facts"])
def test_a_misshapen_hotpotqa_question_is_refused_naming_the_record(tmp_path, line, says):
    path = tmp_path / "hotpot.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=says):
        gym.make(WIKI, tasks="hotpotqa", task_args={"dataset": str(path)}, backend="local",
                 backend_args={"corpus": str(path)})


def test_a_misshapen_hotpotqa_context_is_refused_naming_the_record(tmp_path):
    path = tmp_path / "hotpot.jsonl"
    path.write_text('{"context": [["A", ["Alpha."]]]}\n{"context": [["B", null]]}\n')
    with pytest.raises(ValueError, match=r"line 2: context must be \[title, \[sentences\]\] pairs"):
        load_corpus(path)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo.jsonl"
    os.mkfifo(path)
    return path


def test_a_fifo_as_the_task_file_is_refused_as_not_a_regular_file(tmp_path, fifo):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"title": "A", "text": "Alpha."}\n')
    with pytest.raises(ValueError, match=f"dataset: '{fifo}' is not a regular file"):
        gym.make(WIKI, tasks="file", task_args={"dataset": str(fifo)}, backend="local",
                 backend_args={"corpus": str(corpus)})


def test_a_fifo_as_the_corpus_is_refused_as_not_a_regular_file(tmp_path, fifo):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "t0", "prompt": "Who?", "answer": "A"}\n')
    with pytest.raises(ValueError, match=f"corpus: '{fifo}' is not a regular file or a folder"):
        gym.make(WIKI, tasks="file", task_args={"dataset": str(tasks)}, backend="local",
                 backend_args={"corpus": str(fifo)})
    with pytest.raises(ValueError, match=f"corpus '{fifo}' is not a regular file"):
        load_corpus(fifo)
