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
from onceflow.verify.faulting import RoundRecord

_COLORS = {
    "kill_random": "#d62728", "crash_before_sink_write": "#ff7f0e",
    "crash_inside_sink_txn": "#bcbd22", "crash_after_sink_commit": "#9467bd",
    "crash_after_commit_log": "#8c564b", "crash_apply_pending": "#2ca02c",
    "ambiguous_commit": "#e377c2",
    "trigger_change": "#17becf", "executor_kill": "#7f7f7f",
    "executor_kill_mid_write": "#525252",
    "receiver_kill": "#1f77b4", "receiver_crash_after_stage": "#aec7e8",
    "receiver_crash_after_record": "#98df8a", "receiver_crash_after_publish": "#ffbb78",
    "sender_kill": "#c49c94", "verify_kill": "#393b79", "sink_outage": "#637939",
}


def to_json(result: VerifyResult) -> dict[str, Any]:
    """The whole result as JSON-ready data."""
    return {
        "ok": result.ok,
        "status": result.status,
        "counted_rounds": result.counted(),
        "inconclusive": result.inconclusive,
        "weak_proof": result.weak(),
        "config": result.config,
        "input_rows": result.input_rows,
        "wall_seconds": round(result.wall_s, 1),
        "final_exit_code": result.final_exit_code,
        "faults_by_kind": result.faults_by_kind(),
        "tested_by_kind": result.tested_by_kind(),
        "untested_faults": result.untested(),
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
    faults.add_column("with data at risk", justify="right")
    tested = result.tested_by_kind()
    for kind, n in sorted(result.faults_by_kind().items()):
        faults.add_row(kind, str(n), str(tested[kind]) if tested[kind] else "[yellow]0[/yellow]")
    console.print(faults)
    untested = result.untested()
    if untested:
        console.print(f"[yellow]NOT TESTED[/yellow] {', '.join(untested)}: no round of these faults hit a "
                      "batch with input rows (more rounds or more events per round test them)")
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
    weak = result.weak()
    if weak:
        console.print(f"[yellow]WEAK PROOF[/yellow] {weak}")
    if result.inconclusive:
        console.print(f"[yellow]INCONCLUSIVE[/yellow] {result.uncounted()}")
    status = {"OK": "[green]OK: nothing lost, nothing duplicated[/green]", "FAILED": "[red]FAILED[/red]",
              "INCONCLUSIVE": "[yellow]INCONCLUSIVE: nothing lost or duplicated in the rounds that counted, "
                              "too few counted[/yellow]"}[result.status]
    console.print(f"{status} — {len(result.rounds)} rounds, {result.input_rows:,} input rows, "
                  f"{result.wall_s:.0f} s")


def _flag(n: int) -> str:
    return "0" if n == 0 else f"[red]{n}[/red]"


STARTUP_PX = 70
"""Width of the start-up span (verify's start to the first committed batch, or to just before
the first fault when that comes first) on the timeline."""


def first_batch_s(result: VerifyResult) -> float:
    """Seconds from the run's start to its first committed batch (0: no marker time known)."""
    times = [b["committed_ms"] for b in result.batches if b.get("committed_ms")]
    return max(0.0, (min(times) - result.started_epoch_ms) / 1000.0) if times else 0.0


def _svg_timeline(result: VerifyResult) -> str:
    """Rounds, faults and committed batches over time; start-up drawn as one narrow span."""
    width, height, left, top = 900, 260, 60, 20
    end = max([r.ended_s for r in result.rounds] + [result.final_drain_s[1], 1.0])
    faults = [r.fault_s for r in result.rounds if r.fault_s is not None]
    first = min(first_batch_s(result), end * 0.99)
    if faults and min(faults) < first:  # a fault in the first batch: the span ends before it
        first = max(min(faults) - 0.5, 0.0)
    lead = STARTUP_PX if first > 0 else 0

    def x(seconds: float) -> float:
        if seconds < first:
            return left + lead * seconds / first
        return left + lead + (width - left - 20 - lead) * (seconds - first) / (end - first)

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
    if lead:
        parts.append(f'<rect x="{left}" y="{top + 30}" width="{lead - 2}" height="{height - 100}" '
                     f'fill="#eee"><title>start-up: {first:.0f} s to the first batch</title></rect>'
                     f'<text x="{left + 4}" y="{top + 46}">start-up</text>'
                     f'<text x="{left + 4}" y="{top + 60}">{first:.0f} s</text>')
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
                 + (f'<text x="{left + lead}" y="{height - 24}">{first:.0f} s</text>' if lead else "")
                 + f'<text x="{width - 60}" y="{height - 24}">{end:.0f} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def _risk(r: RoundRecord) -> str:
    """A round's "at risk" cell: the batches its fault hit and their input rows."""
    if r.rows_at_risk is None:
        return "n/a"
    hit = ", ".join(str(b) for b in r.fault_batches) or "none"
    return f"{r.rows_at_risk:,} rows (batch {hit})" if r.rows_at_risk else f"nothing (batch {hit})"


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
    legend = "".join(f'<span class=key style="background:{c}">{k}</span>'
                     for k, c in _COLORS.items() if k in result.faults_by_kind())
    legend += '<span class=key style="background:#2ca02c">final drain</span>'
    legend += " &nbsp; vertical lines: the moment each fault hit; blue: batches committed"
    rows = "".join(
        f'<tr{"" if r.tested else " class=untested"}><td>{r.round}</td><td>{html.escape(r.fault)}</td>'
        f"<td>{_risk(r)}</td><td>{html.escape(r.outcome)}</td>"
        f"<td>{r.exit_code}</td><td>{r.markers_before}&rarr;{r.markers_after}</td></tr>"
        for r in result.rounds
    )
    tested = result.tested_by_kind()
    faults = "".join(
        f'<tr{"" if tested[k] else " class=untested"}><td>{html.escape(k)}</td><td>{n}</td>'
        f"<td>{tested[k]}</td></tr>"
        for k, n in sorted(result.faults_by_kind().items()))
    tables = "".join(
        f'<tr class="{"bad" if d.lost_events or d.duplicated_events or d.extra_rows else "good"}">'
        f"<td>{html.escape(name)}</td><td>{d.expected_rows}</td><td>{d.actual_rows}</td>"
        f"<td>{d.lost_events}</td><td>{d.duplicated_events + d.extra_rows}</td></tr>"
        for name, d in v.tables.items())
    tables += (f'<tr class="{"bad" if v.late_mismatches else "good"}"><td>late drops</td>'
               f"<td>{v.late_expected}</td><td>{v.late_recorded}</td><td>{len(v.late_mismatches)}</td>"
               "<td></td></tr>")
    violations = "".join(f"<li>{html.escape(x)}</li>" for x in v.violations) or "<li>none</li>"
    untested = (f"<p class=untested>Not tested: {html.escape(', '.join(result.untested()))} (no round of "
                "these faults hit a batch with input rows).</p>" if result.untested() else "")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>onceflow verify</title>
<style>body{{font-family:sans-serif;margin:24px}} .c{{display:inline-block;width:150px;
text-align:center;padding:10px;margin:4px;border-radius:6px;font-size:14px}} .c b{{font-size:28px}}
.good{{background:#d8f3dc}} .bad{{background:#ffccd5}} td,th{{padding:2px 8px;text-align:left}}
.untested{{background:#fff3bf}} .key{{display:inline-block;opacity:.6;padding:2px 6px;margin:2px}}</style>
</head><body><h1>onceflow verify: {result.status}</h1>
<p>{len(result.rounds)} rounds, {result.input_rows:,} input rows, sink {html.escape(v.sink)},
seed {result.config["seed"]}, {result.wall_s:.0f} s.</p>{counters}
<h2>Tables</h2><table id="tables"><tr><th>table</th><th>rows expected</th><th>rows found</th>
<th>lost</th><th>duplicated</th></tr>{tables}</table>
<h2>Timeline</h2><p>{legend}</p>{_svg_timeline(result)}
<h2>Violations</h2><ul>{violations}</ul>
<h2>Faults</h2><table id="faults"><tr><th>fault</th><th>rounds</th><th>with data at risk</th></tr>
{faults}</table>
{untested}
<h2>Rounds</h2><table id="rounds"><tr><th>#</th><th>fault</th><th>at risk</th><th>outcome</th><th>exit</th>
<th>markers</th></tr>
{rows}</table></body></html>"""
    hpath = directory / "report.html"
    hpath.write_text(page)
    return jpath, hpath
