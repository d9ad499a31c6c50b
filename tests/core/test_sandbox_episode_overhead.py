"""Per-episode work of the sandbox that can be skipped without weakening it: the host's id files
(/etc/passwd, group, subuid, subgid) and login.defs are parsed again only when they changed,
so a user added while the process runs still never shares an episode's uid; and the kernel's
wait after detaching an episode's tmpfs runs on a thread of its own, the close returning once
the mount is off the tree (root hosts). Real files, real uid reservations (the host-wide lock
file), real mounts, servers and processes."""

import os
import secrets
import subprocess
import sys
import threading
import time

import pytest

from benchmax_gym.core import sandbox as sandbox_module
import benchmax_gym
from benchmax_gym.core.sandbox import _UIDS, BUBBLEWRAP, Sandbox, _Pool

CODE_PATH = os.path.dirname(os.path.dirname(benchmax_gym.__file__))  # the code under test

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="episodes get uids of their own only on root hosts")
LONG_AGO = time.time_ns() - 3600 * 10**9
MODULE_WINDOW_NS = getattr(sandbox_module, "_RACY_NS", 2_000_000_000)
WINDOW_NS = 300_000_000  # the tests' "racily recent" window (tmpfs stamps tick far finer)


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch):
    """Files changed within the window are read every time; a short one keeps the tests short."""
    monkeypatch.setattr(sandbox_module, "_RACY_NS", WINDOW_NS, raising=False)


def _aged(path) -> None:
    """Wait until ``path``'s last change (its ctime: utime cannot set it back) is out of the window."""
    while time.time_ns() - os.stat(path).st_ctime_ns <= WINDOW_NS:
        time.sleep(0.05)


def _band(size: int) -> range:
    """Uids no other test uses (the host-wide lock file is shared with them)."""
    first = 7_000_000 + size * secrets.randbelow(1_000_000)
    return range(first, first + size)


def _write(path, text: str) -> str:
    path.write_text(text)
    os.utime(path, ns=(LONG_AGO, LONG_AGO))
    _aged(path)
    return str(path)


def _files(tmp_path, band: range, given: int) -> dict[str, str]:
    """Id files (changed long ago) that give away ``band[given]``, and nothing else of ``band``."""
    return {
        "passwd": _write(tmp_path / "passwd", "root:x:0:0:root:/root:/bin/bash\n"),
        "group": _write(tmp_path / "group", "root:x:0:\n"),
        "subuid": _write(tmp_path / "subuid", f"alice:{band[given]}:1\n"),
        "subgid": _write(tmp_path / "subgid", ""),
    }


def _uid_of_an_episode(pool) -> int:
    box = Sandbox(pool=pool)
    try:
        return box.uid
    finally:
        box.close()


@ROOT_ONLY
def test_an_id_file_changed_between_episodes_is_read_again_even_with_its_size_and_mtime_kept(tmp_path, monkeypatch):
    """A subordinate range given to a user while the process runs is never an episode's uid: the
    kept parse is dropped when the file changes, here rewritten in place to the same size and
    its mtime put back (only its ctime tells), and when it is replaced by a new file."""
    band = _band(2)
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", band)
    files = _files(tmp_path, band, given=0)
    monkeypatch.setattr(sandbox_module, "ID_FILES", files, raising=False)
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)  # no server: the uids are the point
    try:
        assert _uid_of_an_episode(pool) == band[1]
        assert _uid_of_an_episode(pool) == band[1]  # (read from what was kept)
        with open(files["subuid"], "r+") as f:  # the same inode, size and mtime: another range
            f.write(f"alice:{band[1]}:1\n")
        os.utime(files["subuid"], ns=(LONG_AGO, LONG_AGO))
        _aged(files["subuid"])  # (not read for being recent: its stamps are what tells)
        assert _uid_of_an_episode(pool) == band[0]
        replacement = tmp_path / "subuid.new"  # as useradd does: a new file renamed into place
        _write(replacement, f"alice:{band[0]}:1\n")
        os.rename(replacement, files["subuid"])
        assert _uid_of_an_episode(pool) == band[1]
        os.unlink(files["subuid"])  # gone: it gives nothing (both are free)
        assert {_uid_of_an_episode(pool) for _ in range(40)} == set(band)
    finally:
        pool.shut_down()


@ROOT_ONLY
def test_unchanged_id_files_are_read_once_across_episodes(tmp_path, monkeypatch):
    """Each episode picks its uid off the host's id files; reading and parsing them every time
    cost a share of an episode's CPU. Unchanged files are opened once, however many episodes."""
    band = _band(2)
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", band)
    files = _files(tmp_path, band, given=0)
    monkeypatch.setattr(sandbox_module, "ID_FILES", files, raising=False)
    opened = []

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(sandbox_module, "open", counting_open, raising=False)
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
    try:
        assert [_uid_of_an_episode(pool) for _ in range(5)] == [band[1]] * 5
    finally:
        pool.shut_down()
    assert sorted(p for p in opened if p in files.values()) == sorted(files.values())


def test_a_login_defs_changed_while_running_moves_the_second_band(tmp_path, monkeypatch):
    """The bands after the first start above useradd's pool as login.defs sets it: a raised
    SUB_UID_MAX is honoured by the next episode, and an unchanged file is not read again."""
    monkeypatch.delenv(sandbox_module.UID_BANDS_ENV, raising=False)
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", (range(200_000, 300_000), range(1_000_000, 2_000_000)))
    defs = tmp_path / "login.defs"
    monkeypatch.setattr(sandbox_module, "LOGIN_DEFS", _write(defs, "SUB_UID_MAX 1200000\n"))
    monkeypatch.setattr(sandbox_module, "SUBID_MAX_DEFAULT", 0)
    opened = []

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(sandbox_module, "open", counting_open, raising=False)
    assert sandbox_module._uid_bands()[1] == range(1_200_001, 2_000_000)
    assert sandbox_module._uid_bands()[1] == range(1_200_001, 2_000_000)
    assert opened.count(str(defs)) == 1
    with open(defs, "r+") as f:  # same size, mtime put back
        f.write("SUB_UID_MAX 1500000\n")
    os.utime(defs, ns=(LONG_AGO, LONG_AGO))
    _aged(defs)
    assert sandbox_module._uid_bands()[1] == range(1_500_001, 2_000_000)
    assert opened.count(str(defs)) == 2


def test_a_file_changed_just_now_is_read_every_time(tmp_path, monkeypatch):
    """Timestamps tick coarsely: a file written within the same tick twice keeps its stamps. One
    changed lately is not kept at all, so a second change a moment later is still seen."""
    monkeypatch.setattr(sandbox_module, "_RACY_NS", MODULE_WINDOW_NS, raising=False)
    path = tmp_path / "subuid"
    path.write_text("alice:7000:1\n")  # now: too recent to trust its stamps
    parses = []

    def parse(text):
        parses.append(text)
        return text

    assert sandbox_module._parsed(str(path), "test", parse) == "alice:7000:1\n"
    assert sandbox_module._parsed(str(path), "test", parse) == "alice:7000:1\n"
    assert len(parses) == 2


def _mounted(fragment: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if fragment in line.split()[4]]


@ROOT_ONLY
def test_a_closed_episode_is_unmounted_gone_and_unreachable_without_its_close_waiting_for_the_kernel(
        bubblewrap, monkeypatch):
    """umount2 of an episode's tmpfs waited on the episode's own thread for an RCU grace period
    after the mount was already off the tree (0.6 ms an episode on an idle host, several on a
    loaded one). It runs on another thread now, and still, when close returns: the mount is off
    the tree, the workspace gone, the uid another episode's to take, and the next episode on the
    same server reaches nothing of the old one."""
    detached_on = []
    real = sandbox_module._detach

    def recording(path):
        detached_on.append((path, threading.current_thread()))
        return real(path)

    monkeypatch.setattr(sandbox_module, "_detach", recording)
    lease = sandbox_module.SandboxLease(BUBBLEWRAP, ())  # the server outlives the episodes, as an env's does
    try:
        for _ in range(3):
            box = Sandbox(mode="bubblewrap")
            assert box.tmpfs, "root hosts give each episode a tmpfs"
            secret = secrets.token_hex(8)
            result = box.run(f"open('secret.txt', 'w').write({secret!r})\n"
                             f"open('/tmp/secret.txt', 'w').write({secret!r})")
            assert result.error is None, result.text
            episode_dir, uid = box._dir, box.uid
            box.close()
            assert not _mounted(f"ep-{box.name}"), "the tmpfs is off the tree when close returns"
            assert not episode_dir.exists() and not box.workspace.exists()
            assert uid not in _UIDS.held
            with Sandbox(mode="bubblewrap") as after:
                seen = after.run(  # its listings, and every file of every tmpfs it sees that holds the secret
                    "import os, subprocess\n"
                    "print(sorted(os.listdir('/workspace')), sorted(os.listdir('/tmp')))\n"
                    "tmpfs = {l.split()[4] for l in open('/proc/self/mountinfo') if ' - tmpfs ' in l} - {'/', '/dev'}\n"
                    "print(sorted(tmpfs), subprocess.run(['grep', '-rlsD', 'skip', '" + secret + "', *tmpfs], "
                    "capture_output=True, text=True).stdout)")
            assert seen.error is None, seen.text
            assert "'/workspace'" in seen.stdout and "'/tmp'" in seen.stdout, seen.stdout  # (they were searched)
            assert secret not in seen.stdout and "secret.txt" not in seen.stdout, seen.stdout
        ours = [thread for path, thread in detached_on if "/ep-" in path]
        assert ours and threading.current_thread() not in ours, detached_on
    finally:
        lease.release()


@ROOT_ONLY
def test_a_process_that_exits_right_after_closing_its_episodes_leaves_nothing_mounted(bubblewrap, tmp_path):
    """The detaching thread is the process's own: exiting right after the last close (the
    kernel's wait may still be under way) leaves no tmpfs of its pool mounted."""
    script = (
        "from benchmax_gym.core.sandbox import Sandbox, SandboxLease\n"
        "lease = SandboxLease('bubblewrap', ())\n"
        "for i in range(20):\n"
        "    box = Sandbox(mode='bubblewrap')\n"
        "    if i % 5 == 0:\n"
        "        assert box.run('open(\"f\", \"w\").write(\"x\")').error is None\n"
        "    print(box._pool.dir, flush=True)\n"
        "    box.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": CODE_PATH, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    pool_dir = out.stdout.split()[0]
    assert pool_dir.startswith(str(tmp_path)), out.stdout
    assert not _mounted(pool_dir)
    assert not os.path.exists(pool_dir)
