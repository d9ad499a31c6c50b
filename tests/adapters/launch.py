"""What the launch-script tests share: a script's real arguments, read by running it with the
trainer's command (``python``, ``python3``, ``uv``) replaced by a stub that records its argv."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def script_argv(script, tmp_path, *extra, env=None):
    """The argv ``examples/<script>`` runs its trainer with (``$HOME`` is ``tmp_path``)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    record = tmp_path / "argv.json"
    for name in ("python", "python3", "uv"):
        stub = stubs / name
        stub.write_text(f"#!{sys.executable}\nimport json, sys\n"
                        f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
        stub.chmod(0o755)
    environ = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), **(env or {})}
    out = subprocess.run(["bash", str(EXAMPLES / script), *extra], env=environ, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(record.read_text())


def tiny_model_dir(path, style="qwen2.5"):
    """A tiny random model and its tokenizer saved as a model path trainers load."""
    from benchmax_gym.testing.tokenizers import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer(style)
    tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def run_fresh(args, timeout=600):
    """``python args...`` in a fresh process (this tree first on the path); its last stdout line as JSON."""
    root = str(Path(__file__).resolve().parents[2])
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                         env=environ)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def stub_vllm():
    """Where vLLM is not installed (CPU), the three names OpenRLHF's samples generator and vLLM
    engine module import from it, while they are imported, so their vLLM-free functions
    (``_process_response_into_experience``, ``_load_agent_executor``) run as they are; nothing
    here generates. Removed afterwards: other libraries (TRL) probe whether vLLM is installed."""
    import importlib.util
    import types
    import uuid

    if importlib.util.find_spec("vllm") is not None:
        yield
        return
    vllm = types.ModuleType("vllm")
    vllm.__version__, vllm.__path__, vllm.SamplingParams = "0.0.0", [], types.SimpleNamespace
    inputs, utils = types.ModuleType("vllm.inputs"), types.ModuleType("vllm.utils")
    inputs.TokensPrompt, utils.random_uuid = dict, lambda: uuid.uuid4().hex
    stubs = {"vllm": vllm, "vllm.inputs": inputs, "vllm.utils": utils}
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name in stubs:
            sys.modules.pop(name, None)


class Rank:
    """One launched process (:func:`start_ranks`): ``subprocess.Popen``'s ``poll``/``wait``/``kill``."""

    def __init__(self, zygote, pid):
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.zygote.status(self.pid)
        return self.returncode

    def wait(self, timeout=None):
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.1)
        return self.returncode

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)


class _Zygote:
    """``zygote.py``, started once per test process: it has imported torch and TRL, and forks the
    ranks (the interpreter a rank would start with, imports done: ~5 s of CPU less per rank)."""

    def __init__(self, env):
        import socket

        self.env = env
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py")),
                                          str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, env=env)
        self.control = ours
        ours.settimeout(300)
        if ours.recv(16) != b"ready":  # (its traceback is on this test's stderr)
            raise RuntimeError(f"the TRL zygote did not start (exit status {self.proc.wait(30)})")

    def _ask(self, request):
        self.control.send(json.dumps(request).encode())
        return json.loads(self.control.recv(1 << 16))

    def start(self, argv, env, cwd, log):
        return Rank(self, self._ask({"argv": [str(a) for a in argv], "env": env, "cwd": str(cwd), "log": str(log)}))

    def status(self, pid):
        return self._ask({"status": pid})

    def close(self):
        self.control.close()
        self.proc.wait(30)


_zygotes = {}
_PER_LAUNCH = ("RANK", "LOCAL_RANK", "MASTER_PORT", "PYTEST_CURRENT_TEST")  # (set in each rank, not the zygote)


def start_ranks(script, args, env, cwd, logs):
    """``python script args...`` as ranks 0 and 1 (``RANK``/``LOCAL_RANK`` added to ``env``), each
    writing to its file in ``logs``: forked from a warm interpreter (``zygote.py``) that has imported
    torch and TRL under the same environment. A :class:`Rank` each."""
    import atexit

    shared = {k: v for k, v in env.items() if k not in _PER_LAUNCH}
    key = json.dumps(shared, sort_keys=True)
    if key not in _zygotes:
        _zygotes[key] = _Zygote(shared)
        atexit.register(_zygotes[key].close)
    return [_zygotes[key].start([script, *args], {**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd, log)
            for r, log in enumerate(logs)]


def two_process_env(port=False):
    """The environment of a two-process CPU group: gloo on the loopback interface only, this tree
    first on the path; ``port``: a free ``MASTER_PORT``."""
    import socket

    root = Path(__file__).resolve().parents[2]
    lo = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), "lo")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": lo,
           "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    if port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["MASTER_PORT"] = str(s.getsockname()[1])
    return env


def two_processes_raised(script, out, *args, port=False):
    """Run ``python script OUT ARGS...`` as ranks 0 and 1 of a two-process CPU group (gloo, loopback
    only; ``port``: a free MASTER_PORT, else the script's own store) and return what each wrote to
    ``OUT/failures<rank>.json`` (what its runs raised, rewritten after each run). A launch in which
    nothing new appears in ``out`` (a run starting or ending) for 120 s is stopped: the runs that
    never ended fail their tests. Each process's exit status is not what is tested (gloo's
    teardown after a failed collective aborted once in ~50 launches, results written)."""
    import time

    root = Path(__file__).resolve().parents[2]
    logs = [out / f"log{r}" for r in range(2)]
    procs = start_ranks(script, [out, *args], two_process_env(port), root, logs)
    try:
        seen, last = set(), time.monotonic()
        while any(p.poll() is None for p in procs):
            now = {path.name for path in out.iterdir()}
            if now - seen:
                seen, last = seen | now, time.monotonic()
            elif time.monotonic() - last > 120:
                break  # a hang
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    missing = [r for r in range(2) if not (out / f"failures{r}.json").exists()]
    assert not missing, "\n".join(log.read_text()[-3000:] for log in logs)
    return [json.loads((out / f"failures{r}.json").read_text()) for r in range(2)]


def in_gloo_group(out_dir, runs):
    """A launched process's side (see :func:`two_processes_raised`): ``runs(out_dir, rank)`` in a
    gloo group whose collectives time out after 60 s (a hang becomes an error on the process left
    waiting), its store a file in ``out_dir``."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    runs(out_dir, rank)
    dist.destroy_process_group()
