"""The workbooks behind generated Excel tasks: seeded tables (sales, inventory, grades) written
to sheets, maybe with distractor sheets, saved as deterministic xlsx bytes.

Item ``i`` of seed ``s`` must be byte-for-byte the same everywhere, so zip entries and document
properties carry fixed times (:func:`workbook_bytes`).
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from openpyxl import Workbook
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter
from openpyxl.writer.excel import ExcelWriter

from benchmax_gym.core.tasks import pick as _pick, rand_int as _int, sample as _sample


def _col(index: int) -> str:
    """Column letter of a 0-based column index."""
    return get_column_letter(index + 1)


def _money(cents: int) -> float:
    return cents / 100


# -- tables ----------------------------------------------------------------------------------

FIRST_NAMES = (
    "Alice", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Keira", "Liam", "Maya", "Nikhil", "Olivia", "Pablo", "Quinn", "Rosa", "Samir", "Tara",
    "Umar", "Vera", "Wes", "Xena", "Yusuf", "Zoe", "Aaron", "Bianca", "Chloe", "Dmitri",
    "Emma", "Felix", "Gita", "Hugo", "Ivy", "Jack", "Kenji", "Lena", "Marco", "Nora",
)  # fmt: skip
LAST_NAMES = (
    "Anderson", "Baker", "Castillo", "Dubois", "Edwards", "Fischer", "Garcia", "Hansen", "Ibrahim",
    "Jensen", "Kowalski", "Lopez", "Murphy", "Nakamura", "Okafor", "Patel", "Quinlan", "Rossi",
    "Schmidt", "Tanaka", "Usman", "Varga", "Walsh", "Xu", "Yilmaz", "Zhang", "Bennett", "Carter",
    "Dawson", "Ellis", "Foster", "Gupta", "Hughes", "Irwin", "Jordan", "Khan", "Larsen", "Moreau",
    "Novak", "Ortiz",
)  # fmt: skip
REGIONS = ("North", "South", "East", "West", "Central")
PRODUCTS = (
    ("Desk Lamp", 3499), ("Office Chair", 18900), ("Monitor Stand", 4550), ("Wireless Mouse", 2499),
    ("Keyboard", 5990), ("USB Hub", 1995), ("Webcam", 7900), ("Headset", 9950),
    ("Laptop Sleeve", 2900), ("Notebook Pack", 1249),
)  # fmt: skip
CATEGORIES = {  # category: (SKU prefix, items)
    "Hardware": ("HW", ("Hex Bolt", "Wood Screw", "Door Hinge", "Padlock", "Wall Anchor", "Cabinet Handle")),
    "Electrical": ("EL", ("Wall Socket", "Light Switch", "Cable Reel", "LED Bulb", "Fuse Box", "Plug Adapter")),
    "Plumbing": ("PL", ("Pipe Elbow", "Ball Valve", "Basin Tap", "Drain Trap", "Hose Clamp", "Pipe Tee")),
    "Garden": ("GD", ("Hose Nozzle", "Pruning Shears", "Plant Pot", "Garden Rake", "Seed Tray", "Watering Can")),
    "Paint": ("PT", ("Wall Paint", "Primer", "Paint Roller", "Masking Tape", "Wood Stain", "Paint Tray")),
}  # fmt: skip
VARIANTS = ("Small", "Medium", "Large", "Pro", "Basic", "XL")
CLASSES = ("9A", "9B", "9C", "10A", "10B", "10C", "11A", "11B")
MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
DATE_FORMATS = ("yyyy-mm-dd", "dd/mm/yyyy", "mmm d, yyyy")
MONEY_FORMATS = ("#,##0.00", '"$"#,##0.00')


@dataclass
class _Table:
    kind: str
    headers: list[str]
    rows: list[list[Any]]
    formats: list[str | None]
    key: int  # a column whose values are unique (lookup keys, sort tie-breaks)
    sheet: str
    noun: str  # "order", "item", "student"

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def m(self) -> int:
        return len(self.headers)

    def column(self, name: str) -> int:
        return self.headers.index(name)

    def values(self, name: str) -> list[Any]:
        c = self.column(name)
        return [row[c] for row in self.rows]

    @property
    def last_col(self) -> str:
        return _col(self.m - 1)

    @property
    def data_range(self) -> str:
        return f"A1:{self.last_col}{self.n + 1}"


def _people(rng: np.random.Generator, k: int) -> list[tuple[str, str]]:
    """``k`` distinct (first, last) name pairs."""
    total = len(FIRST_NAMES) * len(LAST_NAMES)
    picks = rng.choice(total, size=k, replace=False)
    return [
        (FIRST_NAMES[int(p) % len(FIRST_NAMES)], LAST_NAMES[int(p) // len(FIRST_NAMES)])
        for p in picks
    ]


def _sales(rng: np.random.Generator, n: int, *, archive: bool = False) -> _Table:
    regions = _sample(rng, REGIONS, _int(rng, 3, len(REGIONS)))
    reps = [
        (f"{first} {last}", _pick(rng, regions)) for first, last in _people(rng, _int(rng, 3, 7))
    ]
    products = _sample(rng, PRODUCTS, _int(rng, 4, len(PRODUCTS)))
    year = 2023 if archive else 2024
    days = np.sort(rng.integers(0, 365, size=n))
    first_id = _int(rng, 10000, 60000) if not archive else _int(rng, 1000, 9000)
    ids = first_id + np.cumsum(rng.integers(1, 4, size=n))
    rows = []
    for i in range(n):
        rep, region = _pick(rng, reps)
        product, base = _pick(rng, products)
        discount = _pick(rng, (0, 0, 0, 5, 10))
        price = base * (100 - discount) // 100
        units = _int(rng, 1, 12) if base > 10000 else _int(rng, 1, 60)
        date = dt.datetime(year, 1, 1) + dt.timedelta(days=int(days[i]))
        rows.append([f"SO-{int(ids[i])}", date, region, rep, product, units, _money(price)])
    formats = [None, _pick(rng, DATE_FORMATS), None, None, None, "0", _pick(rng, MONEY_FORMATS)]
    sheet = _pick(rng, ("Sales", "Orders", "Sales 2024"))
    headers = ["Order ID", "Date", "Region", "Rep", "Product", "Units", "Unit Price"]
    return _Table("sales", headers, rows, formats, 0, sheet, "order")


def _inventory(rng: np.random.Generator, n: int, *, archive: bool = False) -> _Table:
    categories = _sample(rng, tuple(CATEGORIES), _int(rng, 3, len(CATEGORIES)))
    numbers = rng.choice(90000, size=n, replace=False) + 10000
    rows = []
    for i in range(n):
        category = _pick(rng, categories)
        prefix, items = CATEGORIES[category]
        item = f"{_pick(rng, items)} {_pick(rng, VARIANTS)}"
        reorder = 5 * _int(rng, 2, 24)
        stock = 0 if rng.random() < 0.06 else _int(rng, 0, 3 * reorder)
        cost = _int(rng, 49, 4999)
        rows.append([f"{prefix}-{int(numbers[i])}", item, category, stock, reorder, _money(cost)])
    formats = [None, None, None, "0", "0", _pick(rng, MONEY_FORMATS)]
    sheet = _pick(rng, ("Inventory", "Stock", "Warehouse"))
    headers = ["SKU", "Item", "Category", "Stock", "Reorder Level", "Unit Cost"]
    return _Table("inventory", headers, rows, formats, 0, sheet, "item")


def _grades(rng: np.random.Generator, n: int, *, archive: bool = False) -> _Table:
    classes = sorted(_sample(rng, CLASSES, _int(rng, 2, 4)), key=CLASSES.index)
    rows = []
    for first, last in _people(rng, n):
        scores = np.clip(np.rint(rng.normal(70, 15, size=3)), 20, 100).astype(int)
        rows.append([f"{last}, {first}", _pick(rng, classes), *(int(s) for s in scores)])
    if not archive:
        rows.sort(key=lambda r: (CLASSES.index(r[1]), r[0].casefold()))  # a class list, by class
    formats = [None, None, "0", "0", "0"]
    sheet = _pick(rng, ("Grades", "Scores", "Term 1"))
    headers = ["Student", "Class", "Test 1", "Test 2", "Test 3"]
    return _Table("grades", headers, rows, formats, 0, sheet, "student")


_TABLES: dict[str, Callable[..., _Table]] = {
    "sales": _sales,
    "inventory": _inventory,
    "grades": _grades,
}

# -- workbooks -------------------------------------------------------------------------------

_FIXED_TIME = dt.datetime(2024, 1, 1)
_ZIP_TIME = (2024, 1, 1, 0, 0, 0)
_BOLD = Font(bold=True)


class _StableZip(zipfile.ZipFile):
    """A ZipFile whose entries carry a fixed timestamp, so equal workbooks give equal bytes."""

    def writestr(self, zinfo_or_arcname, data, compress_type=None, compresslevel=None):
        if not isinstance(zinfo_or_arcname, zipfile.ZipInfo):
            info = zipfile.ZipInfo(zinfo_or_arcname, date_time=_ZIP_TIME)
            info.compress_type = self.compression
            info.external_attr = 0o600 << 16
            zinfo_or_arcname = info
        super().writestr(zinfo_or_arcname, data, compress_type, compresslevel)

    def write(self, filename, arcname=None, compress_type=None, compresslevel=None):
        with open(filename, "rb") as handle:
            data = handle.read()
        self.writestr(arcname or os.path.basename(filename), data, compress_type, compresslevel)


def workbook_bytes(wb: Workbook) -> bytes:
    """``wb`` as xlsx bytes, deterministic: fixed document times and zip entry times."""
    wb.properties.created = _FIXED_TIME
    wb.properties.modified = _FIXED_TIME
    wb.properties.creator = "benchmax-gym"
    wb.properties.lastModifiedBy = "benchmax-gym"
    buffer = io.BytesIO()
    archive = _StableZip(buffer, "w", zipfile.ZIP_DEFLATED, allowZip64=True)
    ExcelWriter(wb, archive).save()  # writes every part and closes the archive
    return buffer.getvalue()


def _write_rows(
    ws,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    formats: Sequence[str | None],
    start_row: int = 1,
    start_col: int = 1,
) -> None:
    for j, header in enumerate(headers):
        cell = ws.cell(row=start_row, column=start_col + j, value=header)
        cell.font = _BOLD
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            cell = ws.cell(row=start_row + 1 + i, column=start_col + j, value=value)
            if formats[j] and value is not None:
                cell.number_format = formats[j]


def _header(ws, cell: str, text: str, width: float | None = None) -> None:
    ws[cell] = text
    ws[cell].font = _BOLD
    if width:
        ws.column_dimensions[re.sub(r"\d", "", cell)].width = width


class _Book:
    """The input workbook: the main table on its sheet, maybe distractor sheets."""

    def __init__(self, rng: np.random.Generator, table: _Table, multi_sheet: bool, task_type: str):
        self.table = table
        self.multi_sheet = multi_sheet
        self.wb = Workbook()
        ws = self.wb.active
        if not multi_sheet and rng.random() < 0.3:
            table.sheet = "Sheet1"
        ws.title = table.sheet
        _write_rows(ws, table.headers, table.rows, table.formats)
        for j, header in enumerate(table.headers):
            width = max(len(header), *(len(str(r[j])) for r in table.rows[:20])) + 2
            ws.column_dimensions[_col(j)].width = min(max(width, 9), 24)
        ws.freeze_panes = "A2"
        self.ws = ws
        if multi_sheet:
            want = 1 if task_type == "filter" else int(rng.random() < 0.5)
            if want:
                for kind in _sample(rng, ("notes", "archive"), _int(rng, want, 2)):
                    self._distractor(rng, kind)
                # filter tasks always read a table that is not on the first sheet
                position = _int(rng, 1 if task_type == "filter" else 0, len(self.wb.sheetnames) - 1)
                self.wb.move_sheet(ws, offset=position - self.wb.sheetnames.index(ws.title))
                self.wb.active = 0

    def _distractor(self, rng: np.random.Generator, kind: str) -> None:
        t = self.table
        if kind == "notes":
            ws = self.wb.create_sheet(_pick(rng, ("Notes", "Read Me", "Info")), index=0)
            lines = {
                "sales": (
                    "Sales export",
                    "Prices are per unit, in USD, after discount.",
                    "Rows are added by the order system; do not edit Order IDs.",
                ),
                "inventory": (
                    "Warehouse stock list",
                    "Unit Cost is the last purchase price.",
                    "Stock is counted at the end of each week.",
                ),
                "grades": (
                    "Term results",
                    "Tests are marked out of 100.",
                    "Students who miss a test are re-tested before results are entered.",
                ),
            }[t.kind]
            for i, line in enumerate(lines):
                ws.cell(row=i + 1, column=1, value=line)
            ws["A1"].font = _BOLD
            ws.column_dimensions["A"].width = 60
        else:
            old = _TABLES[t.kind](rng, _int(rng, 3, 6), archive=True)
            name = {"sales": "Sales 2023", "inventory": "Old Stock", "grades": "Last Term"}[t.kind]
            ws = self.wb.create_sheet(name)
            _write_rows(ws, old.headers, old.rows, old.formats)

