"""Hostile model code against the fallback level and the host's own walks of a workspace: a
process that leaves the call's session where no cgroup holds the call (a root container whose
cgroups are read-only, where only ``sandbox='rlimits'`` runs), and an entry swapped between the
host's look at it and its use. Real sandboxes, real processes, real files."""

import ctypes
import os
import secrets
import stat
import threading
import time

import psutil
import pytest

from benchmax_gym.core import sandbox as sandbox_module
from benchmax_gym.core.sandbox import RLIMITS, Sandbox, SandboxLimits, _Pool, _workspace_usage, remove_tree

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="the code runs as an episode uid of its own only on root hosts")

# The code's escape: a double fork into a session of its own, then a long sleep (found by its marker).
ESCAPE = ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
          "        os.closerange(0, 1024)\n        os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
          "    os._exit(0)\n")


def _survivors(marker):
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", marker]]


def _gone(marker, within=30.0):
    """Whether the marked process is gone (a killed one may take a moment to be reaped)."""
    deadline = time.monotonic() + within
    while _survivors(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _survivors(marker)


@pytest.fixture
def cgroupless_box():
    """An rlimits sandbox with no cgroup around its calls (as where the host's cgroups are read-only)."""
    pool = _Pool(RLIMITS, (), cgroups=False, tmpfs=False)
    box = Sandbox(limits=SandboxLimits(timeout=20), pool=pool)
    yield box
    box.close()
    pool.shut_down()


@ROOT_ONLY
def test_a_session_leaver_does_not_outlive_its_call_where_no_cgroup_holds_it(cgroupless_box):
    """It survived every call and the episode itself: it kept running as the episode's uid, raced
    the host's walks of the workspace, and read the files of the next episode given that uid."""
    marker = str(7_000_000 + secrets.randbelow(1_000_000))
    try:
        result = cgroupless_box.run(ESCAPE.format(marker=marker) + "print('left one running')")
        assert result.stdout == "left one running\n"
        assert _gone(marker), "a process the call left running outlived it"
        assert cgroupless_box.run("print(6 * 7)").stdout == "42\n"
    finally:
        for process in _survivors(marker):
            process.kill()


@ROOT_ONLY
def test_a_session_leaver_does_not_outlive_its_episode_ended_during_the_call(cgroupless_box):
    """The episode ends while its call runs: the server kills the call's monitor, which then
    sweeps nothing; the episode's close must, before its uid goes to another episode."""
    marker = str(8_000_000 + secrets.randbelow(1_000_000))
    code = ESCAPE.format(marker=marker) + "import time\ntime.sleep(60)"
    results = []
    thread = threading.Thread(target=lambda: results.append(cgroupless_box.run(code)))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not _survivors(marker) and time.monotonic() < deadline:  # (it execs sleep as the call sleeps)
            time.sleep(0.02)
        assert _survivors(marker), "the escape did not run"
        cgroupless_box.close()
        thread.join(30)
        assert results and "episode ended" in results[0].text
        assert _gone(marker), "a process the call left running outlived its episode"
    finally:
        thread.join(30)
        for process in _survivors(marker):
            process.kill()


def _exchange(directory_fd, a, b):
    """Swap two names atomically (renameat2 RENAME_EXCHANGE), as code racing the host does."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(directory_fd, a.encode(), directory_fd, b.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")


@pytest.mark.parametrize("walk", [_workspace_usage, remove_tree], ids=["quota", "remove"])
def test_a_directory_swapped_for_a_link_after_the_hosts_look_never_has_the_host_change_the_links_target(
        tmp_path, monkeypatch, walk):
    """The host opens up a directory the code closed (mode 077) before walking into it; code that
    swaps it for a symlink right after the host looked had the host (root) chmod the link's
    target instead: any host file made 0777 (/etc/passwd, a setuid binary). The swap is forced
    at that moment here; code running beside the walk wins it by chance."""
    victim = tmp_path / "host-file"
    victim.write_text("the host's")
    victim.chmod(0o600)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "d").mkdir()
    (workspace / "d").chmod(0o077)
    (workspace / "l").symlink_to(victim)
    real_stat, swapped = os.stat, []

    def stat_then_swap(path, *args, dir_fd=None, **kwargs):
        st = real_stat(path, *args, dir_fd=dir_fd, **kwargs)
        if path == "d" and dir_fd is not None and not swapped:
            _exchange(dir_fd, "d", "l")  # the code's move, just after the host's look
            swapped.append(True)
        return st

    monkeypatch.setattr(sandbox_module.os, "stat", stat_then_swap)
    walk(workspace)
    monkeypatch.undo()
    assert swapped
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.read_text() == "the host's"


@ROOT_ONLY
@pytest.mark.parametrize("planted", ["symlink", "directory"])
def test_a_workspace_root_planted_in_the_temp_dir_by_another_uid_is_refused(tmp_path, monkeypatch, planted):
    """``/tmp/benchmax-gym-UID`` is a name anyone can take first: code at level ``rlimits`` (its
    TMPDIR is the host's /tmp) or another local user. A symlink there to a directory of theirs,
    or a directory of their own, was used as the root of every workspace: the host chmodded it,
    made its pools in it, and its owner could swap them for its own and read every episode's
    files. It is refused, naming it, and nothing is made in it."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    temp.chmod(0o1777)
    theirs = temp / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    theirs.chmod(0o777)
    root = temp / f"benchmax-gym-{os.geteuid()}"
    if planted == "symlink":
        root.symlink_to(theirs)
        os.lchown(root, 65534, 65534)
    else:
        root.mkdir()
        os.chown(root, 65534, 65534)
        root.chmod(0o777)
        theirs = root
    monkeypatch.setattr(sandbox_module.tempfile, "tempdir", str(temp))
    with pytest.raises(OSError, match=str(root)):
        _Pool(RLIMITS, (), cgroups=False, tmpfs=False)
    assert os.listdir(theirs) == []
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o777


# -- attacks the bubblewrap level already stops (kept as regression tests) --------------------------


@pytest.fixture
def math_env(bubblewrap):
    import gymnasium as gym

    import benchmax_gym  # noqa: F401

    env = gym.make("benchmax/Math-v0", tool_timeout=5, max_turns=20)
    env.reset(seed=0)
    yield env
    env.close()


def _run_python(env, code):
    import json

    action = "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"
    obs, _, terminated, _, info = env.step(action)
    assert not terminated
    return obs, info["error"]


def test_the_hosts_abstract_sockets_descriptors_and_names_are_out_of_reach(math_env):
    """Abstract unix sockets (the fork server's, Ray's) live in a network namespace: the code's
    own has none of the host's; it holds no descriptor but its stdio and status pipe; no name
    resolves."""
    import socket

    name = f"\0benchmax-redteam-{secrets.token_hex(6)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen(1)
    listener.setblocking(False)
    try:
        obs, error = _run_python(math_env, f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({name!r})\nprint('CONNECTED')")
        assert error == "tool_error" and "ConnectionRefusedError" in obs and "CONNECTED" not in obs
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    obs, error = _run_python(math_env, "import os\nfor fd in sorted(os.listdir('/proc/self/fd'), key=int):\n"
                                       "    try: print(fd, os.readlink('/proc/self/fd/' + fd))\n    except OSError: pass")
    targets = [line.split(" ", 1)[1] for line in obs.split("stdout:\n")[1].split("\n</tool_response>")[0].splitlines()]
    assert error is None and len(targets) >= 3  # stdin, stdout, stderr (and the status pipe)
    assert all(t == "/dev/null" or t.startswith("pipe:[") for t in targets), targets
    obs, error = _run_python(math_env, "import socket\nsocket.getaddrinfo('pypi.org', 443)")
    assert error == "tool_error" and "gaierror" in obs


def test_names_with_newlines_and_bytes_that_are_not_utf8_break_neither_the_quota_nor_cleanup():
    """Where the quota is checked after the call (no tmpfs), the host walks what the code made:
    names with newlines and undecodable bytes, over the quota, are deleted and cleanup leaves nothing."""
    pool = _Pool(RLIMITS, (), cgroups=False, tmpfs=False)
    box = Sandbox(limits=SandboxLimits(timeout=10, workspace_mb=1), pool=pool)
    try:
        code = ("import os\nos.makedirs(b'a\\nb/\\xff\\xfe', exist_ok=True)\n"
                "for i in range(3):\n    open(b'a\\nb/\\xff\\xfe/x\\n' + bytes([0x80 + i]), 'wb').write(b'z' * 400_000)\n"
                "open(os.path.join(os.environ.get('TMPDIR', '/tmp').encode(), b'\\xc3\\x28\\n'), 'wb').write(b'z')\n"
                "print('written')")
        result = box.run(code)
        assert result.stdout == "written\n" and result.error == "file_size_limit", result.text
        assert box._usage() <= 1024 * 1024
        assert box.run("print(6 * 7)").stdout == "42\n"
        directory = box._dir
    finally:
        box.close()
        pool.shut_down()
    assert not directory.exists()


def test_temp_files_of_code_at_the_rlimits_level_stay_in_its_episode():
    """Its TMPDIR was the host's /tmp: what ``tempfile`` made there outlived the episode and was
    there for the next episode's code to read. It is the episode's own /tmp, deleted with it."""
    made = None
    try:
        with Sandbox(mode="rlimits", limits=SandboxLimits(timeout=10)) as box:
            # where tempfile puts its files: TMPDIR first (this host's stdlib may be out of the code's reach)
            result = box.run("import os\npath = os.path.join(os.environ.get('TMPDIR', '/tmp'), "
                             "'redteam-' + os.urandom(4).hex())\nopen(path, 'w').close()\nprint(path)")
            made = result.stdout.strip()
            assert result.error is None and made, result.text
            assert os.path.dirname(made) == str(box.tmp)
        assert not os.path.exists(made)
    finally:
        if made and os.path.isfile(made):
            os.unlink(made)
