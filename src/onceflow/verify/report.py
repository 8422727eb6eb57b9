"""Reports of ``onceflow verify``: JSON, a rich table, and an HTML page with a timeline plot."""

from __future__ import annotations

import html
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from onceflow.verify.chaos import VerifyResult

_COLORS = {
    "kill_random": "#d62728", "crash_before_sink_write": "#ff7f0e",
    "crash_inside_sink_txn": "#bcbd22", "crash_after_sink_commit": "#9467bd",
    "crash_after_commit_log": "#8c564b", "crash_apply_pending": "#2ca02c",
    "ambiguous_commit": "#e377c2",
    "trigger_change": "#17becf", "executor_kill": "#7f7f7f",
    "receiver_kill": "#1f77b4", "receiver_crash_after_stage": "#aec7e8",
    "receiver_crash_after_record": "#98df8a", "receiver_crash_after_publish": "#ffbb78",
    "sender_kill": "#c49c94", "verify_kill": "#393b79",
}


def to_json(result: VerifyResult) -> dict[str, Any]:
    """The whole result as JSON-ready data."""
    return {
        "ok": result.ok,
        "config": result.config,
        "input_rows": result.input_rows,
        "wall_seconds": round(result.wall_s, 1),
        "final_exit_code": result.final_exit_code,
        "faults_by_kind": result.faults_by_kind(),
        "verdict": result.verdict.to_json(),
        "rounds": [asdict(r) for r in result.rounds],
        "batches": result.batches,
        "ingest": result.ingest,
    }


def print_summary(result: VerifyResult, console: Console | None = None) -> None:
    """Print the human summary: faults by kind and the per-table verdict."""
    console = console or Console()
    faults = Table(title="faults injected")
    faults.add_column("fault")
    faults.add_column("rounds", justify="right")
    for kind, n in sorted(result.faults_by_kind().items()):
        faults.add_row(kind, str(n))
    console.print(faults)
    v = result.verdict
    table = Table(title=f"verdict for {v.sink}")
    for col in ("table", "rows expected", "rows found", "lost", "duplicated"):
        table.add_column(col, justify="left" if col == "table" else "right")
    for name, d in v.tables.items():
        table.add_row(name, str(d.expected_rows), str(d.actual_rows),
                      _flag(d.lost_events), _flag(d.duplicated_events + d.extra_rows))
    table.add_row("late drops", str(v.late_expected), str(v.late_recorded),
                  _flag(len(v.late_mismatches)), "")
    if result.ingest is not None:
        i = result.ingest
        table.add_row("ingest: event ids in the log", str(i["ids_sent"]), str(i["rows_in_log"]),
                      _flag(i["lost"]), _flag(i["duplicated"] + i["unexpected"]))
    console.print(table)
    for line in v.violations:
        console.print(f"[red]VIOLATION[/red] {line}")
    if result.final_exit_code != 0:
        console.print(f"[red]VIOLATION[/red] final drain exited with {result.final_exit_code}")
    status = "[green]OK: nothing lost, nothing duplicated[/green]" if result.ok else "[red]FAILED[/red]"
    console.print(f"{status} — {len(result.rounds)} rounds, {result.input_rows:,} input rows, "
                  f"{result.wall_s:.0f} s")


def _flag(n: int) -> str:
    return "0" if n == 0 else f"[red]{n}[/red]"


def _svg_timeline(result: VerifyResult) -> str:
    width, height, left, top = 900, 260, 60, 20
    end = max([r.ended_s for r in result.rounds] + [result.final_drain_s[1], 1.0])

    def x(seconds: float) -> float:
        return left + (width - left - 20) * seconds / end

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="11">']
    for r in result.rounds:
        color = _COLORS.get(r.fault, "#999")
        w = max(x(r.ended_s) - x(r.started_s), 1)
        parts.append(f'<rect x="{x(r.started_s):.1f}" y="{top}" width="{w:.1f}" '
                     f'height="24" fill="{color}" opacity="0.35"><title>round {r.round}: '
                     f'{html.escape(r.fault)} — {html.escape(r.outcome)}</title></rect>')
        if r.fault_s is not None:
            parts.append(f'<line x1="{x(r.fault_s):.1f}" x2="{x(r.fault_s):.1f}" y1="{top}" '
                         f'y2="{height - 40}" stroke="{color}" stroke-width="2"/>')
    d0, d1 = result.final_drain_s
    if d1 > d0:
        parts.append(f'<rect x="{x(d0):.1f}" y="{top}" width="{max(x(d1) - x(d0), 1):.1f}" height="24" '
                     'fill="#2ca02c" opacity="0.35"><title>final drain (--once)</title></rect>')
    parts.append(f'<text x="4" y="{top + 16}">rounds</text>')
    # committed batches over time (from the sink's marker timestamps)
    n = len(result.batches)
    if n and result.batches[0].get("committed_ms"):
        base_y, span = height - 40, height - 40 - (top + 40)
        pts = []
        for i, b in enumerate(result.batches):
            s = (b["committed_ms"] - result.started_epoch_ms) / 1000.0
            pts.append(f"{x(min(s, end)):.1f},{base_y - span * (i + 1) / n:.1f}")
        parts.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
        parts.append(f'<text x="4" y="{top + 60}">batches</text><text x="4" y="{top + 74}">committed</text>')
    parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{height - 40}" y2="{height - 40}" stroke="#333"/>')
    parts.append(f'<text x="{left}" y="{height - 24}">0 s</text>'
                 f'<text x="{width - 60}" y="{height - 24}">{end:.0f} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_reports(result: VerifyResult, directory: Path) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.html`` into ``directory``.

    Returns:
        The two paths.
    """
    directory.mkdir(parents=True, exist_ok=True)
    jpath = directory / "report.json"
    jpath.write_text(json.dumps(to_json(result), indent=2, default=str))
    v = result.verdict
    counters = "".join(
        f'<div class="c {"bad" if val else "good"}"><b>{val}</b><br>{label}</div>'
        for label, val in (("lost", v.lost), ("duplicated", v.duplicated),
                           ("late mismatches", len(v.late_mismatches)),
                           ("missing markers", len(v.missing_markers)))
    )
    legend = "".join(f'<span style="background:{c};opacity:.6;padding:2px 6px;margin:2px">{k}</span>'
                     for k, c in _COLORS.items() if k in result.faults_by_kind())
    legend += '<span style="background:#2ca02c;opacity:.6;padding:2px 6px;margin:2px">final drain</span>'
    legend += " &nbsp; vertical lines: the moment each fault hit; blue: batches committed"
    rows = "".join(
        f"<tr><td>{r.round}</td><td>{html.escape(r.fault)}</td><td>{html.escape(r.outcome)}</td>"
        f"<td>{r.exit_code}</td><td>{r.markers_before}&rarr;{r.markers_after}</td></tr>"
        for r in result.rounds
    )
    violations = "".join(f"<li>{html.escape(x)}</li>" for x in v.violations) or "<li>none</li>"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>onceflow verify</title>
<style>body{{font-family:sans-serif;margin:24px}} .c{{display:inline-block;width:150px;
text-align:center;padding:10px;margin:4px;border-radius:6px;font-size:14px}} .c b{{font-size:28px}}
.good{{background:#d8f3dc}} .bad{{background:#ffccd5}} td,th{{padding:2px 8px;text-align:left}}</style>
</head><body><h1>onceflow verify: {"OK" if result.ok else "FAILED"}</h1>
<p>{len(result.rounds)} rounds, {result.input_rows:,} input rows, sink {html.escape(v.sink)},
seed {result.config["seed"]}, {result.wall_s:.0f} s.</p>{counters}
<h2>Timeline</h2><p>{legend}</p>{_svg_timeline(result)}
<h2>Violations</h2><ul>{violations}</ul>
<h2>Rounds</h2><table><tr><th>#</th><th>fault</th><th>outcome</th><th>exit</th><th>markers</th></tr>
{rows}</table></body></html>"""
    hpath = directory / "report.html"
    hpath.write_text(page)
    return jpath, hpath
