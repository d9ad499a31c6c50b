"""The errors users meet when they bring their own data: each names the record as the user finds
it (``line N`` of a JSON Lines file as an editor numbers it, blank lines counted; ``record N``,
from 1, of a JSON array), and a corpus holding one document twice indexes it once.

Every bad file is made from the real samples in ../shared/data (one record spoiled)."""

import json
import re
import shutil

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.cli import main
from benchmax_gym.envs.crm.org import cached_org


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Indexes and task-set hashes built here go to a temporary folder, never to ~/.cache."""
    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path / "cache"))


def jsonl_with_blank_line_2(path, good, bad, *more):
    """``good`` on line 1, a blank line 2 (which ``datasets`` skips), ``bad`` on line 3."""
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n" + "".join(json.dumps(r) + "\n" for r in more))
    return str(path)


def gsm8k(shared_data, n=4):
    with open(shared_data / "gsm8k" / "train_sample500.jsonl") as f:
        return [json.loads(next(f)) for _ in range(n)]


def articles(shared_data):
    return json.loads((shared_data / "wikipedia" / "articles_10.json").read_text())


def hotpotqa(shared_data, n=4):
    return json.loads((shared_data / "hotpotqa" / "dev_distractor_100.json").read_text())[:n]


# -- 1. where the bad record is ---------------------------------------------------------------


@pytest.mark.parametrize("limit", [None, 3])  # (with a limit the first lines are read without datasets)
def test_a_bad_gsm8k_line_is_named_by_its_line_number_not_its_index(shared_data, tmp_path, limit):
    """Line 3 was "record 1" (its index among the records, from 0, blank lines skipped)."""
    good, bad, *rest = gsm8k(shared_data)
    path = jsonl_with_blank_line_2(tmp_path / "train.jsonl", good, dict(bad, question=None), *rest)
    task_args = {"dataset": path, **({"limit": limit} if limit else {})}
    with pytest.raises(ValueError, match=rf"^dataset '{re.escape(str(path))}' line 3: the question field 'question' must be text"):
        gym.make("benchmax/Math-v0", tasks="gsm8k", task_args=task_args)


def test_a_bad_record_of_a_json_array_is_named_counting_from_one(shared_data, tmp_path):
    records = gsm8k(shared_data, 3)
    records[2]["answer"] = " "
    path = tmp_path / "qa.json"
    path.write_text(json.dumps(records, indent=2))
    with pytest.raises(ValueError, match=rf"^dataset '{re.escape(str(path))}' record 3: the answer field 'answer' is blank"):
        gym.make("benchmax/Math-v0", tasks="hf", task_args={"dataset": str(path)})


def test_two_math500_records_with_one_id_are_named_by_their_lines(shared_data, tmp_path):
    """(Named as tasks[0] and tasks[1]: indices among the tasks kept, not where the file holds them.)"""
    with open(shared_data / "math500" / "test_first100.jsonl") as f:
        first, second, third = (json.loads(next(f)) for _ in range(3))
    path = jsonl_with_blank_line_2(tmp_path / "m.jsonl", first, dict(third, unique_id=first["unique_id"]), second)
    with pytest.raises(ValueError, match=rf"^dataset '{re.escape(str(path))}' line 1 and line 3 share the id"):
        gym.make("benchmax/Math-v0", tasks="math500", task_args={"dataset": path})


@pytest.fixture(scope="module")
def org(tmp_path_factory):
    return str(cached_org(0, 600, tmp_path_factory.mktemp("crm-org")))


CRM_RECORD = {"idx": 3, "task": "policy_violation_identification", "reward_metric": "exact_match",
              "query": "Did the agent breach a policy? If so, which knowledge article?", "answer": [None]}


@pytest.mark.parametrize("bad, says", [
    ({"answer": None}, "the answer is null"),
    ({"reward_metric": "bleu"}, "reward_metric must be one of"),
    ({"metadata": ["a list"]}, "metadata must be an object or text, got list"),  # (an AttributeError)
    ({"metadata": '{"required": '}, "metadata is text that starts as a JSON object but is not one"),
    ({"idx": 3}, None),  # the first line's idx again: both lines named
])
def test_a_bad_crmarena_line_is_named_by_its_line_number(org, tmp_path, bad, says):
    """(No CRMArena sample ships in ../shared/data: its records are written here in its format.)"""
    path = jsonl_with_blank_line_2(tmp_path / "tasks.jsonl", CRM_RECORD, {**CRM_RECORD, "idx": 4, **bad})
    expected = f"tasks '{path}' line 1 and line 3 share the id 'crmarena-3'" if says is None else \
        f"tasks '{path}' line 3: {says}"
    with pytest.raises(ValueError) as caught:
        gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": path}, org_db=org)
    assert str(caught.value).startswith(expected)


def test_a_bad_crmarena_record_of_a_json_array_is_named_counting_from_one(org, tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([CRM_RECORD, {**CRM_RECORD, "idx": 4}, {**CRM_RECORD, "idx": 5, "answer": []}]))
    with pytest.raises(ValueError, match=rf"^tasks '{re.escape(str(path))}' record 3: the answer is an empty list"):
        gym.make("benchmax/CRM-v0", tasks="crmarena", task_args={"dataset": str(path)}, org_db=org)


@pytest.mark.parametrize("spoil, says", [
    (lambda r: {k: v for k, v in r.items() if k != "supporting_facts"}, r"lacks HotpotQA field\(s\) \['supporting_facts'\]"),
    (lambda r: dict(r, answer=["."]), "has no answer"),
    (lambda r: dict(r, supporting_facts=[["one"]]), "supporting_facts must be"),
])
def test_a_bad_hotpotqa_line_is_named_by_its_line_number(shared_data, tmp_path, spoil, says):
    first, second, third, _ = hotpotqa(shared_data)
    path = jsonl_with_blank_line_2(tmp_path / "hotpot.jsonl", first, spoil(second), third)
    with pytest.raises(ValueError, match=rf"^dataset '{re.escape(str(path))}' line 3: {says}"):
        gym.make("benchmax/Wikipedia-v0", tasks="hotpotqa", task_args={"dataset": path})
    array = tmp_path / "hotpot.json"
    array.write_text(json.dumps([first, third, spoil(second)]))
    with pytest.raises(ValueError, match=rf"^dataset '{re.escape(str(array))}' record 3: {says}"):
        gym.make("benchmax/Wikipedia-v0", tasks="hotpotqa", task_args={"dataset": str(array)})


def test_a_bad_bamboogle_line_is_named_by_its_line_number(shared_data, tmp_path):
    first, second = ({"Question": q["question"], "Answer": q["answer"]} for q in hotpotqa(shared_data, 2))
    path = jsonl_with_blank_line_2(tmp_path / "bamboogle.jsonl", first, {"Question": second["Question"]})
    with pytest.raises(ValueError, match=rf"^dataset '{re.escape(str(path))}' line 3: needs Question and Answer fields"):
        gym.make("benchmax/Wikipedia-v0", tasks="bamboogle", task_args={"dataset": path})


def test_a_bad_task_file_line_is_named_by_its_line_alone(shared_data, tmp_path):
    """``tasks="file"`` (what ``tasks from-corpus`` writes) said "line 3: tasks[1]['metadata']": a
    second number, from 0, that is no line."""
    first, second = hotpotqa(shared_data, 2)
    task = {"id": "q1", "prompt": first["question"], "answer": first["answer"]}
    path = jsonl_with_blank_line_2(tmp_path / "tasks.jsonl", task,
                                   {"id": "q2", "prompt": second["question"], "answer": second["answer"], "metadata": []})
    with pytest.raises(ValueError) as caught:
        gym.make("benchmax/Wikipedia-v0", tasks="file", task_args={"dataset": path})
    assert str(caught.value).startswith(f"tasks '{path}' line 3: task['metadata'] must be a dict")
    assert "tasks[" not in str(caught.value)


def corpus_env(corpus):
    return gym.make("benchmax/Wikipedia-v0", tasks="bamboogle", task_args={"dataset": corpus["questions"]},
                    backend="local", backend_args={"corpus": corpus["path"]})


@pytest.fixture
def questions(shared_data, tmp_path):
    path = tmp_path / "questions.json"
    path.write_text(json.dumps([{"Question": "Who taught Alexander the Great?", "Answer": "Aristotle"}]))
    return str(path)


@pytest.mark.parametrize("spoil, says", [
    (lambda r: dict(r, text=None), "'text' must be text, got null"),
    (lambda r: dict(r, title=["a", "b"]), "'title' must be text, got list"),
    (lambda r: {"name": r["title"]}, r"neither \{title, text\} nor a HotpotQA question"),
])
def test_a_bad_corpus_line_is_named_by_its_line_number(shared_data, tmp_path, questions, spoil, says):
    first, second, third = articles(shared_data)[:3]
    path = jsonl_with_blank_line_2(tmp_path / "corpus.jsonl", first, spoil(second), third)
    with pytest.raises(ValueError, match=rf"^corpus '{re.escape(str(path))}' line 3: {says}"):
        corpus_env({"questions": questions, "path": path})


def test_tasks_from_corpus_names_the_bad_line_of_a_corpus_file(shared_data, tmp_path, capsys):
    first, second = articles(shared_data)[:2]
    path = jsonl_with_blank_line_2(tmp_path / "docs.jsonl", first, dict(second, text=None))
    with pytest.raises(SystemExit) as exited:  # (a usage error: status 2, one line)
        main(["tasks", "from-corpus", path, "--out", str(tmp_path / "t.jsonl"), "--quiet"])
    assert exited.value.code == 2
    assert f"corpus '{path}' line 3: 'text' must be text, got null" in capsys.readouterr().err


# -- 2. one document twice --------------------------------------------------------------------


def search_titles(env, query):
    from benchmax_gym.envs.wikipedia.backends import CorpusBackend

    return [hit.title for hit in CorpusBackend(env.unwrapped.backend).search(query, 10)]


def test_a_document_copied_into_two_folders_is_indexed_once(shared_data, tmp_path, questions):
    """The same file in two folders was indexed as "Aristotle" and "Aristotle (2)": every search
    for it returned its text twice."""
    docs = tmp_path / "docs"
    for folder in ("2024", "2025"):
        (docs / folder).mkdir(parents=True)
        for article in articles(shared_data)[:3]:
            (docs / folder / f"{article['title']}.md").write_text(f"# {article['title']}\n\n{article['text']}\n")
    env = corpus_env({"questions": questions, "path": str(docs)})
    assert search_titles(env, "Aristotle philosopher").count("Aristotle") == 1
    assert not any(title.endswith("(2)") for title in search_titles(env, "Aristotle philosopher"))


def test_tasks_from_corpus_drops_a_record_given_twice_and_says_how_many(shared_data, tmp_path, capsys):
    """A {title, text} record given twice became "X" and "X (2)" in the index the tasks are played on."""
    records = articles(shared_data)[:4]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records + [records[1]]))
    out = tmp_path / "t.jsonl"
    assert main(["tasks", "from-corpus", str(path), "--out", str(out), "--corpus-out", str(tmp_path / "c.jsonl"),
                 "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"] == 4 and summary["duplicates_dropped"] == 1
    written = [json.loads(line)["title"] for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert written == [r["title"] for r in records]
    assert main(["tasks", "from-corpus", str(path), "--out", str(out), "--overwrite", "--quiet"]) == 0
    assert "4 documents (1 dropped: the same title and text as another)" in capsys.readouterr().out


def test_one_title_with_two_texts_is_refused_naming_both_lines(shared_data, tmp_path, questions):
    """The index keeps one article a title: the second text was silently never searchable."""
    first, second = articles(shared_data)[:2]
    path = jsonl_with_blank_line_2(tmp_path / "corpus.jsonl", first, dict(second, title=first["title"].upper()))
    with pytest.raises(ValueError, match=rf"^corpus '{re.escape(str(path))}' line 1 and line 3 both hold the title 'ARISTOTLE', "
                                         "with different texts"):
        corpus_env({"questions": questions, "path": path})
    # the same record twice is one document, and plays
    same = jsonl_with_blank_line_2(tmp_path / "same.jsonl", first, first, second)
    env = corpus_env({"questions": questions, "path": same})
    assert search_titles(env, "Aristotle").count("Aristotle") == 1


def test_hotpotqa_paragraphs_shared_by_questions_still_load_as_one_corpus(shared_data, tmp_path):
    """HotpotQA questions share context paragraphs (the sample holds one title twice): its own
    paragraphs stay a corpus, the first of a title kept."""
    env = gym.make("benchmax/Wikipedia-v0", tasks="hotpotqa",
                   task_args={"dataset": str(shared_data / "hotpotqa" / "dev_distractor_100.json")}, backend="local")
    assert len(env.unwrapped.tasks) == 100
    env.close()
    copy = tmp_path / "hotpot.json"
    shutil.copy(shared_data / "hotpotqa" / "dev_distractor_100.json", copy)
    from benchmax_gym.envs.wikipedia.tasks import read_corpus

    records, _, dropped = read_corpus(copy)
    assert dropped >= 1 and len({r["title"] for r in records}) == len(records)
