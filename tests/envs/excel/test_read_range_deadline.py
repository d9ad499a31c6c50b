"""A read_range that computes formulas without saved values does all its work on the model's
workbook within the tool's deadline: it recalculated a copy of the loaded workbook saved again on
the host, outside any deadline (as long as the file's parse, or far longer: openpyxl converts every
picture that is not PNG, JPEG or GIF to PNG when it saves), and read it once more there."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import openpyxl
from openpyxl.drawing.image import Image
from PIL import Image as PILImage

import benchmax_gym
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.excel.recalc import check_workbook
from benchmax_gym.envs.excel.tools import WorkbookFile, read_range, write_cells


def picture(fmt: str, size: tuple[int, int], **options) -> bytes:
    buffer = io.BytesIO()
    PILImage.new("L", size).save(buffer, fmt, **options)
    return buffer.getvalue()


def with_pictures(copies: int, media: bytes) -> bytes:
    """A workbook (Sheet!A1 = 1, A2 = =A1+1, A3 = =A2*10, no saved values) showing one picture
    ``copies`` times, its file ``media``."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet"
    ws["A1"], ws["A2"], ws["A3"] = 1, "=A1+1", "=A2*10"
    ws.add_image(Image(io.BytesIO(picture("PNG", (8, 8)))), "C3")
    buffer = io.BytesIO()
    wb.save(buffer)
    source = zipfile.ZipFile(buffer)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for part in source.infolist():
            data = source.read(part)
            if part.filename.startswith("xl/media/"):
                data = media
            elif part.filename == "xl/drawings/drawing1.xml":  # the picture's anchor, ``copies`` times
                text = data.decode()
                anchor = re.search(r"<(xdr:)?oneCellAnchor>.*</(xdr:)?oneCellAnchor>", text, re.S)[0]
                data = text.replace(anchor, anchor * copies).encode()
            archive.writestr(part.filename, data)
    return out.getvalue()


def reads(tmp_path, data: bytes, timeout: float):
    """The episode's workbook, the model's ``data`` loaded, and a call of read_range on it."""
    (tmp_path / "workbook.xlsx").write_bytes(data)
    workbook = WorkbookFile(tmp_path / "workbook.xlsx", timeout=timeout)
    episode = types.SimpleNamespace(state={"workbook": workbook})
    tools = Toolset([read_range, write_cells])
    return workbook, lambda name, **args: tools.run(name, args, episode=episode, timeout=timeout, max_chars=4000)


SCRIPT = """
import sys, types
from pathlib import Path
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.excel import recalc
from benchmax_gym.envs.excel.tools import WorkbookFile, read_range

tmp = Path(sys.argv[1])
(tmp / "workbook.xlsx").write_bytes((tmp / "task.xlsx").read_bytes())
workbook = WorkbookFile(tmp / "workbook.xlsx", timeout=60)
workbook.book()  # the task's file; then the model's, checked and parsed within their deadline
(tmp / "workbook.xlsx").write_bytes((tmp / "model.xlsx").read_bytes())
workbook.book(), workbook.cached_values()
recalc._the_worker()
workbook.timeout = 1.0  # the recalculation's own deadline
episode = types.SimpleNamespace(state={"workbook": workbook})
result = Toolset([read_range]).run("read_range", {"sheet": "Sheet", "range": "A1:A3"}, episode=episode, timeout=1.0,
                                   max_chars=4000)
print(result.error, result.content)
"""


def test_a_read_whose_workbook_was_slow_to_save_computes_within_its_deadline(tmp_path):
    """80 copies of a compressed 9000 x 9000 TIFF (114 KB): parsed in an instant, each copy was
    decoded and written as PNG at every save (~2 s). Before f11add0 the read saved them all on the
    host, past any deadline; then it stopped at its deadline (the save inside the call's process);
    now pictures are saved as they were read, and the read computes in time."""
    data = with_pictures(80, picture("TIFF", (9000, 9000), compression="tiff_adobe_deflate"))
    check_workbook(data)  # within the limits: only the deadline bounds it
    (tmp_path / "model.xlsx").write_bytes(data)
    (tmp_path / "task.xlsx").write_bytes(with_pictures(1, picture("PNG", (8, 8))))
    root = Path(benchmax_gym.__file__).resolve().parents[1]
    try:
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                              text=True, timeout=60, cwd=root)
    except subprocess.TimeoutExpired:
        raise AssertionError("read_range ran on for a minute past its 1 s deadline") from None
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "None A1: 1\nA2: =A1+1 -> 2.0\nA3: =A2*10 -> 20.0\n", done.stdout


def test_reads_of_a_workbook_with_pictures_compute_every_time(tmp_path):
    """openpyxl closes a picture's file when it saves it: HEAD's second recalculating read saved the
    loaded workbook again and failed (ValueError: I/O operation on closed file)."""
    workbook, call = reads(tmp_path, with_pictures(1, picture("PNG", (8, 8))), timeout=30)
    assert call("read_range", sheet="Sheet", range="A1:A2").content == "A1: 1\nA2: =A1+1 -> 2.0"
    assert call("read_range", sheet="Sheet", range="A2:A3").content == "A2: =A1+1 -> 2.0\nA3: =A2*10 -> 20.0"
    assert call("write_cells", sheet="Sheet", cells={"A1": 5}).error is None
    assert call("read_range", sheet="Sheet", range="A1:A3").content == "A1: 5\nA2: =A1+1 -> 6.0\nA3: =A2*10 -> 60.0"
