"""Excel-v0 with ``recalc="libreoffice"``, on the real headless LibreOffice (``.ci/run`` installs
Debian's libreoffice-calc-nogui): it computes every formula of the model's workbook, never the
values cached in the file (LibreOffice's own default for xlsx is to keep them), it computes the
functions newer than the file format that ``write_cells`` wrote (stored with their ``_xlfn.``
prefix, as Excel stores them), and a formula it computes reaches no server and no other file.

The stand-in ``soffice`` tests (test_rubric.py, test_hardening2.py, test_host_parse_bounds.py)
stay: they make LibreOffice hang, crash or return hostile output, which the real one does not."""

from __future__ import annotations

import http.server
import os
import stat
import threading

import openpyxl
import pytest

from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.recalc import FUTURE_FUNCTIONS, as_excel_stores, recalculate, soffice_executable
from tests.envs.excel.test_host_bounds import call, small_env, to_bytes
from tests.envs.excel.test_pictures_and_saves import with_cached_formula

needs_libreoffice = pytest.mark.skipif(
    soffice_executable() is None, reason="LibreOffice is not installed (apt-get install libreoffice-calc-nogui)")


def _book(**cells) -> bytes:
    wb = openpyxl.Workbook()
    wb.active.title = "Sheet"
    for coordinate, value in cells.items():
        wb.active[coordinate] = value
    return to_bytes(wb)


@needs_libreoffice
def test_a_formulas_cached_value_is_never_graded_libreoffice_computes_it():
    """A workbook whose ``=1+1`` is saved with the value 99 (the model's code can write the file's
    XML) graded 99 as right: LibreOffice kept the cached value, its default for xlsx files."""
    output = with_cached_formula("=1+1", "99")
    assert recalculate(output, recalc="libreoffice") == {("Sheet", "A1"): 2}
    assert not grade(output, _book(A1=99), "A1", recalc="libreoffice").solved


@needs_libreoffice
def test_tool_written_formulas_are_computed_by_libreoffice_newer_functions_too(tmp_path, monkeypatch):
    """``read_range`` and the grade come from LibreOffice itself (a wrapper on PATH counts its
    runs). TEXTJOIN and IFS written as a model types them were ``#NAME?`` to it (and to Excel):
    the file held the bare name, where Excel stores ``_xlfn.TEXTJOIN``."""
    runs = tmp_path / "soffice-runs"
    wrapper = tmp_path / "bin" / "soffice"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho run >> "{runs}"\nexec "{soffice_executable()}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")

    env = small_env(tmp_path, recalc="libreoffice")  # Sheet!A1:A3 holds 1, 2, 3; the answer is E1 = 6
    env.step(call("write_cells", sheet="Sheet", cells={
        "E1": "=SUM(A1:A2)", "E2": '=TEXTJOIN("-",TRUE,A1:A3)', "E3": '=ifs(A1=1,"one",TRUE,"other")'}))
    obs, _, _, _, info = env.step(call("read_range", sheet="Sheet", range="E1:E3"))
    assert info["error"] is None
    assert "-> 3" in obs and "-> 1-2-3" in obs and "-> one" in obs and "#NAME?" not in obs, obs
    env.step(call("write_cells", sheet="Sheet", cells={"E1": "=SUM(A1:A3)"}))
    _, reward, terminated, _, _ = env.step("done")
    assert terminated and reward == 1.0
    assert runs.read_text().count("run") == 2  # the read and the grade
    env.close()


@needs_libreoffice
def test_a_formula_libreoffice_computes_reaches_no_server_and_no_other_file(tmp_path):
    """WEBSERVICE to a server on loopback and INDIRECT to a file beside the workbook (in the ways
    LibreOffice and Excel name another file) fetch nothing and read nothing."""
    asked = []

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"731")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = openpyxl.Workbook()
    secret.active.title = "Sheet1"
    secret.active["A1"] = 90731
    secret.save(tmp_path / "secret.xlsx")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        values = recalculate(_book(
            A1=f'=_xlfn.WEBSERVICE("{url}/a")', A2=f'=WEBSERVICE("{url}/b")',
            A3=f'=INDIRECT("\'file://{tmp_path}/secret.xlsx\'#$Sheet1.A1")',
            A4=f'=INDIRECT("\'{tmp_path}/[secret.xlsx]Sheet1\'!A1")',
            A5=f'=INDIRECT("[{tmp_path}/secret.xlsx]Sheet1!A1")'), recalc="libreoffice")
    finally:
        server.shutdown()
    assert asked == []
    assert len(values) == 5 and not any("731" in str(value) for value in values.values()), values


# -- what write_cells stores (no LibreOffice needed) ----------------------------------------------

@pytest.mark.parametrize("typed, stored", [
    ('=TEXTJOIN("-",TRUE,A1:A3)', '=_xlfn.TEXTJOIN("-",TRUE,A1:A3)'),
    ("=xlookup(1,A1:A3,B1:B3)", "=_xlfn.XLOOKUP(1,A1:A3,B1:B3)"),  # Excel upper-cases what it knows
    ("=SUM(FILTER(A1:A3,A1:A3>1))+SORT(A1)", "=SUM(_xlfn._xlws.FILTER(A1:A3,A1:A3>1))+_xlfn._xlws.SORT(A1)"),
    ('=STDEV.S(A1:A3)&"IFS("&\'CONCAT(1)\'!A1', '=_xlfn.STDEV.S(A1:A3)&"IFS("&\'CONCAT(1)\'!A1'),  # text, sheet
    ("=_xlfn.IFS(TRUE,1)", "=_xlfn.IFS(TRUE,1)"),  # prefixed already
    ("=SUMIFS(A1:A3,B1:B3,1)+IFERROR(1,2)+CONCATENATE(1)", "=SUMIFS(A1:A3,B1:B3,1)+IFERROR(1,2)+CONCATENATE(1)"),
    ("=SUM((", "=SUM(("),  # a formula Excel would refuse: left for the recalculation to make an error
])
def test_write_cells_stores_newer_functions_with_excels_prefix(tmp_path, typed, stored):
    assert as_excel_stores(typed) == stored
    env = small_env(tmp_path)
    env.step(call("write_cells", sheet="Sheet", cells={"E1": typed}))
    saved = openpyxl.load_workbook(env.unwrapped.episode.state["workbook"].path)  # the formula as the file holds it
    assert saved["Sheet"]["E1"].value == stored
    env.close()


def test_the_newer_functions_are_those_excel_prefixes():
    """Each is a function ``formulas`` computes under its ``_XLFN.`` name (where it knows it), and
    none is one of the file format's first version (openpyxl's list): those stay bare."""
    import formulas
    from openpyxl.utils import FORMULAE

    known = formulas.get_functions()
    assert not FUTURE_FUNCTIONS & FORMULAE
    assert all(f"_XLFN.{name}" in known for name in FUTURE_FUNCTIONS if name in known)
    assert {"TEXTJOIN", "CONCAT", "IFS", "MAXIFS", "SWITCH", "XLOOKUP", "UNIQUE", "STDEV.S"} <= FUTURE_FUNCTIONS
