"""Shared test fixtures. Tests run offline: no Hugging Face hub access, ever."""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Ray reads these when it is first imported, and test modules import it at collection (verl's
# adapter does): set here, before any of them, every Ray cluster a test starts stays on 127.0.0.1
# and needs no token (a machine-wide ~/.ray/auth_token would otherwise switch auth on).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_AUTH_MODE"] = "disabled"

import gc  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Before any xdist worker starts: compile the package and the tests' helper modules once.
    Where PYTHONDONTWRITEBYTECODE is set (as on some CI machines), no interpreter writes its
    bytecode, so each of the ~1,000 the suite starts (CLI runs, servers, workers) compiled
    benchmax_gym again: ~0.2-0.3 CPU-s apiece. Up-to-date files are skipped (a stat each)."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    for folder in ("benchmax_gym", "wrappers", "registry", "tests"):
        compileall.compile_dir(ROOT / folder, quiet=2)


RAY_CLUSTER_TESTS = "tests/wrappers/on_ray/"  # one Ray cluster for them all (its conftest.py)


def pytest_collection_modifyitems(items):
    """The tests on the shared Ray cluster run first. xdist's worksteal deals the collection to
    the workers in contiguous chunks and steals from a chunk's end, so they all stay with the first
    worker and the cluster (a head and two nodes: ~7 CPU-s to start, and worker processes of its
    own) starts once, not on each worker that ends up with some of them (all four, in a full run)."""
    items.sort(key=lambda item: not item.nodeid.startswith(RAY_CLUSTER_TESTS))


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, Ray...: ~800k objects) lives for the whole
    run: frozen, the collector never walks it again, so a test's gc.collect() (the leftover checks
    make hundreds) costs milliseconds instead of ~0.5 s of CPU, and so do automatic full passes."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real benchmark samples in ../shared/data (never copied into the project)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"benchmark samples not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def refused_port() -> int:
    """A loopback port that refuses connections for the whole test: bound here and never listened
    on (a port found free and let go could be taken by another test's server meanwhile)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def _listens_on(proc: subprocess.Popen, port: int) -> bool:
    """Whether ``proc`` (or a process it started) is what listens on loopback ``port``: a port
    found free and let go may be taken by another test's server before ``proc`` binds it."""
    import psutil

    try:
        ours = psutil.Process(proc.pid)
        for process in (ours, *ours.children(recursive=True)):
            for conn in (getattr(process, "net_connections", None) or process.connections)(kind="tcp"):  # (psutil < 6)
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                    return True
    except psutil.Error:
        pass
    return False


@pytest.fixture
def http_server():
    """Start ``command(port)`` on a free loopback port; returns its MCP URL once it listens there
    (another port, if another process took that one first). The process is killed at the end of
    the test; one that ends before it listens fails the test with what it said."""
    import tempfile

    started = []

    def start(command, timeout=60):
        for _ in range(3):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            said = tempfile.TemporaryFile()
            proc = subprocess.Popen(command(port), stdout=subprocess.DEVNULL, stderr=said)
            started.append((proc, said))
            deadline = time.monotonic() + timeout
            while not _listens_on(proc, port):
                if proc.poll() is not None:
                    said.seek(0)
                    error = said.read().decode(errors="replace")[-3000:]
                    if "in use" in error:
                        break  # (the port was taken meanwhile: another one)
                    raise AssertionError(f"the server ended ({proc.returncode}) before it listened: {error}")
                assert time.monotonic() < deadline, f"the server did not listen on {port} within {timeout} s"
                time.sleep(0.1)
            else:
                return f"http://127.0.0.1:{port}/mcp"
        raise AssertionError("three ports were taken before the server could listen on them")

    yield start
    for proc, said in started:
        proc.kill()
        proc.wait()
        said.close()


def _install(uv_args: list[str], pip_command: list[str]) -> None:
    """Run ``uv <uv_args>`` (the test extra's uv: SkyPilot's venv in ~10 s and 3 CPU-s where pip
    took ~200 s and 70 CPU-s on 2 cores), or ``pip_command`` where uv fails (it reads none of pip's
    configuration: indexes, certificates). Installs compile their bytecode, as pip's do: a Ray head
    started from a venv without it, its processes each compiling Ray's modules, once missed Ray's
    own 30 s limit for its node to register in a CI run (the likely cause; not shown)."""
    import sys

    from uv import find_uv_bin

    uv = subprocess.run([find_uv_bin(), *uv_args], capture_output=True, text=True, timeout=900)
    if uv.returncode != 0:
        print(f"uv {' '.join(uv_args)} failed, so pip does it: {uv.stderr[-2000:]}", file=sys.stderr)
        subprocess.run(pip_command, check=True, timeout=900)


@pytest.fixture(scope="session")
def cached_venv():
    """``cached_venv(name, requirement)``: the python of a venv under the repository with
    ``requirement`` installed, built once and reused while the requirement is the same (for
    packages that cannot share the test venv: SkyPilot, another Ray version)."""
    import shutil
    import sys

    from filelock import FileLock

    def build(name: str, requirement: str) -> str:
        venv = Path(__file__).resolve().parent.parent / name
        marker = venv / "benchmax-built-for"
        # parallel test workers each have their own session: one builds, the others wait for it
        with FileLock(str(venv) + ".lock"):
            if not (marker.is_file() and marker.read_text() == requirement):
                shutil.rmtree(venv, ignore_errors=True)
                _install(["venv", "-q", "--python", sys.executable, str(venv)], [sys.executable, "-m", "venv", str(venv)])
                python = str(venv / "bin" / "python")
                _install(["pip", "install", "-q", "--compile-bytecode", "--python", python, requirement],
                         [sys.executable, "-m", "pip", "--python", python, "install", "-q", requirement])
                marker.write_text(requirement)
        return str(venv / "bin" / "python")

    return build


@pytest.fixture(scope="session")
def cached_target():
    """``cached_target(name, *pip_args)``: a folder under the repository that ``pip install
    --target`` filled with ``pip_args`` (this venv's pip), built once and reused while they are
    the same; for code to put on a child process's PYTHONPATH beside this venv's packages
    (SkyRL's trainer, whose wheel says Python >= 3.12: see tests/adapters/test_skyrl.py)."""
    import shutil
    import sys

    from filelock import FileLock

    def build(name: str, *pip_args: str) -> str:
        target = Path(__file__).resolve().parent.parent / name
        marker = target / "benchmax-built-for"
        wanted = " ".join(pip_args)
        with FileLock(str(target) + ".lock"):
            if not (marker.is_file() and marker.read_text() == wanted):
                shutil.rmtree(target, ignore_errors=True)
                _install(["pip", "install", "-q", "--compile-bytecode", "--python", sys.executable, "--target",
                          str(target), *pip_args],
                         [sys.executable, "-m", "pip", "install", "-q", "--target", str(target), *pip_args])
                marker.write_text(wanted)
        return str(target)

    return build
