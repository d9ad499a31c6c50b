"""Whatever the recalculation (``recalc="none"`` or ``"libreoffice"`` as much as the ``formulas``
engine), the model's workbook is checked (:func:`.recalc.check_workbook`) and parsed only in the
call's own process, killed at its deadline and bounded in memory: never on the host, where a file
within the size limits takes a parse 30 s and 2 GB, and one over them (XML entities, a zip bomb,
shared strings shown in every cell) costs what no limit sees."""

from __future__ import annotations

import io
import os
import stat
import sys
import zipfile
from pathlib import Path

import openpyxl
import pytest

from benchmax_gym.envs.excel import recalc
from benchmax_gym.envs.excel.grading import grade
from benchmax_gym.envs.excel.recalc import TimeLimitExceeded, WorkbookTooLarge, recalculate
from tests.envs.excel.test_host_bounds import shared_strings_book
from tests.envs.excel.test_hostile_files import one_cell, too_many_cells, with_entities, with_parts
from tests.envs.excel.test_parse_deadline import with_fonts
from tests.envs.excel.test_pictures_and_saves import with_cached_formula


@pytest.fixture
def opened_here(monkeypatch) -> list[bytes]:
    """The workbooks openpyxl parses in this process (the call's processes fork from a worker of
    their own: unseen here)."""
    opened: list[bytes] = []
    real_open = recalc._open

    def spy(data, **kwargs):
        opened.append(data)
        return real_open(data, **kwargs)

    monkeypatch.setattr(recalc, "_open", spy)
    return opened


def test_recalc_none_reads_the_models_file_only_in_the_call_process(opened_here):
    """HEAD: ``recalculate(recalc="none")`` parsed the model's file on the host to find its formula
    cells, before any deadline, and only then read the cached values in a call's process."""
    output = with_cached_formula("=NOSUCHFUNCTION(1)", "7")
    assert recalculate(output, recalc="none", time_limit=60) == {("Sheet", "A1"): 7}
    assert recalculate(output, recalc="none", ranges=[("Sheet", "A1:B2")], time_limit=60) == {("Sheet", "A1"): 7}
    assert opened_here.count(output) == 0
    assert recalculate(output, recalc="none") == {("Sheet", "A1"): 7}  # no time limit: a trusted file, read here
    assert opened_here.count(output) > 0


def zip_bomb() -> bytes:
    """:func:`one_cell` with a part of 60 MB of zeros (~60 KB zipped)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        source = zipfile.ZipFile(io.BytesIO(one_cell()))
        for part in source.infolist():
            archive.writestr(part.filename, source.read(part))
        archive.writestr("xl/media/bomb.xml", b"\0" * (60 * 2**20))
    return out.getvalue()


HOSTILE = {  # what check_workbook refuses, and the words it says so with
    "entities": (lambda: with_entities(10), "declares XML entities"),
    "cells": (too_many_cells, "more cells than the limit"),
    "shared-strings": (lambda: shared_strings_book(3000, "x" * 32767), "shared strings, written out in every cell"),
    "zip-bomb": (zip_bomb, "expands .*-fold"),
    "parts": (lambda: with_parts({f"xl/media/{i}.xml": b"" for i in range(recalc.MAX_PARTS)}), "parts; the limit is"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_recalc_none_refuses_what_the_size_check_refuses(name, opened_here):
    """HEAD: with ``recalc="none"`` nothing checked the model's file: these were parsed on the
    host (an entity expanding 10,000-fold there, unseen by any limit) and answered as readable."""
    make, refusal = HOSTILE[name]
    data = make()
    with pytest.raises(WorkbookTooLarge, match=refusal):
        recalculate(data, recalc="none", time_limit=60)
    assert opened_here.count(data) == 0


@pytest.fixture(scope="module")
def many_entries() -> bytes:
    """A zip of 150,000 empty entries (13 MB of directory: seconds for zipfile to read)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for i in range(150_000):
            archive.writestr(str(i), b"")
    return out.getvalue()


@pytest.fixture(scope="module")
def slow_to_parse() -> bytes:
    return with_fonts(200_000)  # within the limits; ~5 s and ~300 MB of openpyxl's parse


@pytest.mark.parametrize("fixture", ["slow_to_parse", "many_entries"])
def test_recalc_none_gives_up_reading_a_slow_workbook_at_its_deadline(fixture, request):
    """HEAD: the parse ran on the host, seconds past the deadline of 0.2 s (and then answered, or
    failed with openpyxl's own error: this zip holds no workbook)."""
    data = request.getfixturevalue(fixture)
    with pytest.raises(TimeLimitExceeded, match="reading the workbook took over 0.2 s"):
        recalculate(data, recalc="none", time_limit=0.2)


def _fake_soffice(tmp_path, monkeypatch, converted) -> Path:
    """A stand-in ``soffice`` on PATH, for an output of the test's choosing (test_libreoffice.py
    runs the real one): it 'converts' by copying ``converted`` and leaves a mark."""
    mark = tmp_path / "soffice-ran"
    fake = tmp_path / "bin" / "soffice"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 1 ]; do [ "$1" = --outdir ] && out=$2; shift; done\n'
        f'touch "{mark}"\n'
        f'cp "{converted}" "$out/$(basename "$1")"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return mark


@pytest.mark.skipif(sys.platform == "win32", reason="the fake soffice is a shell script")
def test_recalc_libreoffice_checks_the_models_file_and_its_output_in_the_call_process(tmp_path, monkeypatch,
                                                                                      opened_here):
    """The model's file over the limits is refused before LibreOffice (or the host) reads it, and
    LibreOffice's output, the model's work as much, is checked and read only in a call's process
    (HEAD parsed the input on the host twice, gave it to LibreOffice, and parsed its output here)."""
    converted = tmp_path / "converted.xlsx"
    converted.write_bytes(one_cell())
    mark = _fake_soffice(tmp_path, monkeypatch, converted)
    data = with_entities(10)
    with pytest.raises(WorkbookTooLarge, match="declares XML entities"):
        recalculate(data, recalc="libreoffice", time_limit=60)
    result = grade(data, one_cell(), "A1", recalc="libreoffice")  # its A1 is right
    assert not result.solved and any("declares XML entities" in note for note in result.notes), result.notes
    assert opened_here.count(data) == 0 and not mark.exists()

    output = with_cached_formula("=6*7", "42")  # a fine file; what LibreOffice makes of it declares entities
    hostile = with_entities(10)
    converted.write_bytes(hostile)
    with pytest.raises(WorkbookTooLarge, match="declares XML entities"):
        recalculate(output, recalc="libreoffice", time_limit=60)
    assert mark.exists() and opened_here.count(hostile) == 0 and opened_here.count(output) == 0
