"""Owned temp folders: what the sweep of dead owners' folders removes, and what it must leave."""
import os
import subprocess
import tempfile

import pytest

from benchmax_gym.core import tempdirs


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tempdirs, "_swept", set())
    return tmp_path


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_first_folder_a_process_makes_removes_dead_owners_folders_only(temp_root):
    ns = tempdirs._pid_namespace()
    dead, live = dead_pid(), os.getppid()
    gone = [temp_root / f"benchmax-mcp-p{dead}-n{ns}-a", temp_root / f"benchmax-excel-p{dead}-n{ns}-b"]
    kept = [temp_root / f"benchmax-mcp-p{live}-n{ns}-c",  # its owner runs
            temp_root / f"benchmax-mcp-p{dead}-n{ns + 1}-d",  # another pid namespace's: its pid means another process
            temp_root / f"benchmax-mcp-{dead}-e",  # not an owned name
            temp_root / f"sandbox-{dead}-f"]
    for folder in gone + kept:
        (folder / "workspace").mkdir(parents=True)
        (folder / "workspace" / "notes.note").write_text("x")
    outside = temp_root / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    link = temp_root / f"benchmax-mcp-p{dead}-n{ns}-link"
    link.symlink_to(outside)  # a link planted with an owned name: never followed
    other_user = temp_root / f"benchmax-mcp-p{dead}-n{ns}-other"
    other_user.mkdir()
    if os.geteuid() == 0:  # (only root can give a folder to another user)
        os.chown(other_user, 65534, 65534)
        kept.append(other_user)
    else:
        gone.append(other_user)

    made = tempdirs.owned_tempdir("mcp")
    assert made.parent == temp_root and made.name.startswith(f"benchmax-mcp-p{os.getpid()}-n{ns}-")
    assert [p for p in gone if p.exists()] == []
    assert [p for p in kept if not p.exists()] == []
    assert link.is_symlink() and (outside / "keep.txt").read_text() == "x"

    again = temp_root / f"benchmax-excel-p{dead}-n{ns}-later"
    again.mkdir()
    with tempdirs.owned_workspace("excel") as second:  # (one sweep per process: later ones are left)
        assert second.is_dir() and again.exists()
    assert not second.exists() and made.exists()


def test_a_reaped_workers_folders_are_removed_by_the_caller_that_knows_it_ended(temp_root):
    ns = tempdirs._pid_namespace()
    worker, other = dead_pid(), dead_pid()
    mine = temp_root / f"benchmax-excel-p{worker}-n{ns}-x"
    theirs = temp_root / f"benchmax-excel-p{other}-n{ns}-y"
    for folder in (mine, theirs):
        folder.mkdir()
    tempdirs.remove_owned(worker)
    assert not mine.exists() and theirs.exists()


@pytest.mark.parametrize("kind", ["", "MCP", "a-b", "../x", "mcp-p1"])
def test_a_kind_is_lower_case_letters(temp_root, kind):
    with pytest.raises(ValueError, match="kind must be lower-case letters"):
        tempdirs.owned_tempdir(kind)
    assert list(temp_root.iterdir()) == []


def test_each_folder_is_swept_once_a_process_and_only_that_folder(temp_root):
    ns = tempdirs._pid_namespace()
    dead = dead_pid()
    inner = temp_root / "benchmax-gym-0"
    inner.mkdir()
    top, nested = temp_root / f"benchmax-mcp-p{dead}-n{ns}-a", inner / f"benchmax-sandbox-p{dead}-n{ns}-b"
    for folder in (top, nested):
        folder.mkdir()
    made = tempdirs.owned_tempdir("sandbox", dir=inner)
    assert made.parent == inner and not nested.exists() and top.exists()  # (only the folder it makes one in)
    nested.mkdir()
    tempdirs.owned_tempdir("sandbox", dir=inner)
    assert nested.exists()  # (once a process per folder)
    tempdirs.owned_tempdir("mcp")
    assert not top.exists()
