"""Excel-v0's host side against files the model plants with run_python: symlinks, hard links,
FIFOs, devices, zip bombs and workbooks that expand to millions of cells. The host tools and the
grader open only regular files inside the workspace, within size bounds, and say so clearly."""

import errno
import json
import os
import shutil
import threading
import time

import gymnasium as gym
import openpyxl
import pytest

import benchmax_gym  # noqa: F401


def call(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def make(**kwargs):
    env = gym.make("benchmax/Excel-v0", task_args={"difficulty": {"rows": 10}}, **kwargs)
    env.reset(seed=0)
    if env.unwrapped.sandbox_level != "bubblewrap":
        pytest.skip("bubblewrap unavailable: run_python is left out")
    return env


def plant(env, code):
    obs, _, _, _, info = env.step(call("run_python", code=code))
    assert info["error"] is None, obs


def workspace(env):
    return env.unwrapped.episode.state["workbook"].path.parent


@pytest.fixture
def host_book(tmp_path):
    """A workbook on the host that the model must never read or change (root-only, read-only)."""
    wb = openpyxl.Workbook()
    wb.active.title = "HostSecret"
    wb.active["A1"] = "host-secret-value"
    path = tmp_path / "host.xlsx"
    wb.save(path)
    os.chmod(path, 0o400)
    return path


def step_bounded(env, action, limit=60.0):
    """env.step in a thread: a step that blocks (a FIFO) fails the test instead of hanging it."""
    out = []
    thread = threading.Thread(target=lambda: out.append(env.step(action)), daemon=True)
    thread.start()
    thread.join(limit)
    assert out, f"step() did not return within {limit} s"
    return out[0]


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_symlinked_workbook_is_refused_by_every_tool(host_book, relative):
    env = make()
    target = os.path.relpath(host_book, workspace(env)) if relative else str(host_book)
    before = host_book.read_bytes()
    plant(env, f"import os\nos.remove('workbook.xlsx')\nos.symlink({target!r}, 'workbook.xlsx')")
    for action in (call("list_sheets"), call("read_range", sheet="HostSecret", range="A1"),
                   call("write_cells", sheet="HostSecret", cells={"A1": "pwned"})):
        obs, _, _, _, info = env.step(action)
        assert info["error"] == "unsafe_file", obs
        assert "HostSecret" not in obs and "host-secret-value" not in obs
    assert host_book.read_bytes() == before  # the read-only host file was not overwritten
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 0.0


def test_symlinks_do_not_reveal_whether_host_paths_exist(host_book):
    env = make()
    answers = []
    for target in (str(host_book), str(host_book) + ".missing", "/etc/passwd", "/nonexistent/x.xlsx"):
        plant(env, f"import os\nif os.path.lexists('workbook.xlsx'): os.remove('workbook.xlsx')\nos.symlink({target!r}, 'workbook.xlsx')")
        obs, _, _, _, info = env.step(call("list_sheets"))
        answers.append((info["error"], obs.replace(target, "")))
    assert len(set(answers)) == 1 and answers[0][0] == "unsafe_file", answers


def test_symlink_in_a_directory_component_is_refused(host_book):
    env = make()
    ws = workspace(env)
    plant(env, f"import os\nos.remove('workbook.xlsx')\nos.symlink({str(host_book.parent)!r}, 'd')")
    # the family only ever opens workbook.xlsx; the core helper refuses links in any component
    from benchmax_gym.core.files import WorkspaceFileError, read_workspace_file

    with pytest.raises(WorkspaceFileError) as caught:
        read_workspace_file(ws, "d/host.xlsx", 10**6)
    assert caught.value.code == "unsafe_file"


def test_symlink_to_the_tasks_answer_file_scores_zero(shared_data):
    env = gym.make("benchmax/Excel-v0", tasks="spreadsheetbench", task_args={"dataset": str(shared_data / "spreadsheetbench")})
    env.reset(options={"task_index": 0})
    if env.unwrapped.sandbox_level != "bubblewrap":
        pytest.skip("bubblewrap unavailable: run_python is left out")
    answer = env.unwrapped.episode.task.answer["workbook"]
    assert isinstance(answer, str) and os.path.isfile(answer)
    plant(env, f"import os\nos.remove('workbook.xlsx')\nos.symlink({answer!r}, 'workbook.xlsx')")
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 0.0
    assert any("symbolic link" in note or "regular file" in note for note in env.unwrapped.episode.state["grade"].notes)


def test_hard_link_to_an_outside_file_is_refused(host_book):
    env = make()
    ws = workspace(env)
    before = host_book.read_bytes()
    plant(env, "import os\nos.remove('workbook.xlsx')")
    try:
        os.link(host_book, ws / "workbook.xlsx")  # what code that can see a host file would plant
    except OSError as exc:  # root hosts: the workspace is a tmpfs of its own, no host file links in;
        assert exc.errno == errno.EXDEV  # a file elsewhere on it (the episode's /tmp) still can
        shutil.copyfile(host_book, ws.parent / "tmp" / "outside.xlsx")
        os.link(ws.parent / "tmp" / "outside.xlsx", ws / "workbook.xlsx")
    for action in (call("list_sheets"), call("write_cells", sheet="HostSecret", cells={"A1": "pwned"})):
        obs, _, _, _, info = env.step(action)
        assert info["error"] == "unsafe_file" and "host-secret-value" not in obs, obs
    assert host_book.read_bytes() == before
    _, reward, _, _, _ = env.step("done")
    assert reward == 0.0


def test_a_hard_linked_copy_made_by_the_model_is_refused_with_a_hint():
    env = make()
    plant(env, "import os\nos.link('workbook.xlsx', 'copy.xlsx')")
    obs, _, _, _, info = env.step(call("list_sheets"))
    assert info["error"] == "unsafe_file" and "hard links" in obs


def test_fifo_workbook_does_not_block_the_step():
    env = make()
    plant(env, "import os\nos.remove('workbook.xlsx')\nos.mkfifo('workbook.xlsx')")
    try:
        for action in (call("list_sheets"), call("read_range", sheet="Sheet1", range="A1"),
                       call("write_cells", sheet="Sheet1", cells={"A1": 1})):
            obs, _, _, _, info = step_bounded(env, action)
            assert info["error"] == "unsafe_file", obs
        _, reward, terminated, _, _ = step_bounded(env, "done")
        assert terminated and reward == 0.0
    finally:  # a reader left blocked by a failing run gets end-of-file
        try:
            os.close(os.open(workspace(env) / "workbook.xlsx", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader: nothing blocked


def test_symlink_to_dev_zero_is_refused_without_reading_it():
    env = make()
    plant(env, "import os\nos.remove('workbook.xlsx')\nos.symlink('/dev/zero', 'workbook.xlsx')")
    obs, _, _, _, info = step_bounded(env, call("list_sheets"))
    assert info["error"] == "unsafe_file", obs
    _, reward, terminated, _, _ = step_bounded(env, "done")
    assert terminated and reward == 0.0


# --------------------------------------------------------------------------- parsing bounds

MERGE_BOMB = """
import zipfile, openpyxl
wb = openpyxl.load_workbook('workbook.xlsx')
wb.save('plain.xlsx')
with zipfile.ZipFile('plain.xlsx') as src, zipfile.ZipFile('workbook.xlsx', 'w', zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        data = src.read(item)
        if item.filename == 'xl/worksheets/sheet1.xml':
            data = data.replace(b'</sheetData>', b'</sheetData><mergeCells count="1"><mergeCell ref="A1:J40000"/></mergeCells>', 1)
        dst.writestr(item, data)
"""

ZIP_BOMB = """
import zipfile, shutil
shutil.copy('workbook.xlsx', 'bomb.xlsx')
with zipfile.ZipFile('bomb.xlsx', 'a', zipfile.ZIP_DEFLATED) as z:
    z.writestr('xl/padding.xml', b' ' * (80 * 2**20))
shutil.move('bomb.xlsx', 'workbook.xlsx')
"""

BIG_FILE = """
import os
with open('workbook.xlsx', 'wb') as f:
    f.write(os.urandom(17 * 2**20))
"""


@pytest.mark.parametrize("code, error", [(MERGE_BOMB, "workbook_too_large"), (ZIP_BOMB, "workbook_too_large"),
                                         (BIG_FILE, "file_too_large")], ids=["merged-cells", "zip-bomb", "file-size"])
def test_over_limit_workbooks_are_a_clear_error_and_grade_zero(code, error):
    env = make()
    plant(env, code)
    started = time.monotonic()
    obs, _, _, _, info = step_bounded(env, call("list_sheets"))
    assert info["error"] == error, obs
    assert "limit" in obs
    _, reward, terminated, _, _ = step_bounded(env, "done")
    assert terminated and reward == 0.0
    assert any("limit" in note for note in env.unwrapped.episode.state["grade"].notes)
    assert time.monotonic() - started < 60  # refused before parsing, not after minutes of it


def test_tool_timeout_bounds_opening_a_slow_workbook():
    # within every size limit, but far slower to parse (~1 s) than this tool_timeout
    env = make(tool_timeout=0.2, sandbox_limits={"timeout": 60, "cpu_seconds": 60})
    plant(env, "import openpyxl\nwb = openpyxl.Workbook(write_only=True)\nws = wb.create_sheet('Big')\n"
               "for r in range(15000):\n    ws.append(list(range(10)))\nwb.save('workbook.xlsx')")
    started = time.monotonic()
    obs, _, _, _, info = step_bounded(env, call("list_sheets"))
    assert info["error"] == "tool_timeout" and "took over 0.2 s" in obs, obs
    assert time.monotonic() - started < 0.2 * 10  # the step returned at the deadline, not after the parse
    plant(env, "import openpyxl\nwb = openpyxl.Workbook()\nwb.active.title = 'Small'\nwb.save('workbook.xlsx')")
    obs, _, _, _, info = env.step(call("list_sheets"))
    assert info["error"] is None and "Small" in obs  # a workbook that fits opens again
