"""Excel-v0's host side against files the model plants with run_python: symlinks, hard links,
FIFOs, devices, zip bombs and workbooks that expand to millions of cells. The host tools and the
grader open only regular files inside the workspace, within size bounds, and say so clearly; the
size check itself is linear and runs within the call's deadline, and a workbook that fits its
memory bound closely is computed, not refused."""

import errno
import io
import json
import os
import pickle
import runpy
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import gymnasium as gym
import openpyxl
import pytest

import benchmax_gym
from benchmax_gym.core.tools import ToolError
from benchmax_gym.envs.excel import recalc
from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.tools import WorkbookFile


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
    _, reward, terminated, _, info = env.step("done")
    assert terminated and reward == 0.0
    assert any("symbolic link" in note or "regular file" in note for note in env.unwrapped.episode.state["grade"].notes)
    assert info["grade_notes"] == env.unwrapped.episode.state["grade"].notes  # the why of the 0, for the user


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
    recalc._the_worker()  # started (once per process) outside any deadline: not this step's time
    started = time.monotonic()
    obs, _, _, _, info = step_bounded(env, call("list_sheets"))
    # given up at the deadline: a step that waited for the parse (~1 s) would list the sheet
    assert info["error"] == "tool_timeout" and "took over 0.2 s" in obs, obs
    assert time.monotonic() - started < 60  # a hang guard
    plant(env, "import openpyxl\nwb = openpyxl.Workbook()\nwb.active.title = 'Small'\nwb.save('workbook.xlsx')")
    env.unwrapped.episode.state["workbook"].timeout = 60  # (its parse is not instant on a loaded machine)
    obs, _, _, _, info = env.step(call("list_sheets"))
    assert info["error"] is None and "Small" in obs  # a workbook that fits opens again


# --------------------------------------------------------------------------- the size check


def one_cell() -> bytes:
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet"
    wb.active["A1"] = 1
    buffer = io.BytesIO()
    wb.save(buffer)
    return buffer.getvalue()


def with_parts(parts: dict[str, bytes]) -> bytes:
    """:func:`one_cell` with more parts (each at most 1 MiB: no part is refused for its ratio)."""
    source = zipfile.ZipFile(io.BytesIO(one_cell()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for part in source.infolist():
            archive.writestr(part.filename, source.read(part))
        for name, data in parts.items():
            archive.writestr(name, data)
    return out.getvalue()


MiB = 2**20
UNCLOSED = {  # a few KB zipped; the scan of each from every "<" to the end of the part took hours
    "cells": b"sheetData" + b'<c t="s" ' * (MiB // 9 - 1),
    "one-cell-tag": b"sheetData<c" + b' t="s"' * (MiB // 6 - 2),
    "shared-strings": b"sst" + b"<si>" * (MiB // 4 - 1),
    "merged-cells": b"<mergeCell " * (MiB // 11),
}

CHECK_ALL = """
import sys
from pathlib import Path
from benchmax_gym.envs.excel.recalc import WorkbookTooLarge, check_workbook
for path in sorted(Path(sys.argv[1]).iterdir()):
    try:
        check_workbook(path.read_bytes())
    except WorkbookTooLarge:
        pass
    print(path.name, "checked", flush=True)
"""


def test_the_size_check_of_unclosed_tags_is_linear(tmp_path):
    """A file of a few KB whose parts are unclosed tags (``<c <c <c``, ``<si><si>``) is checked in
    one pass: the check ran outside every deadline (the grader's, a tool's) and took hours. Run
    in a process of its own: a regular expression holds the interpreter lock, no thread can time it."""
    for name, part in UNCLOSED.items():
        data = with_parts({"xl/junk.xml": part})
        assert len(data) < 64 * 1024
        (tmp_path / f"{name}.xlsx").write_bytes(data)
    root = Path(benchmax_gym.__file__).parents[1]
    done = subprocess.run([sys.executable, "-c", CHECK_ALL, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [word for name in sorted(UNCLOSED) for word in (f"{name}.xlsx", "checked")]


def too_many_cells(**parts: bytes) -> bytes:
    """A workbook over the cell limit in two parts of its own, after ``parts``."""
    cells = b"<sheetData>" + b"<c/>" * (recalc.MAX_CELLS // 2 + 1)
    return with_parts({**parts, "xl/media/cells1.xml": cells, "xl/media/cells2.xml": cells})


@pytest.fixture(scope="module")
def slow_to_check() -> bytes:
    """Within the file size limits, over the cell limit in its last parts, after 60 MiB of "<" that
    the check scans for seconds (a workbook's parts are found through relationships, under any
    name: every part is scanned)."""
    data = too_many_cells(**{f"xl/media/pad{i}.xml": b"sheetData" + b"<" * (MiB - 9) for i in range(60)})
    assert len(data) < recalc.MAX_WORKBOOK_BYTES and recalc._expanded_size(data) < recalc.MAX_XML_BYTES
    return data


def test_the_size_check_counts_toward_the_tools_deadline(tmp_path, slow_to_check):
    """HEAD: the check ran before the deadline started; the tool call took its whole scan (40 s)."""
    (tmp_path / "workbook.xlsx").write_bytes(one_cell())
    workbook = WorkbookFile(tmp_path / "workbook.xlsx", timeout=0.2)
    workbook.book()  # the task's file; the next is the model's
    (tmp_path / "workbook.xlsx").write_bytes(slow_to_check)
    with pytest.raises(ToolError) as raised:
        workbook.book()
    assert raised.value.code == "tool_timeout", raised.value
    assert "opening workbook.xlsx took over 0.2 s" in str(raised.value)
    workbook.timeout = 60  # (its scan is not instant on a loaded machine)
    (tmp_path / "workbook.xlsx").write_bytes(too_many_cells())
    with pytest.raises(ToolError) as raised:  # the refusals are as they were
        workbook.book()
    assert raised.value.code == "workbook_too_large" and "more cells than the limit of 300000" in str(raised.value)


def test_the_size_check_counts_toward_the_graders_deadline(slow_to_check):
    result = grade(slow_to_check, one_cell(), "A1", time_limit=0.2)
    assert result.cells == 0.0, result
    assert any("reading the workbook took over 0.2 s" in note for note in result.notes), result.notes
    result = grade(too_many_cells(), one_cell(), "A1")
    assert result.cells == 0.0 and any("more cells than the limit" in note for note in result.notes), result.notes


# --------------------------------------------------------------------------- the memory bound

MEASURE = """
import pickle
from benchmax_gym.envs.excel import recalc
fn, args = pickle.loads(request)
start = recalc._memory_size("VmSize")
fn(*args)


def finish(g, added):  # only picklable globals, for run_path to return
    g.clear()
    g["added"] = added


finish(globals(), recalc._memory_size("VmPeak") - start)
"""


def memory_added(tmp_path, fn, *args) -> int:
    """The most memory ``fn(*args)`` adds in a call's process (as :func:`.recalc.run_in_process` runs it)."""
    script = tmp_path / "measure.py"
    script.write_text(MEASURE)
    request = pickle.dumps((fn, args))
    return recalc.run_in_process(runpy.run_path, (str(script), {"request": request}), 120, "measuring")["added"]


def long_texts() -> bytes:
    """50 texts of 10,000 characters, each pair joined: ~50 MB to recalculate."""
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet"
    for row in range(1, 51):
        wb.active[f"A{row}"] = f"=REPT(CHAR({65 + row % 26}),10000)"
    wb.active["B1"] = "=SUMPRODUCT(LEN(A1:A50&TRANSPOSE(A1:A50)))"
    buffer = io.BytesIO()
    wb.save(buffer)
    return buffer.getvalue()


def many_fonts(n: int = 30_000) -> bytes:
    """A workbook of ``n`` fonts (1.3 MB expanded: parsed in a call's process)."""
    from tests.envs.excel.test_parse_deadline import with_fonts

    return with_fonts(n)


def test_formulas_that_fit_their_memory_closely_are_computed(tmp_path, monkeypatch):
    """HEAD: a recalculation whose peak came within 1/16 of the limit was out of memory, even with
    every value computed (a workbook that needs 50.5 MB refused under a 52 MB limit)."""
    data, keys = long_texts(), {("Sheet", "B1")}
    need = memory_added(tmp_path, recalc._formulas_values, data, keys, 120)
    monkeypatch.setattr(recalc, "RECALC_MEMORY_BYTES", need + need // 33)  # ~3% more
    assert recalc.recalculate(data, ranges=[("Sheet", "B1")], time_limit=120) == {("Sheet", "B1"): 50_000_000}
    answer = openpyxl.Workbook()
    answer.active.title = "Sheet"
    answer.active["B1"] = 50_000_000
    buffer = io.BytesIO()
    answer.save(buffer)
    assert grade(data, buffer.getvalue(), "B1", time_limit=120).solved
    # and with less than it needs, formulas' silent #VALUE! is still the memory limit
    monkeypatch.setattr(recalc, "RECALC_MEMORY_BYTES", need * 3 // 5)
    with pytest.raises(recalc.MemoryLimitExceeded, match="formulas need more than"):
        recalc.recalculate(data, ranges=[("Sheet", "B1")], time_limit=120)


def test_a_workbook_that_fits_its_memory_closely_opens(tmp_path, monkeypatch):
    """HEAD: parsing was held to the recalculation's rule (a peak within 1/16 of the limit was out
    of memory), though a parse that runs out raises MemoryError itself."""
    data = many_fonts()
    need = memory_added(tmp_path, recalc._parse_only, data, False)
    monkeypatch.setattr(recalc, "RECALC_MEMORY_BYTES", need + need // 33)
    wb = recalc.open_within(data, 120, "opening workbook.xlsx", data_only=False)
    assert wb.active["A1"].value == 1
    monkeypatch.setattr(recalc, "RECALC_MEMORY_BYTES", need // 2)
    with pytest.raises(recalc.MemoryLimitExceeded, match="opening workbook.xlsx needs more than"):
        recalc.open_within(data, 120, "opening workbook.xlsx", data_only=False)
    assert recalc.RecalcOutOfMemory is recalc.MemoryLimitExceeded  # the former name still imports


# --------------------------------------------------------------------------- XML entities

ENTITIES = (
    '<!DOCTYPE worksheet [<!ENTITY a "<c/><c/><c/><c/><c/><c/><c/><c/><c/><c/>">'
    '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY d "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>'
)


def with_entities(uses: int) -> bytes:
    """:func:`one_cell` whose sheet declares an entity of 1,000 cells and uses it ``uses`` times:
    the size check counts none of them (each 4,900 bytes expanded to 800,000 cells, 40 s and 530 MB
    of a host's parse, past the tools' deadline in a thread no one can stop)."""
    source = zipfile.ZipFile(io.BytesIO(one_cell()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for part in source.infolist():
            data = source.read(part)
            if part.filename == "xl/worksheets/sheet1.xml":
                data = data.replace(b"<worksheet", ENTITIES.encode() + b"<worksheet", 1)
                data = data.replace(b"<sheetData>", b'<sheetData><row r="2">' + b"&d;" * uses + b"</row>", 1)
            archive.writestr(part.filename, data)
    return out.getvalue()


def test_xml_entities_are_refused_before_they_expand(tmp_path):
    data = with_entities(10)
    assert len(openpyxl.load_workbook(io.BytesIO(data)).active._cells) == 10_001  # they do expand
    (tmp_path / "workbook.xlsx").write_bytes(one_cell())
    workbook = WorkbookFile(tmp_path / "workbook.xlsx", timeout=60)
    workbook.book()
    (tmp_path / "workbook.xlsx").write_bytes(data)
    with pytest.raises(ToolError) as raised:
        workbook.book()
    assert raised.value.code == "workbook_too_large" and "declares XML entities" in str(raised.value), raised.value
    result = grade(data, one_cell(), "A1")  # its A1 is right: HEAD graded it solved
    assert not result.solved and any("declares XML entities" in note for note in result.notes), result.notes


def test_a_zip_directory_of_many_entries_is_read_within_the_deadline(tmp_path):
    """HEAD: the zip's directory (150,000 entries, 13 MB) was read on the host to choose where to
    parse, before the deadline started: seconds past it."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for i in range(150_000):
            archive.writestr(str(i), b"")
    (tmp_path / "workbook.xlsx").write_bytes(one_cell())
    workbook = WorkbookFile(tmp_path / "workbook.xlsx", timeout=0.2)
    workbook.book()
    (tmp_path / "workbook.xlsx").write_bytes(out.getvalue())
    with pytest.raises(ToolError) as raised:
        workbook.book()
    assert raised.value.code == "tool_timeout", raised.value
    # a workbook of a few parts is still opened in place, at once
    assert recalc._expanded_size(one_cell()) < recalc.PARSE_IN_PLACE_BYTES
