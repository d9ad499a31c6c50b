"""SpreadsheetBench tasks: its prompt form, and a loader for its directory layout, an archive of
it, or that archive's URL (downloaded and extracted through :mod:`benchmax_gym.core.cache`).

Every Excel task has the same shape, whatever its source (generated or SpreadsheetBench)::

    Task(id, prompt,
         answer={"workbook": <answer xlsx>, "position": <answer position>},
         solution=<the same dict>,
         metadata={...},
         files={"workbook.xlsx": <input xlsx>})

where an xlsx is ``bytes`` (generated) or a ``str`` path (SpreadsheetBench). The prompt is the
instruction followed by SpreadsheetBench's fields (``Instruction type``, ``Answer position`` and,
for sheet-level tasks, ``Answer sheet`` and ``Data position``); the environment adds a preview
of the workbook itself, so prompts never describe its contents.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from benchmax_gym.core.cache import cache_root, extract_cached, extract_download
from benchmax_gym.core.checks import arg, optional, path, positive_int
from benchmax_gym.core.sources import SourceConfig
from benchmax_gym.core.tasks import ListTasks, Task

CELL_LEVEL = "Cell-Level Manipulation"
SHEET_LEVEL = "Sheet-Level Manipulation"


def spreadsheetbench_prompt(
    instruction: str,
    instruction_type: str,
    answer_position: str,
    answer_sheet: str | None = None,
    data_position: str | None = None,
) -> str:
    """The task text in SpreadsheetBench's style: the instruction, then its fields."""
    lines = [
        str(instruction).strip(),
        "",
        f"Instruction type: {instruction_type}",
        f"Answer position: {answer_position}",
    ]
    if answer_sheet:
        lines.append(f"Answer sheet: {answer_sheet}")
    if data_position:
        lines.append(f"Data position: {data_position}")
    return "\n".join(lines)


def excel_task(
    task_id: str,
    prompt: str,
    workbook: bytes | str,
    answer_workbook: bytes | str,
    position: str,
    metadata: dict[str, Any],
) -> Task:
    """A task in the shape every Excel source gives (see the module docstring)."""
    answer = {"workbook": answer_workbook, "position": position}
    return Task(
        id=task_id,
        prompt=prompt,
        answer=answer,
        solution=dict(answer),
        metadata=metadata,
        files={"workbook.xlsx": workbook},
    )


# (input, answer) file-name parts: v0.1 releases use input/answer with 3 cases, the verified
# release init/golden with one.
_CASE_NAMES = (("input", "answer"), ("init", "golden"))


def spreadsheetbench_tasks(
    path: str | os.PathLike,
    *,
    limit: int | None = None,
    ids: Iterable[int | str] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> ListTasks:
    """SpreadsheetBench: every test case of every record is one task (``sb-<id>-<case>``).

    Args:
        path: a directory in the original layout (``dataset.json`` and
            ``spreadsheet/<id>/<case>_<id>_{input,answer}.xlsx``; the directory holding
            ``dataset.json`` may also be one level down), a ``.tar.gz``/``.tgz``/``.tar``/``.zip``
            archive of it, or an http(s) URL of such an archive (downloaded once into the cache).
        limit: keep the first ``limit`` records (spreadsheets), each with all its cases.
        ids: keep only these record ids (ints or strings; compared as strings).
        cache_dir: where downloads and extracted archives go; default
            ``$BENCHMAX_GYM_CACHE/spreadsheetbench`` or ``~/.cache/benchmax-gym/spreadsheetbench``.

    Workbooks are referenced by path (nothing is read at load time). Missing cases are skipped
    (some releases have one case per record); a record with no input workbook, or a case with
    no answer workbook, raises :class:`FileNotFoundError` naming the file.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}")
    wanted = None
    if ids is not None:
        if isinstance(ids, (str, int)):
            ids = [ids]
        wanted = [str(i) for i in ids]
        if not wanted:
            raise ValueError("ids must not be empty")
    root = spreadsheetbench_dir(path, cache_dir=cache_dir)
    records = _read_records(root / "dataset.json")
    if wanted is not None:
        known = {str(r.get("id")) for r in records}
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise ValueError(f"ids not in {root / 'dataset.json'}: {unknown}")
        keep = set(wanted)
        records = [r for r in records if str(r.get("id")) in keep]
    if limit is not None:
        records = records[:limit]
    tasks = []
    for record in records:
        tasks.extend(_record_tasks(root, record))
    if not tasks:
        raise ValueError(f"no SpreadsheetBench tasks in {root}")
    return ListTasks(tasks)


def spreadsheetbench_dir(
    path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None
) -> Path:
    """The local directory holding ``dataset.json`` for a directory, an archive or a URL."""
    text = os.fspath(path)
    if isinstance(text, str) and text.lower().startswith(("http://", "https://")):
        root = _cache(cache_dir)
        return find_dataset_dir(extract_download(text, root, fallback_name="spreadsheetbench.tar.gz"))
    local = Path(text).expanduser()
    if not local.exists():
        raise FileNotFoundError(f"SpreadsheetBench path {text!r} does not exist")
    if local.is_dir():
        return find_dataset_dir(local)
    return find_dataset_dir(extract_cached(local, _cache(cache_dir)))


def _cache(cache_dir: str | os.PathLike | None) -> Path:
    """Where downloads and extractions go: ``cache_dir`` itself when given (no subfolder),
    else the shared cache's ``spreadsheetbench`` folder."""
    return Path(cache_dir).expanduser() if cache_dir is not None else cache_root("spreadsheetbench")


def find_dataset_dir(root: str | os.PathLike) -> Path:
    """The shallowest directory under ``root`` (itself included) that holds ``dataset.json``."""
    root = Path(root)
    if (root / "dataset.json").is_file():
        return root
    found = sorted(
        (len(p.relative_to(root).parts), str(p))
        for p in root.rglob("dataset.json")
        if p.is_file() and "__MACOSX" not in p.parts
    )
    if not found:
        raise FileNotFoundError(
            f"no dataset.json found in {root} (expected SpreadsheetBench's layout)"
        )
    return Path(found[0][1]).parent


def _read_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]  # JSON Lines
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{path}: expected a JSON array of records")
    return data


def _record_tasks(root: Path, record: dict[str, Any]) -> list[Task]:
    missing = [f for f in ("id", "instruction", "answer_position") if f not in record]
    if missing:
        raise ValueError(
            f"SpreadsheetBench record {record.get('id')!r} has no field "
            f"{', '.join(map(repr, missing))}"
        )
    sid = str(record["id"])
    folder = (root / str(record.get("spreadsheet_path") or f"spreadsheet/{sid}")).resolve()
    if os.path.commonpath([root.resolve(), folder]) != str(root.resolve()):
        raise ValueError(f"SpreadsheetBench record {sid!r}: spreadsheet_path points outside {root}")
    cases = _cases(folder, sid)
    instruction_type = str(record.get("instruction_type") or CELL_LEVEL)
    position = str(record["answer_position"])
    extra = {
        k: str(record[k])
        for k in ("answer_sheet", "data_position")
        if record.get(k) not in (None, "")
    }
    prompt = spreadsheetbench_prompt(
        str(record["instruction"]),
        instruction_type,
        position,
        extra.get("answer_sheet"),
        extra.get("data_position"),
    )
    return [
        excel_task(
            f"sb-{sid}-{case}",
            prompt,
            str(input_path),
            str(answer_path),
            position,
            {
                "source": "spreadsheetbench",
                "spreadsheet_id": sid,
                "case": case,
                "instruction_type": instruction_type,
                "answer_position": position,
                **extra,
            },
        )
        for case, (input_path, answer_path) in cases
    ]


def _cases(folder: Path, sid: str) -> list[tuple[int, tuple[Path, Path]]]:
    """``[(case, (input, answer)), ...]`` for the cases present in ``folder``."""
    expected = folder / f"1_{sid}_input.xlsx"
    if not folder.is_dir():
        raise FileNotFoundError(
            f"SpreadsheetBench record {sid!r}: missing {expected} (no folder {folder})"
        )
    names = set(os.listdir(folder))
    found: dict[int, tuple[Path, Path]] = {}
    for inp, ans in _CASE_NAMES:
        pattern = re.compile(rf"(\d+)_{re.escape(sid)}_{inp}\.xlsx")
        for name in sorted(names):
            match = pattern.fullmatch(name)
            if match and int(match.group(1)) not in found:
                case = int(match.group(1))
                answer = folder / f"{case}_{sid}_{ans}.xlsx"
                if not answer.is_file():
                    raise FileNotFoundError(
                        f"SpreadsheetBench record {sid!r}, case {case}: missing {answer}"
                    )
                found[case] = (folder / name, answer)
    if not found and "initial.xlsx" in names:  # a verified-release layout without prefixes
        answer = folder / "golden.xlsx"
        if not answer.is_file():
            raise FileNotFoundError(f"SpreadsheetBench record {sid!r}: missing {answer}")
        found[1] = (folder / "initial.xlsx", answer)
    if not found:
        raise FileNotFoundError(f"SpreadsheetBench record {sid!r}: missing {expected}")
    return sorted(found.items())


@dataclass(frozen=True)
class SpreadsheetBench(SourceConfig):
    """``tasks="spreadsheetbench"``: a directory in the original layout, an archive or its URL."""

    name = "spreadsheetbench"
    dataset: str = arg(MISSING, path)
    limit: int | None = arg(None, optional(positive_int))
    ids: Any = None  # keep only these record ids
    cache_dir: str | None = arg(None, optional(path))

    def build(self, env: Any) -> ListTasks:
        return spreadsheetbench_tasks(self.dataset, limit=self.limit, ids=self.ids, cache_dir=self.cache_dir)
