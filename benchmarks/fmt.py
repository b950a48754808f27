"""Formatting helpers shared by the report, the rescale benchmark and extra measurement tables.

Imports nothing from the other benchmark modules, so every module can import it.
"""
from __future__ import annotations

CONTENDED_SHARE = 0.10
"""Share of all CPUs other processes may use during (or just before) a run before it is flagged."""


def fmt_ms(v) -> str:
    return "–" if v is None else f"{v:,.0f}"


def fmt_s(v, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def fmt_bytes(v) -> str:
    if v is None:
        return "–"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= size:
            return f"{v / size:,.1f} {unit}" if v < 100 * size else f"{v / size:,.0f} {unit}"
    return f"{v:,.0f} B"


def fmt_rows(v) -> str:
    if v is None:
        return "–"
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if v >= size:
            return f"{v / size:g}{unit}"
    return str(v)


def fmt_load_plan(plan: dict | None) -> str:
    """'v13: snapshot v10 + 3 changelogs' from ``workloads.checkpoint_versions()`` (ranges over the
    store partitions when they differ)."""
    if not plan or not plan.get("stores"):
        return "–"

    def span(lo, hi):
        return f"{lo}" if lo == hi else f"{lo}–{hi}"
    lo, hi = plan["newest_snapshot_min"], plan["newest_snapshot_max"]
    snap = "no snapshot" if hi == 0 else f"snapshot v{span(lo, hi)}"
    if hi and plan.get("stores_without_snapshot"):
        snap += f" ({plan['stores_without_snapshot']}/{plan['stores']} stores none)"
    return f"v{plan['latest_version']}: {snap} + {span(plan['replay_min'], plan['replay_max'])} changelogs"


def fmt_value(v) -> str:
    """A cell of a generic table: numbers with separators, None as a dash, anything else as text."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        a = abs(v)
        return f"{v:,.0f}" if a >= 100 else f"{v:,.2f}" if a >= 1 else f"{v:.3g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def ratio_value(a, b) -> float | None:
    return None if not a or not b else a / b


def ratio(a, b) -> str:
    r = ratio_value(a, b)
    return "–" if r is None else f"{r:.2f}×"


def contended(result: dict) -> bool:
    """Other processes used >10% of the CPUs during a phase of the run or just before it."""
    shares = (result.get("other_cpu_share") or {}).values()
    return max(shares, default=0) > CONTENDED_SHARE or (result.get("busy_cpu_share_before") or 0) > CONTENDED_SHARE


def verdict(value: float | None, bound: float | None, higher_is_better: bool = False) -> str:
    """'met' / '**missed** (...)' for a ratio against its target; '' when there is no target."""
    if bound is None:
        return ""
    if value is None:
        return "**not measured**"
    if higher_is_better:
        return "met" if value >= bound else f"**missed**: {value:.2f}× < {bound:.1f}×"
    return "met" if value <= bound else f"**missed** by {(value / bound - 1) * 100:,.0f}%"


def target_text(bound: float | None, higher_is_better: bool = False) -> str:
    if bound is None:
        return "–"
    return f"≥ {bound:.1f}×" if higher_is_better else f"≤ {bound:.1f}×"


def table(columns: list[str], rows: list[list], align: list[str] | None = None) -> list[str]:
    """A Markdown table; ``align`` per column 'l' or 'r' (default: first left, the rest right)."""
    align = (align or ["l"]) + ["r"] * len(columns)
    out = ["| " + " | ".join(columns) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align[:len(columns)]) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out
