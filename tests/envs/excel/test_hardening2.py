"""Excel-v0: ``read_range`` shows formula values as the env's ``recalc`` grades them; a workbook with
far-apart cells costs what it holds, never its used area; LibreOffice is killed whole at its
timeout and bounded in memory."""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import sys
import time

import gymnasium as gym
import openpyxl
import psutil
import pytest

import benchmax_gym
from benchmax_gym.envs.excel import recalc
from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.recalc import recalculate
from tests.envs.excel.test_host_bounds import call, small_env, to_bytes
from tests.envs.excel.test_host_parse_bounds import _fake_soffice
from tests.envs.excel.test_pictures_and_saves import saved_with_parts, with_cached_formula

needs_posix = pytest.mark.skipif(sys.platform == "win32", reason="the stand-in soffice is a shell script")


# --------------------------------------------------------------------------- read_range follows recalc


def _read_after_writing(env, formula: str = "=SUM(A1:A3)") -> tuple[str, dict]:
    env.step(call("write_cells", sheet="Sheet", cells={"E1": formula}))
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="E1"))
    return obs, info


def test_read_range_shows_formulas_as_recalc_none_grades_them(tmp_path):
    """HEAD computed the formula (6) whatever ``recalc`` was: under ``"none"`` the grader reads the
    value saved in the file, and a formula written in the episode has none, so the model saw a
    right answer that graded 0."""
    (tmp_path / "none").mkdir()
    env = small_env(tmp_path / "none", recalc="none")
    obs, info = _read_after_writing(env)
    assert info["error"] is None and "E1: =SUM(A1:A3) -> ''" in obs, obs
    _, reward, terminated, *_ = env.step("done")
    assert terminated and reward == 0.0

    (tmp_path / "auto").mkdir()
    env = small_env(tmp_path / "auto", recalc="auto")
    obs, _ = _read_after_writing(env)
    assert "E1: =SUM(A1:A3) -> 6" in obs, obs
    _, reward, *_ = env.step("done")
    assert reward == 1.0


@needs_posix
def test_read_range_shows_formulas_as_recalc_libreoffice_grades_them(tmp_path, monkeypatch):
    """A stand-in ``soffice`` whose 'recalculated' workbook says E1 is 99: read_range shows what
    LibreOffice computed, as the grader will read it (HEAD showed 6 from ``formulas``)."""
    converted = openpyxl.Workbook()
    converted.active.title = "Sheet"
    converted.active["E1"] = 99
    converted.save(tmp_path / "converted.xlsx")
    mark = _fake_soffice(tmp_path, monkeypatch, tmp_path / "converted.xlsx")
    env = small_env(tmp_path, recalc="libreoffice")
    obs, info = _read_after_writing(env)
    assert info["error"] is None and "E1: =SUM(A1:A3) -> 99" in obs, obs
    assert mark.exists()


@needs_posix
def test_recalc_libreoffice_without_libreoffice_fails_at_make(monkeypatch, tmp_path):
    """``recalc="libreoffice"`` where LibreOffice is not installed fails at ``gym.make``, naming the
    argument (it made an env whose every grade failed); installed, the same env is made."""
    monkeypatch.setenv("PATH", str(tmp_path))  # (no soffice there)
    with pytest.raises(ValueError, match=r"recalc='libreoffice' needs LibreOffice.*soffice"):
        gym.make("benchmax/Excel-v0", recalc="libreoffice", python_tool=False)
    _fake_soffice(tmp_path, monkeypatch, tmp_path / "converted.xlsx")
    gym.make("benchmax/Excel-v0", recalc="libreoffice", python_tool=False).close()


def test_under_recalc_none_the_prompt_asks_for_values(tmp_path):
    """``recalc="none"`` grades the values saved in the file (a formula written in the episode has
    none): the prompt says so, where the other modes say formulas are recalculated."""
    prompts = {}
    for mode in ("none", "auto"):
        env = gym.make("benchmax/Excel-v0", recalc=mode, python_tool=False)
        obs, _ = env.reset(seed=0)
        prompts[mode] = obs
        env.close()
    assert "formulas are not recalculated before grading" in prompts["none"]
    assert "formulas are recalculated before grading" in prompts["auto"]
    assert "formulas are recalculated before grading" not in prompts["none"]


# --------------------------------------------------------------------------- far-apart cells


def test_reading_empty_cells_leaves_the_used_range_as_it_is(tmp_path):
    """HEAD's read_range made an empty cell at every position it passed: reading XFD1048576 of a
    three-cell sheet made its used range A1:XFD1048576 (a million rows to whatever walks it), in
    list_sheets and in the file the next write saved."""
    env = small_env(tmp_path)
    for rng in ("T90:Z99", "XFD1048576"):
        obs, *_ = env.step(call("read_range", sheet="Sheet", range=rng))
        assert "is empty" in obs, obs
    obs, *_ = env.step(call("list_sheets"))
    assert '"used_range": "A1:A3", "rows": 3, "columns": 1' in obs, obs
    env.step(call("write_cells", sheet="Sheet", cells={"E1": 6}))
    saved = openpyxl.load_workbook(env.unwrapped.episode.state["workbook"].path, read_only=True)
    assert saved["Sheet"].calculate_dimension() == "A1:E3"
    obs, *_ = env.step(call("read_range", sheet="Sheet", range="A1:E3"))
    assert obs.split("\n")[1:4] == ["A1: 1 | E1: 6", "A2: 2", "A3: 3"], obs


def far_apart_book() -> bytes:
    """Sheet!A1 = 2, B1 = =A1*3, XFC1048575 = =A1+1 and XFD1048576 = "far": four cells, a used area
    of 17 billion (``formulas`` cannot compute a cell in Excel's last row or column)."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet"
    ws["A1"], ws["B1"], ws["XFC1048575"], ws["XFD1048576"] = 2, "=A1*3", "=A1+1", "far"
    return to_bytes(wb)


def with_cached_values(data: bytes, cached: dict[str, str]) -> bytes:
    """``data`` with the value ``cached[cell]`` saved for each formula cell named, as Excel saves it."""
    wb = openpyxl.load_workbook(io.BytesIO(data))

    def rewrite(name: str, xml: bytes) -> bytes:
        if name == "xl/worksheets/sheet1.xml":
            for cell, value in cached.items():
                xml, found = re.subn(rb'(<c r="' + cell.encode() + rb'"[^>]*><f>[^<]*</f>)<v\s*/>',
                                     rb"\1<v>" + value.encode() + rb"</v>", xml)
                assert found == 1, xml
        return xml

    return saved_with_parts(wb, rewrite)


@pytest.mark.timeout(120)
def test_far_apart_cells_are_read_in_proportion_to_the_cells_that_exist():
    """HEAD found a workbook's formula cells (``recalculate`` without ``ranges``) and read cached
    values of far-apart cells by walking every position between them: 17 billion here, given up at
    the deadline (TimeLimitExceeded), or never ending without one."""
    data = far_apart_book()
    expected = {("Sheet", "B1"): 6, ("Sheet", "XFC1048575"): 3}
    assert recalculate(data, time_limit=30) == expected
    cached = with_cached_values(data, {"B1": "6", "XFC1048575": "3"})
    assert recalculate(cached, recalc="none", time_limit=30) == expected
    assert recalculate(cached, recalc="none") == expected  # the trusted path, read here


def test_a_workbook_with_far_apart_cells_reads_as_it_holds(tmp_path):
    """Through the env, the tools on such a workbook answer at once, and right."""
    (tmp_path / "workbook.xlsx").write_bytes(far_apart_book())
    spec = {"workbook": str(tmp_path / "workbook.xlsx"), "position": "'Sheet'!A1"}
    task = benchmax_gym.Task("far", "Leave it.", answer=spec, solution=spec, files={"workbook.xlsx": spec["workbook"]})
    env = gym.make("benchmax/Excel-v0", tasks=[task], python_tool=False)
    obs, _ = env.reset(seed=0)
    assert "used range A1:XFD1048576" in obs and "A1=2 | B1==A1*3" in obs
    obs, *_ = env.step(call("read_range", sheet="Sheet", range="A1:C2"))
    assert obs.split("\n")[1] == "A1: 2 | B1: =A1*3 -> 6.0", obs
    env.step(call("write_cells", sheet="Sheet", cells={"XFC1048574": "=XFC1048575*2"}))
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="XFC1048574:XFD1048576"))
    assert info["error"] is None and obs.split("\n")[1:4] == [
        "XFC1048574: =XFC1048575*2 -> 6.0", "XFC1048575: =A1+1 -> 3.0", "XFD1048576: far"], obs


# --------------------------------------------------------------------------- LibreOffice's processes


def _stand_in_soffice(tmp_path, monkeypatch, body: str) -> None:
    fake = tmp_path / "bin" / "soffice"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # killed; its parent reaps it
    except psutil.NoSuchProcess:
        return True


@needs_posix
def test_libreoffice_is_killed_with_its_children_at_its_timeout(tmp_path, monkeypatch):
    """A stand-in ``soffice`` that starts a long-lived child (as ``soffice`` starts ``soffice.bin``)
    and never finishes: after the timeout both are gone, and the model's workbook grades 0 with
    the reason, not by the value cached in it (a model can write that value itself, then make
    LibreOffice slow). HEAD killed the launcher only; its child lived on."""
    _stand_in_soffice(tmp_path, monkeypatch,
                      f'echo $$ > "{tmp_path}/launcher"\nsleep 300 &\necho $! > "{tmp_path}/child"\nexec sleep 300\n')
    monkeypatch.setattr(recalc, "LIBREOFFICE_TIMEOUT_S", 5)  # (room for the stand-in to write both pids, loaded)
    answer = openpyxl.Workbook()
    answer.active.title = "Sheet"
    answer.active["A1"] = 42
    pids: list[int] = []
    try:
        result = grade(with_cached_formula("=6*7", "42"), to_bytes(answer), "A1", recalc="libreoffice")
        pids = [int((tmp_path / name).read_text()) for name in ("launcher", "child")]
        assert not result.solved and any("LibreOffice's recalculation took over 5 s" in note
                                         for note in result.notes), result.notes
        deadline = time.monotonic() + 30
        while not all(map(_ended, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(map(_ended, pids)), [(pid, _ended(pid)) for pid in pids]
    finally:
        for pid in pids:  # (HEAD left them running)
            if not _ended(pid):
                os.kill(pid, signal.SIGKILL)


@needs_posix
def test_libreoffice_cannot_take_more_memory_than_its_limit(tmp_path, monkeypatch):
    """A stand-in ``soffice`` that asks for 1 GiB, under a limit of 256 MiB: refused (HEAD set no
    limit: LibreOffice on a hostile workbook could take the host's memory)."""
    allocate = f'"{sys.executable}" -I -S -c "bytearray(2**30)" 2>/dev/null'
    _stand_in_soffice(tmp_path, monkeypatch,
                      f'if {allocate}; then echo allocated; else echo refused; fi > "{tmp_path}/mark"\n')
    monkeypatch.setattr(recalc, "LIBREOFFICE_MEMORY_BYTES", 256 * 2**20, raising=False)  # (HEAD had none)
    assert recalculate(with_cached_formula("=6*7", "42"), recalc="libreoffice") == {("Sheet", "A1"): 42}
    assert (tmp_path / "mark").read_text().strip() == "refused"


@needs_posix
def test_a_read_under_libreoffice_keeps_to_the_tool_time_limit(tmp_path, monkeypatch):
    """``read_range`` of a formula under ``recalc="libreoffice"`` gives LibreOffice the tool's time
    limit, not LibreOffice's own 120 s: a LibreOffice that never finishes makes the read a
    tool_timeout after about a second (it held the step for 120 s)."""
    _stand_in_soffice(tmp_path, monkeypatch, f'echo $$ > "{tmp_path}/launcher"\nexec sleep 300\n')
    env = small_env(tmp_path, recalc="libreoffice", tool_timeout=1.0)
    start = time.monotonic()
    obs, info = _read_after_writing(env)
    assert time.monotonic() - start < 60  # (a hang guard: HEAD took LibreOffice's 120 s)
    assert info["error"] == "tool_timeout" and "took over 1 s" in obs, obs
    env.close()


@needs_posix
def test_a_libreoffice_process_out_of_reach_stops_at_its_cpu_time(tmp_path, monkeypatch):
    """Each LibreOffice process gets the timeout's seconds of CPU (inherited by every process it
    starts): one that left its session (where a killed caller's cleanup never runs, nothing else
    reaches it) and spins stops by itself."""
    spin = f'setsid sh -c \'echo $$ > "{tmp_path}/spinner"; while :; do :; done\' &\nsleep 0.5\n'
    _stand_in_soffice(tmp_path, monkeypatch, spin + "exit 1\n")
    monkeypatch.setattr(recalc, "LIBREOFFICE_TIMEOUT_S", 3)  # (room to reach setsid, loaded; the spinner's CPU)
    recalculate(with_cached_formula("=6*7", "42"), recalc="libreoffice")  # (it failed: the cached 42)
    pid = int((tmp_path / "spinner").read_text())
    try:
        deadline = time.monotonic() + 60
        while not _ended(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ended(pid), psutil.Process(pid).cpu_times()
    finally:
        if not _ended(pid):
            os.kill(pid, signal.SIGKILL)
