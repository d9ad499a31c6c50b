"""Excel tasks: the seeded workbook generator, the SpreadsheetBench loader, archives and downloads.

Nothing here touches the network: downloads go to a real HTTP server on 127.0.0.1, and every
archive is built in ``tmp_path`` from the shared SpreadsheetBench sample.
"""

import datetime as dt
import http.server
import io
import json
import math
import os
import shutil
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import openpyxl
import pytest
from openpyxl.utils import range_boundaries

from benchmax_gym.core.tasks import GeneratedTasks, ListTasks
from benchmax_gym.core import cache
from benchmax_gym.core.cache import cache_root, safe_extract
from benchmax_gym.envs.excel import generator, spreadsheetbench, workbooks
from benchmax_gym.envs.excel.generator import TASK_TYPES, ExcelTaskConfig, generated_tasks, make_excel_task
from benchmax_gym.envs.excel.spreadsheetbench import spreadsheetbench_tasks

SB = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "spreadsheetbench"
needs_sb = pytest.mark.skipif(
    not (SB / "dataset.json").is_file(), reason=f"shared SpreadsheetBench sample not found at {SB}"
)

# -- helpers ---------------------------------------------------------------------------------


def split_position(position: str) -> tuple[str | None, str]:
    """``'Sheet 1'!A1:B2`` -> ("Sheet 1", "A1:B2"); ``C5`` -> (None, "C5")."""
    if "!" not in position:
        return None, position
    sheet, _, cells = position.rpartition("!")
    return sheet.strip("'"), cells


def cells_of(ref: str):
    c1, r1, c2, r2 = range_boundaries(ref)
    return [(r, c) for r in range(r1, r2 + 1) for c in range(c1, c2 + 1)]


def sb_value(v):
    """SpreadsheetBench's transform_value: numbers and numeric text to 2 decimals, dates to days."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return round(float(v), 2)
    if isinstance(v, dt.datetime):
        return round((v - dt.datetime(1899, 12, 30)).total_seconds() / 86400, 0)
    if isinstance(v, dt.time):
        return str(v)[:-3]
    if isinstance(v, str):
        try:
            return round(float(v), 2)
        except ValueError:
            return v
    return v


def sb_same(a, b) -> bool:
    a, b = sb_value(a), sb_value(b)
    if a in ("", None) and b in ("", None):
        return True
    return type(a) is type(b) and a == b


def load(xlsx) -> openpyxl.Workbook:
    return openpyxl.load_workbook(io.BytesIO(xlsx) if isinstance(xlsx, bytes) else xlsx)


def passes(candidate: openpyxl.Workbook, answer: openpyxl.Workbook, position: str) -> bool:
    """SpreadsheetBench's check for one position: the sheet exists and every cell matches."""
    sheet, ref = split_position(position)
    sheet = sheet or answer.sheetnames[0]
    if sheet not in candidate.sheetnames:
        return False
    return all(
        sb_same(candidate[sheet].cell(r, c).value, answer[sheet].cell(r, c).value)
        for r, c in cells_of(ref)
    )


def task(task_type: str, rows: int, multi_sheet: bool, index: int = 0, seed: int = 0):
    config = ExcelTaskConfig(rows=rows, multi_sheet=multi_sheet, task_types=(task_type,))
    return generated_tasks(config, seed=seed)[index]


# -- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"rows": 4}, "rows"),
        ({"rows": 501}, "rows"),
        ({"rows": "20"}, "rows"),
        ({"rows": True}, "rows"),
        ({"rows": 20.0}, "rows"),
        ({"multi_sheet": "yes"}, "multi_sheet"),
        ({"multi_sheet": 1}, "multi_sheet"),
        ({"task_types": ()}, "task_types"),
        ({"task_types": ("sort", "pivot")}, "task_types"),
        ({"task_types": 5}, "task_types"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field) as error:
        ExcelTaskConfig(**kwargs)
    if field == "task_types" and kwargs["task_types"]:
        assert "aggregate" in str(error.value)  # the allowed values are listed
    if field == "rows":
        assert "5" in str(error.value) and "500" in str(error.value)


def test_config_defaults_and_normalisation():
    config = ExcelTaskConfig()
    assert (config.rows, config.multi_sheet, config.task_types) == (20, False, TASK_TYPES)
    assert ExcelTaskConfig(task_types=["sort", "lookup", "sort"]).task_types == ("sort", "lookup")
    assert ExcelTaskConfig(task_types="filter").task_types == ("filter",)
    hash(ExcelTaskConfig(task_types=["sort"]))  # frozen and hashable


def test_generated_tasks_source():
    source = generated_tasks(seed=3, size=7)
    assert isinstance(source, GeneratedTasks) and len(source) == 7
    with pytest.raises(ValueError, match="difficulty must be a dict of ExcelTaskConfig fields"):
        generated_tasks("big")
    assert generated_tasks({"rows": 10})[0].prompt == generated_tasks(ExcelTaskConfig(rows=10))[0].prompt
    assert make_excel_task(np.random.default_rng([3, 2]), 2).prompt == source[2].prompt


# -- determinism ---------------------------------------------------------------------------


def test_same_seed_and_index_give_identical_bytes():
    for multi_sheet in (False, True):
        config = ExcelTaskConfig(rows=15, multi_sheet=multi_sheet)
        a, b = generated_tasks(config, seed=11), generated_tasks(config, seed=11)
        for i in (0, 5, 123):
            x, y = a[i], b[i]
            assert x.id == y.id == f"gen-{i}"
            assert x.prompt == y.prompt and x.metadata == y.metadata
            assert x.files["workbook.xlsx"] == y.files["workbook.xlsx"]
            assert x.answer == y.answer == x.solution


def test_bytes_do_not_depend_on_the_clock(monkeypatch):
    before = generated_tasks(ExcelTaskConfig(multi_sheet=True), seed=2)[4]
    real = time.time
    monkeypatch.setattr(
        time, "time", lambda: real() + 400 * 86400
    )  # zip entry times come from here
    after = generated_tasks(ExcelTaskConfig(multi_sheet=True), seed=2)[4]
    assert before.files["workbook.xlsx"] == after.files["workbook.xlsx"]
    assert before.answer["workbook"] == after.answer["workbook"]


def test_different_index_or_seed_differs():
    source = generated_tasks(seed=0)
    tasks = [source[i] for i in range(12)]
    assert len({t.files["workbook.xlsx"] for t in tasks}) == 12
    assert len({t.prompt for t in tasks}) >= 10
    assert generated_tasks(seed=1)[0].files["workbook.xlsx"] != tasks[0].files["workbook.xlsx"]


def test_default_config_mixes_types_and_tables():
    source = generated_tasks(seed=0)
    seen = [source[i].metadata for i in range(80)]
    assert {m["type"] for m in seen} == set(TASK_TYPES)
    assert {m["table"] for m in seen} == {"sales", "inventory", "grades"}


# -- every type, size and layout --------------------------------------------------------------


def _check_task(t, task_type, rows, multi_sheet):
    assert t.metadata["source"] == "generated" and t.metadata["type"] == task_type
    assert t.metadata["rows"] == rows
    json.dumps(dict(t.metadata))
    assert set(t.files) == {"workbook.xlsx"}
    assert t.answer == t.solution and set(t.answer) == {"workbook", "position"}
    assert isinstance(t.answer["workbook"], bytes) and isinstance(t.files["workbook.xlsx"], bytes)
    position = t.answer["position"]
    assert position.startswith("'") and "'!" in position

    level = (
        "Sheet-Level Manipulation" if task_type in ("sort", "filter") else "Cell-Level Manipulation"
    )
    assert f"\n\nInstruction type: {level}\nAnswer position: {position}" in t.prompt
    if level.startswith("Sheet"):
        assert "\nAnswer sheet: " in t.prompt and "\nData position: " in t.prompt

    given, answer = load(t.files["workbook.xlsx"]), load(t.answer["workbook"])
    assert given.sheetnames == t.metadata["sheets"]
    if not multi_sheet:
        assert len(given.sheetnames) == 1
    sheet, ref = split_position(position)
    assert sheet in answer.sheetnames
    c1, r1, c2, r2 = range_boundaries(ref)
    ws = answer[sheet]
    assert 1 <= r1 <= r2 <= ws.max_row and 1 <= c1 <= c2 <= ws.max_column
    assert f"'{sheet}'" in t.prompt.split("\n\nInstruction type")[0] or f'"{sheet}"' in t.prompt

    answer_cells = {(r, c) for r, c in cells_of(ref)}
    for r, c in answer_cells:  # the whole position is filled, with plain values
        value = ws.cell(r, c).value
        assert value not in (None, ""), (t.id, ws.cell(r, c).coordinate)
        assert not (isinstance(value, str) and value.startswith("="))
        if isinstance(value, float):  # never on a rounding tie at 2 decimals
            scaled = value * 100
            assert abs(scaled - math.floor(scaled) - 0.5) > 1e-6, value

    # doing nothing scores 0; the answer scores 1 against itself
    assert not passes(given, answer, position), t.id
    assert passes(answer, answer, position)

    # the answer workbook changes nothing outside the answer position
    for name in given.sheetnames:
        a, b = given[name], answer[name]
        for row in range(1, max(a.max_row, b.max_row) + 1):
            for col in range(1, max(a.max_column, b.max_column) + 1):
                if name == sheet and (row, col) in answer_cells:
                    continue
                assert a.cell(row, col).value == b.cell(row, col).value, (t.id, name, row, col)
    return given, answer


@pytest.mark.parametrize("multi_sheet", [False, True])
@pytest.mark.parametrize("rows", [5, 20, 200])
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_every_type_size_and_layout(task_type, rows, multi_sheet):
    indices = (0, 1, 2, 3) if rows < 200 else (0, 1)
    for index in indices:
        _check_task(task(task_type, rows, multi_sheet, index), task_type, rows, multi_sheet)


def test_multi_sheet_layouts():
    lookups = [task("lookup", 10, True, i) for i in range(6)]
    for t in lookups:  # keys on another sheet than the table
        sheet, _ = split_position(t.answer["position"])
        assert sheet in ("Lookup", "Requests", "Query")
    for i in range(6):  # the filtered table is never on the first sheet
        t = task("filter", 10, True, i)
        data_sheet = t.prompt.split("Data position: '")[1].split("'")[0]
        assert len(t.metadata["sheets"]) >= 2 and t.metadata["sheets"].index(data_sheet) >= 1


def _table(ws):
    return [list(r) for r in ws.iter_rows(values_only=True)]


def test_sort_answer_is_a_permutation_of_the_rows():
    for i in range(8):
        t = task("sort", 30, i % 2 == 1, i)
        sheet, ref = split_position(t.answer["position"])
        given, answer = load(t.files["workbook.xlsx"])[sheet], load(t.answer["workbook"])[sheet]
        before, after = _table(given), _table(answer)
        assert before[0] == after[0] and before != after
        assert sorted(map(repr, before[1:])) == sorted(map(repr, after[1:]))


def test_filter_answer_is_an_ordered_subset_with_header():
    for i in range(8):
        t = task("filter", 30, i % 2 == 1, i)
        sheet, _ = split_position(t.answer["position"])
        data_sheet = t.prompt.split("Data position: '")[1].split("'")[0]
        source = _table(load(t.files["workbook.xlsx"])[data_sheet])
        copied = _table(load(t.answer["workbook"])[sheet])
        assert copied[0] == source[0]
        assert 1 <= len(copied) - 1 < len(source) - 1
        it = iter(source[1:])
        assert all(any(row == s for s in it) for row in copied[1:])  # a subsequence, in order


# -- SpreadsheetBench: the shared sample ---------------------------------------------------------


def _expected_cases():
    records = json.loads((SB / "dataset.json").read_text())
    out = []
    for r in records:
        sid = str(r["id"])
        for n in (1, 2, 3):
            if (SB / "spreadsheet" / sid / f"{n}_{sid}_input.xlsx").is_file():
                out.append((sid, n))
    return records, out


@needs_sb
def test_loader_reads_every_case():
    records, cases = _expected_cases()
    source = spreadsheetbench_tasks(SB)
    assert isinstance(source, ListTasks)
    assert len(source) == len(cases) == 60  # 20 records x 3 cases in the shared sample
    assert [t.id for t in source.tasks] == [f"sb-{sid}-{n}" for sid, n in cases]
    by_id = {str(r["id"]): r for r in records}
    for t in source.tasks:
        meta = t.metadata
        record = by_id[meta["spreadsheet_id"]]
        assert isinstance(meta["spreadsheet_id"], str) and meta["source"] == "spreadsheetbench"
        assert meta["instruction_type"] == record["instruction_type"]
        assert meta["answer_position"] == record["answer_position"] == t.answer["position"]
        assert t.answer == t.solution
        for key in ("answer_sheet", "data_position"):
            assert meta.get(key) == record.get(key)
        workbook, answer = t.files["workbook.xlsx"], t.answer["workbook"]
        assert isinstance(workbook, str) and isinstance(answer, str)  # paths, not bytes
        assert os.path.isfile(workbook) and os.path.isfile(answer)
        assert workbook.endswith(f"{meta['case']}_{meta['spreadsheet_id']}_input.xlsx")
        assert answer.endswith(f"{meta['case']}_{meta['spreadsheet_id']}_answer.xlsx")
        assert t.prompt.startswith(record["instruction"].strip())
        assert f"Instruction type: {record['instruction_type']}" in t.prompt
        assert f"Answer position: {record['answer_position']}" in t.prompt
        if "answer_sheet" in record:
            assert f"Answer sheet: {record['answer_sheet']}" in t.prompt
        json.dumps(dict(meta))
    assert {type(r["id"]) for r in records} == {int, str}  # both kinds of id are exercised


@needs_sb
def test_loader_limit_and_ids():
    records, _ = _expected_cases()
    first = [str(r["id"]) for r in records[:2]]
    limited = spreadsheetbench_tasks(SB, limit=2)
    assert {t.metadata["spreadsheet_id"] for t in limited.tasks} == set(first) and len(limited) == 6
    picked = spreadsheetbench_tasks(SB, ids=[10452, "CF_8276"])
    assert [t.id for t in picked.tasks] == [
        f"sb-{i}-{n}" for i in ("10452", "CF_8276") for n in (1, 2, 3)
    ]
    assert len(spreadsheetbench_tasks(SB, ids="79-7")) == 3
    assert len(spreadsheetbench_tasks(SB, ids=["10452", "CF_8276"], limit=1)) == 3
    with pytest.raises(ValueError, match="nope"):
        spreadsheetbench_tasks(SB, ids=["nope"])
    for bad in (0, -1, True, "3"):
        with pytest.raises(ValueError, match="limit"):
            spreadsheetbench_tasks(SB, limit=bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        spreadsheetbench_tasks(SB / "missing")


def _copy_records(target: Path, ids) -> list[dict]:
    records = [r for r in json.loads((SB / "dataset.json").read_text()) if str(r["id"]) in ids]
    for r in records:
        shutil.copytree(SB / "spreadsheet" / str(r["id"]), target / "spreadsheet" / str(r["id"]))
    (target / "dataset.json").write_text(json.dumps(records))
    return records


@needs_sb
def test_loader_skips_missing_cases_and_names_missing_files(tmp_path):
    root = tmp_path / "release" / "data"  # dataset.json one level down: found
    _copy_records(root, {"10452", "134-14"})
    for n in (2, 3):  # a release with only one case for 10452
        for kind in ("input", "answer"):
            (root / "spreadsheet" / "10452" / f"{n}_10452_{kind}.xlsx").unlink()
    source = spreadsheetbench_tasks(tmp_path / "release")
    assert [t.id for t in source.tasks] == [
        "sb-10452-1",
        "sb-134-14-1",
        "sb-134-14-2",
        "sb-134-14-3",
    ]

    (root / "spreadsheet" / "134-14" / "2_134-14_answer.xlsx").unlink()
    with pytest.raises(FileNotFoundError, match="2_134-14_answer.xlsx"):
        spreadsheetbench_tasks(root)
    shutil.rmtree(root / "spreadsheet" / "134-14")
    with pytest.raises(FileNotFoundError, match="1_134-14_input.xlsx"):
        spreadsheetbench_tasks(root)
    assert len(spreadsheetbench_tasks(root, ids=[10452])) == 1  # the broken record is not read


@needs_sb
def test_loader_verified_layout_and_json_lines(tmp_path):
    (tmp_path / "spreadsheet" / "abc").mkdir(parents=True)
    src = SB / "spreadsheet" / "79-7"
    shutil.copy(src / "1_79-7_input.xlsx", tmp_path / "spreadsheet" / "abc" / "1_abc_init.xlsx")
    shutil.copy(src / "1_79-7_answer.xlsx", tmp_path / "spreadsheet" / "abc" / "1_abc_golden.xlsx")
    record = {
        "id": "abc",
        "instruction": "Do it.",
        "spreadsheet_path": "spreadsheet/abc",
        "instruction_type": "Cell-Level Manipulation",
        "answer_position": "A1:A4",
    }
    (tmp_path / "dataset.json").write_text(json.dumps(record) + "\n")
    (t,) = spreadsheetbench_tasks(tmp_path).tasks
    assert t.id == "sb-abc-1" and t.files["workbook.xlsx"].endswith("1_abc_init.xlsx")
    assert t.prompt == "Do it.\n\nInstruction type: Cell-Level Manipulation\nAnswer position: A1:A4"

    record["spreadsheet_path"] = "../outside"
    (tmp_path / "dataset.json").write_text(json.dumps([record]))
    with pytest.raises(ValueError, match="outside"):
        spreadsheetbench_tasks(tmp_path)


# -- archives ------------------------------------------------------------------------------------


def _make_tar(path: Path, root_name: str = "spreadsheetbench") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        tar.add(SB, arcname=root_name)
    return path


def _make_zip(path: Path, root_name: str = "spreadsheetbench") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(SB.rglob("*")):
            zf.write(file, f"{root_name}/{file.relative_to(SB).as_posix()}")
    return path


@needs_sb
@pytest.mark.parametrize(
    "maker, name", [(_make_tar, "sb.tar.gz"), (_make_tar, "sb.tgz"), (_make_zip, "sb.zip")]
)
def test_archive_round_trip(tmp_path, maker, name):
    archive = maker(tmp_path / name)
    cache = tmp_path / "cache"
    source = spreadsheetbench_tasks(archive, cache_dir=cache)
    assert len(source) == 60
    for t in source.tasks:
        assert Path(t.files["workbook.xlsx"]).is_file()
        assert Path(t.files["workbook.xlsx"]).resolve().is_relative_to(cache.resolve())
    assert (
        load(source.tasks[0].files["workbook.xlsx"]).sheetnames
        == load(str(SB / "spreadsheet" / "10452" / "1_10452_input.xlsx")).sheetnames
    )
    (extracted,) = (cache / "extracted").iterdir()
    stamp = (extracted / ".complete").stat().st_mtime_ns
    again = spreadsheetbench_tasks(archive, cache_dir=cache, limit=1)  # reuses the extraction
    assert len(again) == 3 and (extracted / ".complete").stat().st_mtime_ns == stamp
    assert [p.name for p in (cache / "extracted").iterdir()] == [extracted.name]


@needs_sb
def test_interrupted_extraction_is_redone(tmp_path):
    archive = _make_zip(tmp_path / "sb.zip")
    cache = tmp_path / "cache"
    first = spreadsheetbench_tasks(archive, cache_dir=cache, limit=1)
    (extracted,) = (cache / "extracted").iterdir()
    (extracted / ".complete").unlink()  # as if a previous run died half-way
    Path(first.tasks[0].files["workbook.xlsx"]).unlink()
    again = spreadsheetbench_tasks(archive, cache_dir=cache, limit=1)
    assert Path(again.tasks[0].files["workbook.xlsx"]).is_file()
    assert (extracted / ".complete").is_file()
    assert [p.name for p in (cache / "extracted").iterdir()] == [extracted.name]


@needs_sb
def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path / "gymcache"))
    assert cache_root("spreadsheetbench") == tmp_path / "gymcache" / "spreadsheetbench"
    source = spreadsheetbench_tasks(_make_zip(tmp_path / "x.zip"), limit=1)
    assert Path(source.tasks[0].files["workbook.xlsx"]).is_relative_to(
        tmp_path / "gymcache" / "spreadsheetbench"
    )
    monkeypatch.delenv("BENCHMAX_GYM_CACHE")
    assert cache_root("spreadsheetbench") == Path.home() / ".cache" / "benchmax-gym" / "spreadsheetbench"


def test_archive_without_dataset_json(tmp_path):
    with zipfile.ZipFile(tmp_path / "empty.zip", "w") as zf:
        zf.writestr("readme.txt", "nothing here")
    with pytest.raises(FileNotFoundError, match="dataset.json"):
        spreadsheetbench_tasks(tmp_path / "empty.zip", cache_dir=tmp_path / "cache")
    (tmp_path / "notes.txt").write_text("not an archive")
    with pytest.raises(ValueError, match="neither a tar nor a zip"):
        spreadsheetbench_tasks(tmp_path / "notes.txt", cache_dir=tmp_path / "cache")


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes = b"x", **attrs) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if attrs.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.size else None)


TAR_ATTACKS = {
    "parent": [("../evil", {})],
    "nested-parent": [("data/../../evil", {})],
    "absolute": [("/tmp/evil", {})],
    "symlink-etc-passwd": [("data/passwd", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"})],
    "symlink-outside": [("data/up", {"type": tarfile.SYMTYPE, "linkname": "../../evil"})],
    "hardlink-outside": [("data/hard", {"type": tarfile.LNKTYPE, "linkname": "../evil"})],
    "hardlink-absolute": [("data/hard", {"type": tarfile.LNKTYPE, "linkname": "/etc/passwd"})],
    "write-through-link": [
        ("data/dir", {"type": tarfile.SYMTYPE, "linkname": "."}),
        ("data/dir/evil", {}),
    ],
    "link-chain": [
        ("data/a", {"type": tarfile.SYMTYPE, "linkname": "b/../.."}),
        ("data/b", {"type": tarfile.SYMTYPE, "linkname": "c"}),
    ],
    "char-device": [("data/tty", {"type": tarfile.CHRTYPE, "devmajor": 4, "devminor": 1})],
    "block-device": [("data/sda", {"type": tarfile.BLKTYPE, "devmajor": 8, "devminor": 0})],
    "fifo": [("data/pipe", {"type": tarfile.FIFOTYPE})],
}


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("attack", sorted(TAR_ATTACKS))
def test_malicious_tar_is_rejected(tmp_path, attack):
    archive = tmp_path / f"{attack}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _tar_member(tar, "data/dataset.json", b"[]")  # a harmless member first
        for name, attrs in TAR_ATTACKS[attack]:
            _tar_member(tar, name, **attrs)
    bad = TAR_ATTACKS[attack][-1][0] if attack != "link-chain" else "data/a"
    tmp_evil_existed = os.path.exists("/tmp/evil")
    before = _snapshot(tmp_path)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="unsafe archive member") as error:
        spreadsheetbench_tasks(archive, cache_dir=cache)
    assert repr(bad) in str(error.value)
    after = _snapshot(tmp_path) - before
    assert all(p.startswith("cache") for p in after), after  # nothing outside the cache
    assert not [p for p in (cache / "extracted").rglob("*")], "the staging directory is removed"
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()
    assert os.path.exists("/tmp/evil") == tmp_evil_existed

    target = tmp_path / "target"  # safe_extract directly: nothing is written at all
    with pytest.raises(ValueError, match="unsafe archive member"):
        safe_extract(archive, target)
    assert list(target.iterdir()) == []


ZIP_ATTACKS = {
    "parent": ("../evil", b"x", 0o100644),
    "absolute": ("/tmp/evil", b"x", 0o100644),
    "backslash-parent": ("..\\evil", b"x", 0o100644),
    "symlink-etc-passwd": ("data/passwd", b"/etc/passwd", 0o120777),
    "symlink-outside": ("data/up", b"../../evil", 0o120777),
    "fifo": ("data/pipe", b"", 0o010644),
    "char-device": ("data/tty", b"", 0o020644),
}


@pytest.mark.parametrize("attack", sorted(ZIP_ATTACKS))
def test_malicious_zip_is_rejected(tmp_path, attack):
    name, data, mode = ZIP_ATTACKS[attack]
    archive = tmp_path / f"{attack}.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("data/dataset.json", "[]")
        info = zipfile.ZipInfo("placeholder")
        info.filename = name  # ZipInfo() would normalise some names; keep the raw one
        info.external_attr = mode << 16
        zf.writestr(info, data)
    tmp_evil_existed = os.path.exists("/tmp/evil")
    before = _snapshot(tmp_path)
    with pytest.raises(ValueError, match="unsafe archive member") as error:
        spreadsheetbench_tasks(archive, cache_dir=tmp_path / "cache")
    assert repr(name) in str(error.value)
    assert all(p.startswith("cache") for p in _snapshot(tmp_path) - before)
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()
    assert os.path.exists("/tmp/evil") == tmp_evil_existed
    target = tmp_path / "target"
    with pytest.raises(ValueError, match="unsafe archive member"):
        safe_extract(archive, target)
    assert list(target.iterdir()) == []


def test_links_inside_the_archive_are_allowed(tmp_path):
    archive = tmp_path / "ok.tar"
    with tarfile.open(archive, "w") as tar:
        _tar_member(tar, "data/real.txt", b"hello")
        _tar_member(tar, "data/alias.txt", type=tarfile.SYMTYPE, linkname="real.txt")
        _tar_member(tar, "data/sub/hard.txt", type=tarfile.LNKTYPE, linkname="data/real.txt")
    safe_extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "data" / "alias.txt").read_bytes() == b"hello"
    assert (tmp_path / "out" / "data" / "sub" / "hard.txt").read_bytes() == b"hello"


# -- downloads from a local HTTP server -----------------------------------------------------------


@pytest.fixture
def http_server(tmp_path, monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 directly, never through a proxy
    served = tmp_path / "www"
    served.mkdir()
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def do_GET(self):  # noqa: N802 - the http.server API
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served, requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@needs_sb
def test_download_once_then_cache(tmp_path, http_server):
    base, served, requests = http_server
    _make_tar(served / "spreadsheetbench_sample.tar.gz")
    cache = tmp_path / "cache"
    url = f"{base}/spreadsheetbench_sample.tar.gz"
    first = spreadsheetbench_tasks(url, cache_dir=cache)
    assert len(first) == 60 and requests == ["/spreadsheetbench_sample.tar.gz"]
    (download,) = (cache / "downloads").iterdir()
    assert download.name.endswith("spreadsheetbench_sample.tar.gz")
    second = spreadsheetbench_tasks(url, cache_dir=cache, ids=["79-7"])
    assert len(second) == 3 and len(requests) == 1  # served from the cache, no second request
    assert [p.name for p in (cache / "downloads").iterdir()] == [download.name]


def test_download_error_leaves_no_partial_file(tmp_path, http_server):
    base, _, requests = http_server
    import httpx

    with pytest.raises(httpx.HTTPStatusError):
        spreadsheetbench_tasks(f"{base}/missing.zip", cache_dir=tmp_path / "cache")
    assert requests == ["/missing.zip"]
    assert list((tmp_path / "cache" / "downloads").iterdir()) == []


def test_module_does_not_import_httpx_or_datasets_for_generation():
    # generation runs at reset; the loader's dependencies are imported lazily
    for module in (generator, workbooks, spreadsheetbench, cache):
        source = Path(module.__file__).read_text()
        assert "\nimport httpx" not in source and "\nimport datasets" not in source, module.__name__
