"""Which uid an episode's code runs as on a root host: never one the host gives to a user, a group
or a user's own namespaces (rootless containers), and never one another open sandbox holds, even
in a container with a /run of its own. Real files, real locks, real processes."""

import os
import secrets
import shutil
import subprocess
import sys

import pytest

import benchmax_gym
from benchmax_gym.core import sandbox as sandbox_module
from benchmax_gym.core.sandbox import BUBBLEWRAP, RLIMITS, Sandbox, _Pool

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="episodes get uids of their own only on root hosts")
CODE_PATH = os.path.dirname(os.path.dirname(benchmax_gym.__file__))  # the code under test


def _band(size: int) -> range:
    """Uids no other test uses (the host-wide lock file is shared with them)."""
    first = 3_000_000 + size * secrets.randbelow(1_000_000)
    return range(first, first + size)


def _id_files(tmp_path, band: range) -> dict[str, str]:
    """passwd, group, subuid and subgid files that give away all of ``band`` but its 3rd and 9th
    uids (each file some of it), with a comment and a malformed line among them."""
    b = band.start
    texts = {
        "passwd": f"root:x:0:0:root:/root:/bin/bash\nalice:x:{b}:{b + 1}::/home/alice:/bin/sh\nbroken:x:oops\n",
        "group": f"# local groups\nwheel:x:{b + 3}:alice\n",
        "subuid": f"alice:{b + 4}:3\n{b}:{b + 9}:{len(band) - 9}\n",  # a uid may name the owner
        "subgid": f"alice:{b + 7}:1\n",
    }
    files = {}
    for kind, text in texts.items():
        (tmp_path / kind).write_text(text)
        files[kind] = str(tmp_path / kind)
    return files


@ROOT_ONLY
def test_episode_uids_are_none_the_host_gives_to_users_groups_or_their_namespaces(tmp_path, monkeypatch):
    """/etc/subuid and /etc/subgid give users ranges for their own user namespaces (rootless
    containers: 100000-165535, then 165536-..., overlapping the sandbox's 200,000 on); an episode
    given one of those uids shared that user's process limit and could open their containers'
    files. A uid or gid of /etc/passwd or /etc/group is as bad (the code's gid is its uid). Now
    only the uids none of them names are given, then a clear error."""
    band = _band(10)
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", band)
    monkeypatch.setattr(sandbox_module, "ID_FILES", _id_files(tmp_path, band), raising=False)
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)  # no server: the uids are the point
    boxes = []
    try:
        boxes = [Sandbox(pool=pool) for _ in range(2)]
        assert {box.uid for box in boxes} == {band[2], band[8]}
        with pytest.raises(OSError, match="is in use"):
            Sandbox(pool=pool)
        with open(tmp_path / "subgid", "a") as f:  # a user added since
            f.write(f"bob:{band[2]}:1\ncarol:{band[8]}:1\n")
        boxes.pop().close()
        with pytest.raises(OSError, match=r"no sandbox uid is free: .*subgid give every id of"):
            Sandbox(pool=pool)
    finally:
        for box in boxes:
            box.close()
        pool.shut_down()


@ROOT_ONLY
def test_an_unreadable_id_file_is_an_error_not_a_free_range(tmp_path, monkeypatch):
    """Were /etc/subuid unreadable, its ranges would be given out: the sandbox refuses, naming it."""
    band = _band(4)
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", band)
    monkeypatch.setattr(sandbox_module, "ID_FILES", {"subuid": str(tmp_path)}, raising=False)  # EISDIR
    pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
    try:
        with pytest.raises(OSError, match=f"cannot read {tmp_path} to keep sandbox uids off its ids"):
            Sandbox(pool=pool)
    finally:
        pool.shut_down()


# In a container of its own making (a private /run, as docker gives each container) with the
# shared lock file named: the one uid of the band is held by the test, so it gets none.
TAKE_ONE = r"""
import sys
from benchmax_gym.core import sandbox
from benchmax_gym.core.sandbox import BUBBLEWRAP, RLIMITS, Sandbox, _Pool
sandbox.EPISODE_UIDS = range(int(sys.argv[1]), int(sys.argv[2]))
sandbox.ID_FILES = {}
pool = _Pool(BUBBLEWRAP, (), cgroups=False, tmpfs=False)
try:
    print(Sandbox(pool=pool).uid)
except OSError as exc:
    print(exc)
pool.shut_down()
"""


@ROOT_ONLY
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux's unshare")
def test_containers_with_their_own_run_share_reservations_through_the_named_lock_file(tmp_path, monkeypatch):
    """Two containers on one host share its uids but not its /run: each locked its own
    /run/benchmax-gym-uids.lock, so both gave their episodes the same uid. BENCHMAX_GYM_UID_LOCK
    names a file they all see; a process with a private /run then finds the uid held."""
    lock = tmp_path / "uids.lock"
    band = _band(1)
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", band)
    monkeypatch.setattr(sandbox_module, "ID_FILES", {}, raising=False)  # whatever this host gives away
    monkeypatch.setenv("BENCHMAX_GYM_UID_LOCK", str(lock))
    reservations = sandbox_module._UidReservations()
    try:
        assert reservations.reserve() == band.start
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": "/tmp", "PYTHONPATH": CODE_PATH,
               "BENCHMAX_GYM_UID_LOCK": str(lock)}
        script = 'mount -t tmpfs tmpfs /run && exec "$@"'
        other = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
             sys.executable, "-c", TAKE_ONE, str(band.start), str(band.stop)],
            env=env, cwd="/", capture_output=True, text=True, timeout=60)
        assert "is in use" in other.stdout, (other.stdout, other.stderr)
        reservations.release(band.start)
        other = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
             sys.executable, "-c", TAKE_ONE, str(band.start), str(band.stop)],
            env=env, cwd="/", capture_output=True, text=True, timeout=60)
        assert other.stdout.strip() == str(band.start), (other.stdout, other.stderr)
    finally:
        reservations.after_fork()  # closes its descriptor: its locks go with it


@ROOT_ONLY
def test_a_named_lock_file_others_could_write_is_refused(tmp_path, monkeypatch):
    """A lock file anyone may open lets anyone hold every uid (or none): it is refused, naming
    the variable that chose it."""
    lock = tmp_path / "uids.lock"
    lock.write_text("")
    lock.chmod(0o666)
    monkeypatch.setattr(sandbox_module, "ID_FILES", {}, raising=False)
    monkeypatch.setenv("BENCHMAX_GYM_UID_LOCK", str(lock))
    reservations = sandbox_module._UidReservations()
    try:
        with pytest.raises(OSError, match=f"{lock}: not root's own file.*BENCHMAX_GYM_UID_LOCK names it"):
            reservations.reserve()
    finally:
        reservations.after_fork()


@ROOT_ONLY
def test_a_sandbox_that_fails_to_start_gives_back_its_uid_its_directory_and_its_server_lease(tmp_path, monkeypatch):
    """Before, a start that failed after its uid was reserved (a workspace it could not chown, a
    full disk) kept the uid locked for the process's life, and the shared server's lease and the
    episode's directory with it: a long run's failed starts used up the free uids. Now the start
    gives them back before its error goes up."""
    band = _band(1)
    monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", band)
    monkeypatch.setattr(sandbox_module, "ID_FILES", {}, raising=False)
    pool = sandbox_module._acquire(RLIMITS, ("failed_start_probe",))  # the shared pool the box will lease
    users, before = pool.users, set(os.listdir(pool.dir))

    def refuse(workspace, uid):
        raise PermissionError(13, "Permission denied", str(workspace))

    monkeypatch.setattr(sandbox_module, "_own_workspace", refuse)
    try:
        with pytest.raises(PermissionError):
            Sandbox(mode="rlimits", preload=("failed_start_probe",))
        assert pool.users == users and set(os.listdir(pool.dir)) == before
        monkeypatch.undo()
        monkeypatch.setattr(sandbox_module, "EPISODE_UIDS", band)
        monkeypatch.setattr(sandbox_module, "ID_FILES", {}, raising=False)
        with Sandbox(mode="rlimits", preload=("failed_start_probe",)) as box:  # the band's one uid is free again
            assert box.uid == band[0]
    finally:
        sandbox_module._release(pool)
