"""Saving a workbook with pictures, and the grader's second read of the model's file.

openpyxl decodes every picture that is not PNG, JPEG or GIF and writes it again as PNG at each
save (a 114 KB compressed 9000 x 9000 TIFF: ~2 s a copy, after the parse, outside any deadline),
and closes a picture's file as it saves it, so a second ``write_cells`` on a workbook with a
picture failed (SpreadsheetBench 570-43). The grader read the model's file within its deadline,
then parsed it again on the host for the values cached in it where ``formulas`` could not compute.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import openpyxl
import pytest
from openpyxl.drawing.image import Image
from PIL import Image as PILImage

import benchmax_gym
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.excel import recalc
from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.recalc import check_workbook
from benchmax_gym.envs.excel.tools import WorkbookFile, read_range, write_cells


def picture(fmt: str, size: tuple[int, int], **options) -> bytes:
    buffer = io.BytesIO()
    PILImage.new("L", size).save(buffer, fmt, **options)
    return buffer.getvalue()


def saved_with_parts(wb: openpyxl.Workbook, rewrite) -> bytes:
    """``wb`` as xlsx bytes, each part's bytes passed through ``rewrite(name, data)``."""
    buffer = io.BytesIO()
    wb.save(buffer)
    source = zipfile.ZipFile(buffer)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for part in source.infolist():
            archive.writestr(part.filename, rewrite(part.filename, source.read(part)))
    return out.getvalue()


def with_pictures(copies: int, media: bytes) -> bytes:
    """A workbook (Sheet!A1 = 1, A2 = =A1+1) showing one picture ``copies`` times, its file ``media``."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet"
    ws["A1"], ws["A2"] = 1, "=A1+1"
    ws.add_image(Image(io.BytesIO(picture("PNG", (8, 8)))), "C3")

    def rewrite(name: str, data: bytes) -> bytes:
        if name.startswith("xl/media/"):
            return media
        if name == "xl/drawings/drawing1.xml":  # the picture's anchor, ``copies`` times
            text = data.decode()
            anchor = re.search(r"<(xdr:)?oneCellAnchor>.*</(xdr:)?oneCellAnchor>", text, re.S)[0]
            return text.replace(anchor, anchor * copies).encode()
        return data

    return saved_with_parts(wb, rewrite)


def media(data: bytes) -> list[bytes]:
    """The picture files of an xlsx, in order."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return [archive.read(name) for name in sorted(archive.namelist()) if name.startswith("xl/media/")]


def episode_tools(tmp_path: Path, data: bytes, timeout: float):
    (tmp_path / "workbook.xlsx").write_bytes(data)
    workbook = WorkbookFile(tmp_path / "workbook.xlsx", timeout=timeout)
    episode = types.SimpleNamespace(state={"workbook": workbook})
    tools = Toolset([read_range, write_cells])
    return lambda name, **args: tools.run(name, args, episode=episode, timeout=timeout, max_chars=4000)


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "TIFF"])
def test_writing_twice_keeps_the_pictures_as_they_were(tmp_path, fmt):
    """HEAD: the second write failed (ValueError: I/O operation on closed file); a TIFF came back
    as PNG bytes in a file named .tiff."""
    original = picture(fmt, (16, 16))
    call = episode_tools(tmp_path, with_pictures(2, original), timeout=30)
    for value in (5, 7):
        result = call("write_cells", sheet="Sheet", cells={"A1": value})
        assert result.error is None, result.content
    assert call("read_range", sheet="Sheet", range="A1:A2").content == "A1: 7\nA2: =A1+1 -> 8.0"
    saved = (tmp_path / "workbook.xlsx").read_bytes()
    assert media(saved) == [original, original]
    assert len(openpyxl.load_workbook(io.BytesIO(saved))["Sheet"]._images) == 2


def test_a_spreadsheetbench_workbook_with_pictures_takes_many_writes(tmp_path, shared_data):
    """570-43 shows four GIFs on two sheets: each write saves them, unchanged."""
    source = shared_data / "spreadsheetbench" / "spreadsheet" / "570-43" / "1_570-43_input.xlsx"
    data = source.read_bytes()
    call = episode_tools(tmp_path, data, timeout=30)
    for i in range(3):
        result = call("write_cells", sheet="Sheet2", cells={"A3": f"row {i}", "H3": "=LEN(A3)"})
        assert result.error is None, result.content
    assert call("read_range", sheet="Sheet2", range="A3:H3").content == "A3: row 2 | H3: =LEN(A3) -> 5"
    saved = (tmp_path / "workbook.xlsx").read_bytes()
    assert media(saved) == media(data) and len(media(data)) == 4
    book = openpyxl.load_workbook(io.BytesIO(saved))
    assert [len(ws._images) for ws in book.worksheets] == [3, 1]


SCRIPT = """
import sys, types
from pathlib import Path
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.excel.tools import WorkbookFile, read_range, write_cells

tmp = Path(sys.argv[1])
(tmp / "workbook.xlsx").write_bytes((tmp / "task.xlsx").read_bytes())
workbook = WorkbookFile(tmp / "workbook.xlsx", timeout=5.0)
workbook.book()  # the task's file; then the model's, checked and parsed within the deadline
(tmp / "workbook.xlsx").write_bytes((tmp / "model.xlsx").read_bytes())
episode = types.SimpleNamespace(state={"workbook": workbook})
tools = Toolset([write_cells, read_range])
for value in (5, 6):
    result = tools.run("write_cells", {"sheet": "Sheet", "cells": {"A1": value}}, episode=episode, timeout=5.0,
                       max_chars=4000)
    print(result.error, result.content)
result = tools.run("read_range", {"sheet": "Sheet", "range": "A1:A2"}, episode=episode, timeout=5.0, max_chars=4000)
print(result.error, result.content)  # (recalculated: formulas has no saved value to show)
"""


def test_writes_and_a_read_of_a_workbook_with_many_slow_pictures_finish(tmp_path):
    """80 copies of a compressed 9000 x 9000 TIFF (114 KB) pass check_workbook and parse in an
    instant; HEAD decoded each copy at every save (~2 s each, minutes for one write or one read
    that recalculates, with a tool timeout that nothing enforced after the parse). Each call takes
    ~0.3 s here once the recalculation worker is warm; the 5 s limit leaves room for a loaded CI
    machine (1 s did not: a read ran out of time there) and is still far below HEAD's minutes."""
    tiff = picture("TIFF", (9000, 9000), compression="tiff_adobe_deflate")
    data = with_pictures(80, tiff)
    check_workbook(data)  # within the limits
    (tmp_path / "model.xlsx").write_bytes(data)
    (tmp_path / "task.xlsx").write_bytes(with_pictures(1, picture("PNG", (8, 8))))
    root = Path(benchmax_gym.__file__).resolve().parents[1]
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                              text=True, timeout=60, cwd=root)
    except subprocess.TimeoutExpired:
        raise AssertionError("write_cells ran on for a minute on a workbook with a 5 s tool timeout") from None
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "None wrote 1 cell(s) on 'Sheet'\n" * 2 + "None A1: 6\nA2: =A1+1 -> 7.0\n", done.stdout
    assert media((tmp_path / "workbook.xlsx").read_bytes()) == [tiff] * 80


def test_a_workbook_with_many_slow_pictures_is_computed_and_graded(tmp_path):
    """The recalculation saves the workbook for ``formulas`` to read: HEAD decoded the 80 TIFFs
    there too (~160 s), so a read of its formulas, and its grade, ran out of time (0 for a right
    answer)."""
    data = with_pictures(80, picture("TIFF", (9000, 9000), compression="tiff_adobe_deflate"))
    answer = openpyxl.Workbook()
    answer.active.title = "Sheet"
    answer.active["A2"] = 2
    buffer = io.BytesIO()
    answer.save(buffer)
    result = grade(data, buffer.getvalue(), "A2", time_limit=30)
    assert result.solved, result
    call = episode_tools(tmp_path, data, timeout=30)
    assert call("read_range", sheet="Sheet", range="A1:A2").content == "A1: 1\nA2: =A1+1 -> 2.0"


def test_reads_of_a_workbook_with_pictures_compute_every_time(tmp_path):
    """A second read that recalculates saved the loaded workbook again and failed (ValueError:
    I/O operation on closed file), until f11add0 recalculated from the file's bytes."""
    call = episode_tools(tmp_path, with_pictures(1, picture("PNG", (8, 8))), timeout=30)
    assert call("read_range", sheet="Sheet", range="A1:A2").content == "A1: 1\nA2: =A1+1 -> 2.0"
    assert call("read_range", sheet="Sheet", range="A2").content == "A2: =A1+1 -> 2.0"
    assert call("write_cells", sheet="Sheet", cells={"A1": 5}).error is None
    assert call("read_range", sheet="Sheet", range="A1:A2").content == "A1: 5\nA2: =A1+1 -> 6.0"


def with_cached_formula(formula: str, cached: str) -> bytes:
    """A workbook whose Sheet!A1 holds ``formula`` with the value ``cached`` saved, as Excel leaves it."""
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet"
    wb.active["A1"] = formula

    def rewrite(name: str, data: bytes) -> bytes:
        if name == "xl/worksheets/sheet1.xml":
            data, found = re.subn(rb"(<f>[^<]*</f>)<v\s*/>|(<f>[^<]*</f>)<v></v>|(<f>[^<]*</f>)(?!<v)",
                                  lambda m: (m[1] or m[2] or m[3]) + f"<v>{cached}</v>".encode(), data)
            assert found == 1, data
        return data

    return saved_with_parts(wb, rewrite)


def test_the_grader_reads_cached_values_of_the_models_file_within_its_deadline(monkeypatch):
    """A formula ``formulas`` cannot compute (a function it lacks) does not match: the value saved
    in the model's file is never taken (test_cached_values.py).
    HEAD parsed the model's file again on the host for it, after the bounded read, outside the
    deadline (as long as the first parse: 30 s for a file within check_workbook's limits); now no
    parse of the model's file runs on the host at all."""
    output = with_cached_formula("=NOSUCHFUNCTION(1)", "7")
    answer = openpyxl.Workbook()
    answer.active.title = "Sheet"
    answer.active["A1"] = 7
    buffer = io.BytesIO()
    answer.save(buffer)
    opened_here = []
    real_open = recalc._open

    def spy(data, **kwargs):  # (the call's processes fork from a worker of their own: unseen here)
        opened_here.append(data)
        return real_open(data, **kwargs)

    monkeypatch.setattr(recalc, "_open", spy)
    result = grade(output, buffer.getvalue(), "A1", time_limit=30)
    assert not result.solved and any("NOSUCHFUNCTION" in note for note in result.notes), result
    assert output not in opened_here  # the answer (the task's own file) may be read here
    result = grade(output, buffer.getvalue(), "A1", recalc="none", time_limit=30)
    assert result.solved and output not in opened_here, result
