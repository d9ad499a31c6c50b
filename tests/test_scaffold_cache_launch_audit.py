"""Audit of `benchmax-gym new`, the on-disk caches and `benchmax-gym launch` (helper 112): names that
would not install or would replace what is installed, cache entries a crash cut short, links
planted in the cache, a cache folder that cannot be written, downloads that are no archive, and
SkyPilot's own reason when it refuses a task."""

import http.server
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from benchmax_gym import launch
from benchmax_gym.core import cache
from benchmax_gym.envs.crm.org import MIN_SIZE, Org, cached_org
from benchmax_gym.envs.excel.spreadsheetbench import spreadsheetbench_dir
from benchmax_gym.envs.wikipedia.backends import INDEX_VERSION, CorpusIndex
from benchmax_gym.scaffold import scaffold

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # (subprocesses import this checkout's code, wherever they run)
RECORDS = [{"title": "Alpha", "text": "alpha beta"}, {"title": "Gamma", "text": "gamma delta"}]


# -- benchmax-gym new ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, says", [
    ("acme-", "end with a letter or digit"),  # not a PEP 508 project name: pip could not install it
    ("acme_", "end with a letter or digit"),
    ("benchmax__gym", "by the installed benchmax-gym"),  # pip reads it as benchmax-gym and would replace it
    ("typing_extensions", "by the installed typing_extensions"),  # would shadow what gymnasium imports
    ("yaml", "by the installed PyYAML"),
])
def test_names_that_would_not_install_or_would_replace_an_installed_package_are_refused(tmp_path, name, says):
    with pytest.raises(ValueError, match=says):
        scaffold(name, tmp_path)
    assert not any(tmp_path.iterdir())


def test_an_id_that_is_registered_already_is_refused(tmp_path):
    """Its contract test would have checked the builtin env (and passed), its entry point refused."""
    with pytest.raises(ValueError, match="--id 'benchmax/Math-v0' is registered already"):
        scaffold("acme-math", tmp_path, "benchmax/Math-v0")
    assert not any(tmp_path.iterdir())


# -- caches -------------------------------------------------------------------------------------------


def test_two_processes_building_one_org_both_end_with_a_whole_one(tmp_path):
    code = ("import sys; from benchmax_gym.envs.crm.org import cached_org, Org;"
            f"print(len(Org(cached_org(3, {MIN_SIZE}, sys.argv[1])).tables))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=ENV) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and len({*outs}) == 1 and int(outs[0]) > 5
    entry = tmp_path / "crm" / f"org-v2-seed3-size{MIN_SIZE}.sqlite"
    assert [p.name for p in (tmp_path / "crm").iterdir()] == [entry.name]  # (no temp file left)


@pytest.mark.parametrize("cut", [0, 100, 0.5])
def test_an_org_cut_short_is_rebuilt_not_loaded(tmp_path, cut):
    """A crash can leave the renamed file empty or short (the data never reached the disk)."""
    entry = cached_org(0, MIN_SIZE, tmp_path)
    whole = entry.read_bytes()
    entry.write_bytes(whole[:int(len(whole) * cut) if isinstance(cut, float) else cut])
    org = Org(cached_org(0, MIN_SIZE, tmp_path))
    assert entry.read_bytes() == whole and "Case" in org.tables


def test_a_corpus_index_cut_short_is_rebuilt(tmp_path):
    first = CorpusIndex.on_disk(RECORDS, "k", tmp_path)
    entry = tmp_path / f"corpus-v{INDEX_VERSION}-k.sqlite"
    entry.write_bytes(b"")  # (loaded as it was, every search failed with "no such table")
    again = CorpusIndex.on_disk(RECORDS, "k", tmp_path)
    assert again.uri == first.uri and again.connect().execute("SELECT count(*) FROM pages").fetchone() == (2,)


def test_a_link_planted_in_the_cache_is_never_written_through(tmp_path):
    """Builds used a temp name known in advance (pid, thread): a link there wrote the index elsewhere."""
    folder, victim = tmp_path / "cache", tmp_path / "victim"
    folder.mkdir()
    entry = folder / f"corpus-v{INDEX_VERSION}-k.sqlite"

    def build():
        partial = entry.with_suffix(f".{os.getpid()}.{threading.get_ident()}.partial")
        partial.symlink_to(victim)
        CorpusIndex.on_disk(RECORDS, "k", folder)

    thread = threading.Thread(target=build)  # (its own thread id, known before it builds)
    thread.start()
    thread.join(60)
    assert not victim.exists() and cache.whole_sqlite(entry) and not entry.is_symlink()


def test_a_task_set_hash_is_not_written_through_a_planted_link(tmp_path, monkeypatch):
    """Its temp file was named by the pid alone: a link there had the hash written over its target."""
    from benchmax_gym.core.tasks import DatasetTasks, Task

    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "rows.jsonl"
    data.write_text('{"q": "1+1", "a": "2"}\n')
    source = DatasetTasks(str(data), lambda record, i: Task(id=str(i), prompt=record["q"], answer=record["a"]))
    folder = tmp_path / "cache" / "task-sets"
    folder.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (folder / f"{source._hash_key}.{os.getpid()}.tmp").symlink_to(victim)
    value = source.content_hash()
    assert victim.read_text() == "keep me" and (folder / source._hash_key).read_text() == value


def _without_write_override(*args):
    """Run as root, file permissions bind only without CAP_DAC_OVERRIDE: drop it (setpriv)."""
    if os.geteuid() != 0:
        return list(args)
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if not shutil.which("setpriv") or subprocess.run([*prefix, "true"]).returncode:
        pytest.skip("cannot drop root's permission override here")
    return [*prefix, *args]


def test_a_read_only_cache_folder_is_one_clear_error(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    code = ("import sys\nfrom benchmax_gym.envs.crm.org import cached_org\n"
            "from benchmax_gym.envs.wikipedia.backends import CorpusIndex\n"
            f"for build in (lambda: cached_org(0, {MIN_SIZE}, sys.argv[1]), "
            "lambda: CorpusIndex.on_disk([{'title': 'A', 'text': 'a'}], 'k', sys.argv[1])):\n"
            "    try:\n        build()\n    except OSError as exc:\n        print(type(exc).__name__, exc)\n")
    out = subprocess.run(_without_write_override(sys.executable, "-c", code, str(read_only)), capture_output=True,
                         text=True, timeout=120, env=ENV)
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout + out.stderr  # (the index was a bare "unable to open database file")
    for line, folder in zip(lines, (read_only / "crm", read_only)):
        assert line.startswith("PermissionError") and f"cache folder '{folder}'" in line
        assert "cache_dir=" in line and "BENCHMAX_GYM_CACHE" in line


def test_a_file_where_the_cache_folder_should_be_names_it(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="cannot write the cache folder .*file/crm"):
        cache.cache_folder(tmp_path / "file" / "crm")


@pytest.fixture
def archive_server():
    """A loopback server of one archive, ``served["body"]``, sent without a length (a body cut
    short cannot be told from a whole one)."""
    served = {"body": b""}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self):  # noqa: N802 - the http.server API
            self.send_response(200)
            self.end_headers()
            self.wfile.write(served["body"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/bench.tar.gz", served
    server.shutdown()
    server.server_close()


def _tar_gz() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in (("bench/dataset.json", b"[]"), ("bench/blob", os.urandom(100_000))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_download_cut_short_is_named_and_fetched_again(tmp_path, archive_server):
    url, served = archive_server
    whole = _tar_gz()
    served["body"] = whole[: len(whole) // 2]
    with pytest.raises(ValueError, match="cut short or corrupt.*the next try fetches it again"):
        spreadsheetbench_dir(url, cache_dir=tmp_path)  # (a bare EOFError, and the bad copy kept for ever)
    served["body"] = whole
    assert (spreadsheetbench_dir(url, cache_dir=tmp_path) / "dataset.json").read_text() == "[]"


def test_a_local_archive_cut_short_is_a_value_error_naming_it(tmp_path):
    archive = tmp_path / "bench.tar.gz"
    archive.write_bytes(_tar_gz()[:3000])
    with pytest.raises(ValueError, match=r"bench\.tar\.gz: the archive is cut short or corrupt"):
        cache.extract_cached(archive, tmp_path / "cache")


# -- launch -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, says", [
    ("cpus", "abc", "cpus must be a positive number"), ("cpus", "0", "cpus must be a positive number"),
    ("cpus", "-2+", "cpus must be a positive number"), ("name", "bad name!", "name must be a SkyPilot cluster name"),
])
def test_the_task_refuses_what_skypilot_would(field, value, says):
    """--print-yaml runs without SkyPilot: it printed these as if they were a task."""
    with pytest.raises(ValueError, match=says):
        launch.task_config(2, **{field: value})
    assert launch.task_config(2, cpus="0.5")["resources"]["cpus"] == "0.5"


@pytest.mark.parametrize("flag, value", [("--cpus", "abc"), ("--name", "9 lives")])
def test_a_flag_skypilot_would_refuse_is_one_line_naming_it(tmp_path, flag, value):
    """(task_config's ValueError ended the command in a traceback.)"""
    out = subprocess.run([sys.executable, "-m", "benchmax_gym.cli", "launch", flag, value, "--print-yaml"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=ENV)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"benchmax-gym: error: launch: {flag} must") and out.stderr.count("\n") == 1


@pytest.fixture(scope="session")
def sky_python(cached_venv):
    """The skypilot extra's venv (.venv-sky), as tests/test_launch.py builds it (built once, shared)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cached_venv(".venv-sky", cfg["options.extras_require"]["skypilot"].strip())


@pytest.mark.slow
def test_skypilot_refusing_the_task_is_one_line_with_its_reason(tmp_path, sky_python):
    out = subprocess.run([sys.executable, "-m", "benchmax_gym.cli", "launch", "--infra", "nosuchcloud", "--print-yaml",
                          "--sky-python", str(sky_python)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=ENV)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith("benchmax-gym: error: SkyPilot")  # (was: "exit code 1")
    assert "InvalidSkyPilotConfigError" in last and "nosuchcloud" in last and "$.infra" in last


def _externally_managed_python():
    import glob

    for marker in glob.glob("/usr/lib/python3*/EXTERNALLY-MANAGED"):
        python = Path("/usr/bin") / Path(marker).parent.name
        if python.is_file() and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return python
    return None


@pytest.mark.slow
def test_the_node_setup_installs_uv_under_a_system_python_that_refuses_pip(tmp_path):
    """A node whose python3 is the system's under PEP 668 (Debian 12, Ubuntu 24.04 images) refused
    the setup's `pip install --user uv`, so the cluster never started."""
    python = _externally_managed_python()
    if python is None:
        pytest.skip("no system Python under PEP 668 with pip on this host (Debian's python3-pip is one)")
    line = launch.task_config(1)["setup"].splitlines()[1]
    assert "pip install" in line and "uv" in line
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONUSERBASE": str(tmp_path / "user")}
    out = subprocess.run(["bash", "-ec", line], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    check = subprocess.run(["python3", "-m", "uv", "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert check.returncode == 0 and check.stdout.startswith("uv "), check.stderr
