"""A user's files are untrusted input: a task file, a run file or a corpus that is broken, hostile
or not a file at all is refused in one line naming the file (and line), never a traceback from
inside a parser, a hang, or a file from outside the corpus read into the index."""

import json
import os
import threading

import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.cli import main
from benchmax_gym.data import load_tasks, read_jsonl
from benchmax_gym.data.corpus import load_documents

GOOD = json.dumps({"id": "a", "prompt": "What is 2 + 2?", "answer": "4"})


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("content, says", [
    # (a UnicodeDecodeError whose message named neither the file nor the line)
    (GOOD.encode() + b'\n\n{"prompt": "caf\xe9", "answer": "1"}\n', r"line 3: not UTF-8 text \(byte 15 of the line\)"),
    # (json.loads' RecursionError)
    (GOOD.encode() + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n", r"line 2: JSON nested too deeply"),
])
@pytest.mark.parametrize("read", [load_tasks, lambda path: read_jsonl(path, "RUN")])
def test_an_unreadable_line_is_refused_naming_the_file_and_line(tmp_path, content, says, read):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=says) as raised:
        read(path)
    assert str(path) in str(raised.value)


def test_a_byte_order_mark_is_read_as_the_mark(tmp_path):
    """(Windows editors write one; the file's first task was "not JSON")."""
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n")
    assert [t.answer for t in load_tasks(path).tasks] == ["4"]


def test_two_tasks_with_one_id_in_a_file_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(f"{GOOD}\n{GOOD}\n")
    with pytest.raises(ValueError, match=r"share the id 'a'") as raised:
        load_tasks(path)
    assert str(path) in str(raised.value)


def test_a_fifo_as_a_task_file_is_refused_without_waiting_for_a_writer(tmp_path):
    """Opening a FIFO blocks until a writer comes (a device such as /dev/zero never ends)."""
    fifo = tmp_path / "tasks.jsonl"
    os.mkfifo(fifo)
    raised = []

    def load():
        try:
            load_tasks(fifo)
        except Exception as exc:
            raised.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(60)  # (a hang guard, not a timing)
    if worker.is_alive():  # a reader waits in open(): give it a writer that writes nothing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
        pytest.fail("loading the tasks opened the FIFO and waited for a writer")
    assert raised and isinstance(raised[0], ValueError) and "not a regular file" in str(raised[0])


def from_corpus(tmp_path, docs):
    with pytest.raises(SystemExit) as exit_:
        main(["tasks", "from-corpus", str(docs), "--out", str(tmp_path / "t.jsonl"), "--quiet"])
    return exit_.value.code


def test_a_json_corpus_file_not_in_utf8_is_refused_naming_it(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nThe good document was written in 1999.\n")
    (docs / "people.jsonl").write_bytes(b'{"title": "Caf\xe9", "text": "It opened in 1901."}\n')
    with pytest.raises(ValueError, match=r"people\.jsonl: not UTF-8 text"):
        load_documents(docs)
    assert from_corpus(tmp_path, docs) == 2
    err = capsys.readouterr().err
    assert "people.jsonl" in err and "Traceback" not in err


def test_a_broken_pdf_is_refused_naming_it_not_a_traceback(tmp_path, capsys):
    pytest.importorskip("pypdf")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nThe good document was written in 1999.\n")
    (docs / "report.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog")  # (cut off: no xref, no EOF)
    with pytest.raises(ValueError, match=r"report\.pdf: not a PDF this can read"):
        load_documents(docs)
    assert from_corpus(tmp_path, docs) == 2  # (pypdf's own error ended the command with a traceback)
    assert "report.pdf" in capsys.readouterr().err


def test_a_corpus_file_linking_outside_the_folder_is_refused_naming_it(tmp_path, capsys):
    """A folder from elsewhere (an archive, a clone) holding ``notes.txt -> ~/.ssh/id_rsa`` put that
    file into the index the model searches, and into the questions."""
    secret = tmp_path / "secret"
    secret.write_text("The password of the vault is hunter2, set in 2021.")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nThe good document was written in 1999.\n")
    (docs / "notes.txt").symlink_to(secret)
    (docs / "same.md").symlink_to(docs / "good.md")  # (a link inside the folder is read: the same document, once)
    with pytest.raises(ValueError, match=r"notes\.txt links outside the folder"):
        load_documents(docs)
    assert from_corpus(tmp_path, docs) == 2
    assert "hunter2" not in capsys.readouterr().err
    (docs / "notes.txt").unlink()
    assert sorted(d.title for d in load_documents(docs)) == ["Good"]
    assert [d.text for d in load_documents(secret.rename(tmp_path / "secret.txt"))][0].startswith("The password")
