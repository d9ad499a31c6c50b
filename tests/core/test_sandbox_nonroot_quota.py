"""The workspace quota on non-root hosts holds while the code writes, as on root hosts. Real
sandboxes run by an unprivileged user (uid 65534 through setpriv when the tests run as root)."""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_sandbox_uids_and_sockets import CODE_PATH, _as_nobody  # noqa: E402

QUOTA_MB = 16

# Writes 3x the quota, in files well under the per-file limit, into /tmp and into the workspace;
# nothing is deleted during the write, so what it wrote before its first error was all held at once.
FILL = r"""
import os, sys
where, size, wrote = sys.argv[0], 256 << 10, 0
try:
    for i in range(3 * QUOTA_MB * 4):
        with open(os.path.join(where, f'fill{i}'), 'wb') as f:
            f.write(b'x' * size)
        wrote += size
    print('NOT STOPPED', wrote)
except OSError as e:
    print('STOPPED', e.errno, wrote)
"""

AS_USER = r"""
import json, os, sys
from benchmax_gym.core.sandbox import Sandbox, SandboxLimits
fill, quota = sys.argv[1], int(sys.argv[2])
out = []
with Sandbox(limits=SandboxLimits(timeout=60, max_file_mb=1, workspace_mb=quota)) as box:
    box.put_file("input.txt", b"from the host")
    for where in ("/tmp", "."):
        out.append(box.run(f"import sys; sys.argv = [{where!r}]\n" + fill).stdout)
        out.append(box._usage())  # what the host holds for the episode after the call
        box.run("import glob, os\nfor p in glob.glob('/tmp/fill*') + glob.glob('fill*'):\n    os.unlink(p)")
    # the host still reaches the workspace both ways, and the room is back once the code deleted
    out.append(box.run("print(open('input.txt').read()); open('from_code.txt', 'w').write('written')").stdout)
    out.append((box.workspace / "from_code.txt").read_text())
print(json.dumps([os.geteuid()] + out))
"""


def test_a_non_root_hosts_quota_stops_writes_during_the_call(bubblewrap):
    """A non-root host had no tmpfs per episode: a call wrote files under the per-file limit
    until its time ran out (here 48 MiB under a quota of 16, into /tmp or the workspace), all
    on the host's disk and memory at once, and only then the excess was deleted. Now the
    episode's tmpfs, mounted in a user namespace of the sandbox's own, refuses the write that
    would pass the quota (ENOSPC) while the code runs; the host reaches the files as before."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": "/tmp", "PYTHONPATH": CODE_PATH}
    proc = subprocess.run([*_as_nobody(), sys.executable, "-c", AS_USER, FILL.replace("QUOTA_MB", str(QUOTA_MB)),
                           str(QUOTA_MB)], capture_output=True, text=True, timeout=300, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    uid, tmp_fill, tmp_usage, ws_fill, ws_usage, read_back, from_code = json.loads(proc.stdout.splitlines()[-1])
    assert uid != 0
    quota = QUOTA_MB << 20
    for fill, usage in ((tmp_fill, tmp_usage), (ws_fill, ws_usage)):
        words = fill.split()
        assert words[0] == "STOPPED" and int(words[1]) in (28, 122), fill  # ENOSPC / EDQUOT, inside the call
        assert int(words[2]) <= quota, fill  # held at once: never past the quota
        assert usage <= quota + (1 << 20), usage
    assert read_back == "from the host\n" and from_code == "written"


AFTER_THE_HELPER_DIES = r"""
import json, os, signal
from benchmax_gym.core.sandbox import Sandbox, SandboxLimits
limits = SandboxLimits(timeout=60, workspace_mb=16)
with Sandbox(limits=limits) as first:
    first.run("print(1)")
    helper = first._pool.mounts.proc.pid
    os.kill(helper, signal.SIGKILL)  # (as the OOM killer would)
    os.waitid(os.P_PID, helper, os.WEXITED | os.WNOWAIT)  # (dead, not reaped: as the pool finds it)
    with Sandbox(limits=limits) as second:
        second.put_file("in.txt", b"from the host")
        out = second.run("print(open('in.txt').read()); open('out.txt', 'w').write('from the code')").stdout
        print(json.dumps([second._pool is not first._pool, out, (second.workspace / "out.txt").read_text()]))
"""


def test_a_pool_whose_mount_holder_died_is_replaced_for_new_episodes(bubblewrap):
    """The process holding a non-root pool's namespace killed (its episodes' files are then out of
    the host's reach): a new episode gets a new pool whose files the host reaches, where it failed
    with a bare FileNotFoundError under /proc/PID/root."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": "/tmp", "PYTHONPATH": CODE_PATH}
    proc = subprocess.run([*_as_nobody(), sys.executable, "-c", AFTER_THE_HELPER_DIES], capture_output=True,
                          text=True, timeout=300, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [True, "from the host\n", "from the code"]
