"""Rendering: live leg lines, check tables, the ledger table, JSON.

One place decides how things look, so every listing command has the same
table style and the same `--json` shape.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from launcher.checks.evidence import Check

PIPED_WIDTH = 160


def terminal_width(fd: int = 1) -> int:
    """The columns every line is wrapped within: `COLUMNS`, else the width of the terminal on `fd`
    (shutil.get_terminal_size's rule, for stderr's console too); piped output (CI logs, `| less`)
    with neither gets a wide page of 160 instead of rich's 80. Nothing is cut at that width:
    `--json` has the same text whole."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(fd).columns or PIPED_WIDTH
    except OSError:
        return PIPED_WIDTH


console = Console(highlight=False, width=terminal_width(1))
err_console = Console(stderr=True, highlight=False, width=terminal_width(2))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def print_checks(out: Console, title: str, checks: list[Check], verbose: bool = True) -> None:
    """Every check with its evidence (verbose), or one line for the passes and each failure in full."""
    if not verbose:
        passed = sum(c.ok for c in checks)
        out.print(f"{title}: {passed} of {len(checks)} checks PASS" + ("" if passed == len(checks) else ":"))
        for check in checks:
            if not check.ok:
                where = "".join(f" (leg {p.leg} line {p.line})" for p in check.evidence[:1])
                print_wrapped(out, "  [red]FAIL[/red] ", f"{check.name}: {check.detail}{where}")
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("check", overflow="fold")
    table.add_column("result", overflow="fold")
    table.add_column("evidence", overflow="fold")
    for check in checks:
        mark = "[green]PASS[/green]" if check.ok else "[red]FAIL[/red]"
        where = "".join(f"\n  leg {p.leg} line {p.line}" for p in check.evidence[:2])
        table.add_row(escape(check.name), mark, escape(check.detail) + where)
    out.print(table)


def print_wrapped(out: Console, head: str, text: str, indent: int = 4) -> None:
    """`head` (markup, such as a red FAIL) and plain `text`, wrapped at the console's width with a
    hanging indent: every word kept (a word longer than the width is broken, never cut), each of
    the text's own lines started on a line of its own."""
    plain_head = Text.from_markup(head).plain
    width, pad = max(out.width, indent + 20), " " * indent
    lines: list[str] = []
    for n, paragraph in enumerate(text.split("\n")):
        start = plain_head if n == 0 else pad
        lines += textwrap.wrap(start + paragraph, width, subsequent_indent=pad, break_on_hyphens=False) or [start]
    first = lines[0][len(plain_head) :] if lines[0].startswith(plain_head) else lines[0]
    out.print(head + escape(first), soft_wrap=True)
    for line in lines[1:]:
        out.print(escape(line), soft_wrap=True)


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def print_ledger(out: Console, runs: list[dict[str, Any]]) -> None:
    table = Table(title="ledger: runs and their legs, newest first", title_justify="left")
    for col in ("run / leg", "rung", "backend", "result", "started (UTC)", "wall s", "GPU-h", "USD", "command"):
        table.add_column(col, overflow="fold")
    for run in runs:
        verdict = run["verdict"] or "running"
        table.add_row(
            f"[bold]{run['id']}[/bold]",
            run["rung"],
            run["backend"],
            verdict,
            _when(run["started_at"]),
            _wall(run),
            _num(run["billed_gpu_hours"]),
            _num(run["cost_usd"]),
            f"files {run['files_digest'][:16]}",
            end_section=not run["legs"],
        )
        for i, leg in enumerate(run["legs"]):
            exit_code = "-" if leg["exit_code"] is None else f"exit {leg['exit_code']}"
            if leg["killed"]:
                exit_code += f" (killed: {leg['end_reason']})"
            table.add_row(
                f"  leg {leg['leg']}",
                "",
                leg["backend"],
                exit_code,
                _when(leg["started_at"]),
                _wall(leg),
                _num(leg["billed_gpu_hours"]),
                _num(leg["cost_usd"]),
                escape(" ".join(leg["command"])),
                end_section=i == len(run["legs"]) - 1,
            )
    out.print(table)
    digests: dict[str, dict[str, Any]] = {}
    for run in runs:
        entry = digests.setdefault(run["files_digest"], {"files": run["files"], "runs": []})
        entry["runs"].append(run["id"])
    for digest, entry in digests.items():
        files = Table(
            title=f"files {digest[:16]}: sha256 at launch (runs: {', '.join(entry['runs'])})", title_justify="left"
        )
        files.add_column("file")
        files.add_column("sha256")
        for path, sha in entry["files"].items():
            files.add_row(escape(path), sha)
        out.print(files)
    total = sum(r["billed_gpu_hours"] or 0.0 for r in runs)
    out.print(f"{len(runs)} runs, {sum(len(r['legs']) for r in runs)} legs, {total:.4f} GPU-hours billed")


def _wall(row: dict[str, Any]) -> str:
    if row.get("ended_at") is None or row.get("started_at") is None:
        return "-"
    return f"{row['ended_at'] - row['started_at']:.1f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def print_images(out: Console, rows: list[dict[str, Any]]) -> None:
    if not rows:
        out.print("no images built yet (`launcher image build`)")
        return
    table = Table(title="images, newest first", title_justify="left")
    for col in ("tag", "image id", "built (UTC)", "build s", "files", "base", "pushed"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["tag"],
            r["image_id"][:19],
            _when(r["built_at"]),
            f"{r['seconds']:.0f}",
            f"{len(r['files'])} ({r['files_digest'][:12]})",
            r["base"],
            r["pushed_ref"] or "-",
        )
    out.print(table)


def print_spend(out: Console, d: dict[str, Any]) -> None:
    quota = "no quota" if d["quota_gpu_hours"] is None else f"quota {d['quota_gpu_hours']:g} GPU-h"
    since = d["period_from"][:10] if d["period_from"] else "all time"
    remaining = "-" if d["remaining_gpu_hours"] is None else f"{d['remaining_gpu_hours']:.2f}"
    out.print(
        f"period: {d['period']} from {since}; {quota}: used {d['used_gpu_hours']:.2f}, reserved "
        f"{d['reserved_gpu_hours']:.2f}, remaining {remaining} GPU-h; USD used {d['used_usd']:.2f}"
        + (f" of {d['budget_usd']:g}" if d["budget_usd"] is not None else "")
    )
    if d["reconciled_now"]:
        out.print(f"reconciled {d['reconciled_now']} reservation(s) left by a launcher that died")
    table = Table(title="this period, by rung", title_justify="left")
    for col in ("rung", "runs", "GPU-h", "USD"):
        table.add_column(col)
    for rung, row in d["by_rung"].items():
        table.add_row(rung, str(row["runs"]), f"{row['gpu_hours']:.4f}", f"{row['usd']:.4f}")
    out.print(table)
    nxt = Table(title="what the next rung would cost", title_justify="left")
    for col in ("rung", "GPU-h at most", "USD", "fits", "arithmetic"):
        nxt.add_column(col, overflow="fold")
    for row in d["next"]:
        nxt.add_row(
            row["rung"],
            f"{row['gpu_hours']:.2f}",
            "-" if row["usd"] is None else f"{row['usd']:.2f}",
            "yes" if row["fits"] else "[red]no[/red]",
            escape(row["arithmetic"]),
        )
    out.print(nxt)


def print_report(out: Console, folder: Any, report: dict[str, Any]) -> None:
    """`launcher report`: the proofs' verdicts, then where the folder is."""
    colors = {"PASS": "green", "FAIL": "red", "MISSING": "yellow"}
    table = Table(title=f"preflight report: {report['project']}", title_justify="left")
    table.add_column("#", overflow="fold")
    table.add_column("proof", overflow="fold")
    table.add_column("status", overflow="fold")
    table.add_column("what it rests on", overflow="fold")
    for p in report["proofs"]:
        c = colors[p["status"]]
        table.add_row(str(p["number"]), escape(p["title"]), f"[{c}]{p['status']}[/{c}]", escape(p["summary"]))
    out.print(table)
    plan = report["plan"]
    if "eta_hours" in plan:
        fits = "fits" if plan.get("fits", True) else "does NOT fit"
        provisional = "" if plan.get("rate_status") == "PASS" else " (provisional: proof 5 not PASS)"
        out.print(
            f"plan{provisional}: {plan['tok_s']:,.0f} tok/s on {plan['gpus']} -> ETA {plan['eta_hours']:,.1f} h, "
            f"{plan['gpu_hours']:,.1f} GPU-h; quota remaining {plan['quota']['remaining_gpu_hours']}: {fits}"
        )
    else:
        out.print("plan: no rate on the target GPU yet, so no ETA (proof 5 MISSING)")
    out.print(
        f"written: {folder}/preflight.md (+ preflight.json, {len(report.get('plots', []))} plots, evidence/, "
        f"signature.json); check it with `launcher report --check {folder}`"
    )


def print_run_progress(out: Console, r: dict[str, Any]) -> None:
    """The run against its plan: progress, restarts, rate, ETA, spend, projection."""
    width = 30
    filled = int(width * (r["percent"] or 0) / 100)
    out.print(
        f"  progress: {escape('[' + '#' * filled + '.' * (width - filled) + ']')} step {r['step']:,} of "
        f"{r['steps'] or '?':,} ({r['percent']} %); {r['legs']} legs, {r['restarts']} restarts"
    )
    plan = r.get("plan") or {}
    rate = r.get("rate")
    if rate:
        vs = f" ({100 * rate['vs_plan']:.0f} % of the probe's {plan['tok_s']:,.0f})" if "vs_plan" in rate else ""
        out.print(
            f"  rate now: {rate['tok_s']:,.0f} tok/s, {rate['step_s']:.3g} s/step over steps "
            f"{rate['window'][0]}..{rate['window'][1]}{vs}"
        )
    if "eta_s" in r:
        out.print(
            f"  ETA: {r['eta_s'] / 3600:,.2f} h; projected total {r['projected_gpu_hours']:,.2f} GPU-h"
            + (
                f" of the {r['quota_gpu_hours_for_run']:,.2f} the quota leaves this run"
                if "quota_gpu_hours_for_run" in r
                else ""
            )
        )
    sp = r["spent"]
    usd = "" if sp["usd"] is None else f", ${sp['usd']:,.2f}"
    est = (
        (
            f" (report's estimate: {plan['gpu_hours']:,.2f} GPU-h"
            + (f", ${plan['usd']:,.2f}" if plan.get("usd") else "")
            + ")"
        )
        if plan.get("gpu_hours")
        else ""
    )
    out.print(f"  spent: {sp['gpu_hours']:,.3f} GPU-h{usd}{est}")
    for w in r["warnings"]:
        out.print(f"  [yellow]warning[/yellow]: {escape(w)}")


def _print_checkpoints(out: Console, ck: dict[str, Any]) -> None:
    if "error" in ck:
        out.print(f"  store: unreachable ({escape(ck['error'])})")
        return
    for key, label in (("newest_verified", "newest verified"), ("newest", "newest in store")):
        c = ck.get(key)
        if c is None:
            out.print(f"  {label}: none")
            continue
        age = f"{c['age_steps']} steps" + (f", {c['age_minutes']} min" if c["age_minutes"] is not None else "")
        out.print(f"  {label}: {c['name']} ({c['state']}, {c['bytes'] / 1e6:,.1f} MB), {age} old")
    for d in ck.get("damaged", []):
        out.print(f"  [red]damaged[/red]: {d['name']} (never resumed from): {escape(d['reason'][:200])}")


def _print_health(out: Console, h: dict[str, Any]) -> None:
    gib = 2**30
    ram = (
        f"{h['ram_available_bytes'] / gib:,.1f} of {h['ram_total_bytes'] / gib:,.1f} GiB RAM available"
        if h.get("ram_available_bytes")
        else "RAM unknown"
    )
    out.print(
        f"  instance ({h['age_s']} s ago): disk {h['disk_free_bytes'] / gib:,.1f} of "
        f"{h['disk_total_bytes'] / gib:,.1f} GiB free; {ram}"
    )
    if h.get("gpu_total_bytes"):
        procs = h.get("gpu_processes")
        per = (
            ", ".join(f"pid {p['pid']} {p['used_bytes'] / gib:,.2f} GiB" for p in procs)
            if procs
            else "per-process list unavailable (no nvidia-smi)"
        )
        out.print(f"  GPU: {h['gpu_free_bytes'] / gib:,.1f} of {h['gpu_total_bytes'] / gib:,.1f} GiB free; {per}")
    else:
        out.print("  GPU: no GPU")


def print_status(out: Console, s: dict[str, Any]) -> None:
    """`launcher status`: the check before a kill."""
    out.print(f"[bold]{s['run']}[/bold]  rung {s['rung']}  backend {s['backend']}  on {s['gpus']}  {s['state']}")
    gate = s.get("preflight")
    if gate:
        out.print(
            "  preflight: "
            + (
                f"[yellow]skipped[/yellow] ({escape(str(gate.get('reason')))})"
                if gate.get("gate") == "skipped"
                else f"report {escape(str(gate.get('report')))} (digest {str(gate.get('digest'))[:16]})"
            )
        )
    if s.get("run_progress"):
        print_run_progress(out, s["run_progress"])
    leg = s.get("leg")
    if leg is None:
        out.print("  no leg launched")
        return
    _print_leg(out, leg)
    last = s.get("last_event")
    if last:
        out.print(f"  last event: {last['event']} (step {last['step']}, line {last['line']}) {last['age_s']} s ago")
    rate = s.get("rate")
    if rate:
        err = "" if rate["rel_err"] is None else f" +-{100 * rate['rel_err']:.1f} %"
        eta = rate["eta_s"] / 3600 if rate["eta_s"] is not None else None
        out.print(
            f"  rate: {rate['tok_s']:,.0f} tok/s{err} over steps {rate['window'][0]}..{rate['window'][1]}; "
            f"ETA to step {rate['eta_to_step']}: " + ("-" if eta is None else f"{eta:,.2f} h")
        )
    _print_checkpoints(out, s.get("checkpoints", {}))
    if s.get("health"):
        _print_health(out, s["health"])
    b = s.get("breakdown")
    if b:
        out.print(f"  step time: {escape(b['summary'])}")
    if s.get("efficiency"):
        out.print(f"  efficiency: {escape(s['efficiency']['summary'])}")
    if s.get("stragglers"):
        out.print(f"  stragglers: {escape(s['stragglers']['summary'])}")
    if s.get("hours"):
        from launcher.checks.hours import describe_hours

        out.print(f"  hours so far: {escape(describe_hours(s['hours']))}")
    if s.get("gpu_idle"):
        out.print(f"  GPU utilisation: {escape(s['gpu_idle']['summary'])}")
    _print_log_findings(out, s)
    for st in s.get("stops", []):
        out.print(
            f"  stop requested {_when(st['requested_at'])}: {st['outcome'] or 'in progress'}"
            + (f" - {escape(st['detail'])}" if st["detail"] else "")
        )


def _print_leg(out: Console, leg: dict[str, Any]) -> None:
    """The leg running (or last run): where, on what, at which step; each node's process."""
    total = f" / {leg['leg_max_steps']} this leg" if leg["leg_max_steps"] else ""
    alive = {True: ", process alive", False: ", process GONE"}.get(leg["process_alive"], "")
    out.print(
        f"  leg {leg['leg']} ({leg['state']}{alive}) on {leg['instance']}, device {leg['device']}: "
        f"step {leg['step']}{total} (run length {leg['total_steps']})"
    )
    for node in leg.get("nodes", []):
        state = {True: "process alive", False: "process GONE"}.get(node["alive"], f"exit {node['exit_code']}")
        out.print(f"    node {node['node']}: {state}, step {node['step']}, pid {node['pid']}, log {node['log']}")


def _print_log_findings(out: Console, s: dict[str, Any]) -> None:
    """What the leg's log says went wrong: its warnings and errors by kind, its damaged event lines."""
    warnings = s.get("warnings", [])
    out.print(f"  warnings/errors in this leg's log: {sum(w['count'] for w in warnings)} lines, {len(warnings)} kinds")
    for w in warnings:
        out.print(f"    {w['count']:>4} x  line {w['first_line']}: {escape(w['text'][:160])}")
    damaged = s.get("damaged_lines", [])
    if damaged:
        out.print(f"  [red]{len(damaged)} damaged event line(s)[/red] in this leg's log (not used as evidence):")
        for d in damaged[:5]:
            out.print(f"    line {d['line']}: {escape(d['reason'][:160])}")
