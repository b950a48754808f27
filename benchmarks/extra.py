"""Additional measured figures, rendered by the report as tables when present.

Anything that measures something the workload runs do not (e.g. a CLI reading one key from a
checkpoint) writes one JSON file per table into ``benchmarks/.work/extra/`` and the next
``python3 -m benchmarks`` / ``--report-only`` shows it under "Additional measurements"::

    from benchmarks import extra
    extra.save("get_latency", title="keyedstate get latency", columns=["provider", "p50 µs", "p99 µs"],
               rows=[["keyedstate", 41.0, 95.5]], description="one key read from a stopped checkpoint",
               command="python3 -m ...", contended=False)

File format (every key but ``title``, ``columns`` and ``rows`` optional)::

    {"title": str, "description": str, "command": str, "started_at": ISO time, "commit": str,
     "contended": bool, "columns": [str, ...], "rows": [[cell, ...] | {column: cell}, ...],
     "notes": [str, ...]}

Cells may be numbers, strings, booleans or null. A run that was contended (other processes used
the CPUs) should say so with ``contended: true``; the report flags it.
"""
from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .fmt import fmt_value, table

EXTRA_DIR = Path(__file__).resolve().parent / ".work" / "extra"


def save(name: str, title: str, columns: list[str], rows: list[list[Any] | dict[str, Any]], *,
         description: str = "", command: str | None = None, notes: list[str] | None = None,
         contended: bool | None = None, commit: str | None = None, directory: Path = EXTRA_DIR) -> Path:
    """Write one table to ``<directory>/<name>.json`` (replacing an earlier one of that name)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"extra table name {name!r}: letters, digits, '_', '-', '.' only")
    data = {"title": title, "description": description, "command": command,
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
            "contended": contended, "columns": columns, "rows": rows, "notes": notes or []}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)
    return path


def _cells(columns: list[str], row) -> list[str]:
    values = [row.get(c) for c in columns] if isinstance(row, dict) else list(row)
    values += [None] * (len(columns) - len(values))
    return [fmt_value(v) for v in values[:len(columns)]]


def section(source: Path | None = EXTRA_DIR) -> list[str]:
    """Markdown for every table in ``source`` (a directory of JSON files, or one file)."""
    if source is None or not source.exists():
        return []
    files = sorted(source.glob("*.json")) if source.is_dir() else [source]
    out: list[str] = []
    for path in files:
        try:
            data = json.loads(path.read_text())
            columns, rows = list(data["columns"]), list(data["rows"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"report: ignoring {path}: {exc}", file=sys.stderr)
            continue
        flag = " ⚠ contended" if data.get("contended") else ""
        out += [f"### {data.get('title') or path.stem}{flag}", ""]
        if data.get("description"):
            out += [data["description"], ""]
        meta = [f"{k} `{data[k]}`" for k in ("command", "commit") if data.get(k)]
        if data.get("started_at"):
            meta.append(f"measured {data['started_at']}")
        meta.append(f"from `{path.name}`")
        out += ["- " + "; ".join(meta), ""]
        out += table(columns, [_cells(columns, r) for r in rows]) + [""]
        out += [f"- {n}" for n in data.get("notes") or []]
        if data.get("notes"):
            out.append("")
    if out:
        out = ["## Additional measurements", "",
               f"Tables written by other measurements into `{_display(source)}` (see `benchmarks/extra.py`); "
               "each from its own run, as its line says.", ""] + out
    return out


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        return str(path)
