"""preflight.md: the report a reader without this project's history can check.

Rendered from preflight.json alone, so the two never disagree."""

from __future__ import annotations

from typing import Any

QUOTE_CHARS = 400


def render(r: dict[str, Any]) -> str:
    proofs = r["proofs"]
    counts = {s: sum(p["status"] == s for p in proofs) for s in ("PASS", "FAIL", "MISSING")}
    out = [
        f"# Preflight report: {r['project']}",
        "",
        f"Generated {r['generated_at']} by preflight launcher {r['launcher_version']} from the ledger and the "
        "legs' host-side logs (copied under `evidence/`). Every file here is hashed in `signature.json`; "
        "`launcher report --check <this folder>` re-verifies them (exit 1 if anything was edited).",
        "",
        f"**{counts['PASS']} of 8 proofs PASS, {counts['FAIL']} FAIL, {counts['MISSING']} MISSING.** "
        "A proof that cannot state a number is MISSING, never PASS.",
        "",
        "| # | proof | status | what it rests on |",
        "|---|---|---|---|",
    ]
    for p in proofs:
        out.append(f"| {p['number']} | {p['title']} | **{p['status']}** | {_cell(p['summary'])} |")
    out += ["", "## The plan", ""] + _plan(r["plan"]) + ["", "## Proofs, with evidence", ""]
    out += _proof_sections(proofs)
    out += ["## Plots", ""]
    for name in r.get("plots", []):
        out += [f"![{name}]({name})", ""]
    out += _runs_section(r) + _what_ran(r)
    return "\n".join(out)


def _proof_sections(proofs: list[dict[str, Any]]) -> list[str]:
    """Each proof: its summary, its checks (12 at most), and the event lines it rests on, quoted."""
    out: list[str] = []
    for p in proofs:
        out += [f"### {p['number']}. {p['title']}: {p['status']}", "", p["summary"], ""]
        for line in p["numbers"].get("each", [])[:12]:
            out.append(f"- {line}")
        if p["numbers"].get("each"):
            more = len(p["numbers"]["each"]) - 12
            out += ([f"- ... and {more} more (preflight.json)"] if more > 0 else []) + [""]
        for e in p["evidence"]:
            out += [
                f"`{e['log']}` line {e['line']} ({e['run']}, leg {e['leg']}):",
                "",
                "```json",
                _quote(e["text"]),
                "```",
                "",
            ]
    return out


def _runs_section(r: dict[str, Any]) -> list[str]:
    """The runs reported, their legs, and the log lines no proof could use."""
    out: list[str] = []
    out += [
        "## Runs reported",
        "",
        "| run | rung | backend | on | verdict | GPU-h | USD | image |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        out.append(
            f"| {run['id']} | {run['rung']} | {run['backend']} | {run['gpus']} | {run['verdict']} | "
            f"{_num(run['billed_gpu_hours'], 4)} | {_num(run['cost_usd'], 4)} | {run['image'] or '-'} |"
        )
    out += _hours_table(r["runs"])
    out += [
        "",
        "Legs: "
        + "; ".join(
            f"{run['id']} leg {leg['leg']} exit {leg['exit_code']}{' (killed)' if leg['killed'] else ''} "
            f"on {leg['instance']}"
            for run in r["runs"]
            for leg in run["legs"]
        ),
        "",
    ]
    damaged = r.get("damaged_lines", [])
    if damaged:
        out += [
            f"**{len(damaged)} log line(s) claimed to be events and were not usable ones**; no proof rests on them:",
            "",
        ] + [f"- {d['run']} leg {d['leg']} line {d['line']}: {d['reason']}" for d in damaged[:20]]
        out += ([f"- ... and {len(damaged) - 20} more (preflight.json)"] if len(damaged) > 20 else []) + [""]
    return out


def _what_ran(r: dict[str, Any]) -> list[str]:
    """The reviewed files, config, images and task YAML every run above recorded at launch."""
    out: list[str] = []
    out += [
        "## What ran",
        "",
        f"Reviewed files (sha256), as every run above recorded them at launch "
        f"(files digest {r['runs'][0]['files_digest'] if r['runs'] else '-'}):",
        "",
    ]
    out += [f"- `{path}` {sha}" for path, sha in sorted(r["reviewed_files"].items())]
    out += [
        "",
        f"Config sha256: {', '.join(sorted({run['config_sha256'] for run in r['runs']}))}",
        f"Images: {', '.join(sorted(set(r['images'].values()))) or 'none (local backend: the launcher environment)'}",
        f"Rendered SkyPilot task YAML sha256: {', '.join(r['task_yaml_sha256']) or 'none (no sky legs)'}",
        "",
    ]
    return out


def _plan(p: dict[str, Any]) -> list[str]:
    from launcher.report.memory import lines as memory_lines
    from launcher.report.notice_md import notice_lines

    lines = _rate(p) + _quota(p) + [_actual(a) for a in p.get("actuals", [])] + _measured(p) + memory_lines(p)
    lines += notice_lines(p)
    lines += _efficiency(p.get("efficiency"))
    for key in ("memory", "checkpoint", "breakdown", "efficiency"):
        for e in (p.get(key) or {}).get("evidence", []):
            lines.append(f"  - evidence: `{e['log']}` line {e['line']}")
    return lines


def _rate(p: dict[str, Any]) -> list[str]:
    """Proof 5's rate, the ETA and GPU-hours it implies; MISSING without a target rate."""
    if "tok_s" not in p:
        return [
            "- **Sustained throughput, ETA, GPU-hours**: MISSING: no rate was measured on the target GPU "
            "(proof 5), so no ETA can be stated."
        ]
    provisional = (
        ""
        if p.get("rate_status") == "PASS"
        else " **Provisional: proof 5 is not PASS (the rate is not known to within 2 %), so every figure below "
        "that rests on it is too.**"
    )
    usd = (
        "no price configured"
        if p["usd"] is None
        else f"x {p['price_per_gpu_hour']:g} USD/GPU-h = **{p['usd']:,.2f} USD**"
    )
    return [
        f"- **Sustained throughput**: {p['tok_s']:,.1f} tokens/s on {p['gpus']} (proof 5's window)." + provisional,
        f"- **ETA of the run**: {p['run_steps']:,} steps (rungs.run.steps) at that rate = "
        f"**{p['eta_hours']:,.2f} h**; the run rung's legs are {p['run_leg_budget_hours']:g} h each, so "
        f"it needs {p['legs_needed']} leg(s).",
        f"- **GPU-hours**: {p['eta_hours']:,.2f} h x {p['gpus']} = **{p['gpu_hours']:,.2f} GPU-h**; {usd}.",
    ]


def _quota(p: dict[str, Any]) -> list[str]:
    """The quota arithmetic, as `launcher spend` shows it, and whether the run fits."""
    q = p["quota"]
    if q["quota_gpu_hours"] is None:
        return [f"- **Quota**: none configured; used {q['used_gpu_hours']:.4f} GPU-h."]
    since = (q["period_from"] or "")[:10]
    arith = (
        f"{q['quota_gpu_hours']:g} GPU-h per {q['period']} (from {since}) - used {q['used_gpu_hours']:.4f} "
        f"- reserved {q['reserved_gpu_hours']:.4f} = **{q['remaining_gpu_hours']:.4f} GPU-h remaining**"
    )
    if "gpu_hours" in p:
        verdict = "**fits**" if p["fits"] else "**does NOT fit**"
        arith += f"; the run needs {p['gpu_hours']:,.2f}: {verdict}"
    return [f"- **Quota**: {arith} (the same figures as `launcher spend`)."]


def _actual(a: dict[str, Any]) -> str:
    """A finished run beside the plan that let it launch."""
    plan = a["plan"]
    gate = a["preflight"]
    why = (
        f"launched past report {gate['report']}"
        if gate["gate"] == "passed"
        else f"launched with the preflight SKIPPED: {gate['reason']}"
    )
    return (
        f"- **The run, actual vs plan** ({a['run']}, {a['gpus']}, {a['verdict']}; {why}): "
        f"{a['last_step']:,} steps in {a['legs']} legs ({a['restarts']} restarts); "
        f"{_vs(a['tok_s'], plan['tok_s'], 'tok/s', ',.0f')}; "
        f"wall {_vs(a['wall_hours'], plan['eta_hours'], 'h', ',.2f')}; "
        f"{_vs(a['billed_gpu_hours'], plan['gpu_hours'], 'GPU-h', ',.3f')}; "
        f"{_vs(a['usd'], plan['usd'], 'USD', ',.2f')}; goodput: {a['steps_kept']:,} steps kept of "
        f"{a['steps_computed']:,} computed, {a['training_s']:,.0f} s training of {a['billed_s']:,.0f} s billed; "
        f"steps lost per recovery: {', '.join(map(str, a['lost_per_recovery'])) or 'none (one leg)'}."
    )


def _measured(p: dict[str, Any]) -> list[str]:
    """Memory, the checkpoint cycle's cost and where step time goes, on the leg measured."""
    lines = []
    m = p.get("memory")
    if m:
        lines.append(
            f"- **Memory** ({m['run']} leg {m['leg']}, {m['on']}): peak {m['peak_bytes'] / 2**20:,.1f} MiB; "
            f"{m['verdict']}."
        )
    c = p.get("checkpoint")
    if c:
        cadence = (
            f"At the configured cadence (every {c['interval_steps']} steps) that is "
            f"{100 * c['overhead']:.2f} % of step time ({'affordable' if c['ok'] else 'too costly'})"
            if c["interval_steps"]
            else "One checkpoint in the leg, so no cadence was measured"
        )
        lines.append(
            f"- **Checkpoint cycle** ({c['run']} leg {c['leg']}, {c['on']}, {c['bytes']:,} B): save "
            f"{c['save_s']:.3f} s on the critical path, "
            + (f"write {c['serialize_s']:.3f} s, " if c.get("background_save") else "")
            + f"push {c['push_s']:.3f} s and verify {c['verify_s']:.3f} s "
            f"in the background; median step {c['step_s']:.4f} s. {cadence}; keeping it under 1 % needs a checkpoint every "
            f"{c['min_interval_1pct']} steps or more, and an upload to finish before the next needs every "
            f"{c['min_interval_upload']} or more; {c['push_waits']} push waits."
        )
    b = p.get("breakdown")
    if b:
        lines.append(f"- **Where step time goes** ({b['run']} leg {b['leg']}, {b['on']}): {b['summary']}.")
    return lines


def _efficiency(e: dict[str, Any] | None) -> list[str]:
    """MFU, GPU idle and why, and what efficiency would buy."""
    if not e:
        return []
    lines = [f"- **Efficiency** ({e['run']} leg {e['leg']}, {e['on']}): {e['summary']}."]
    if e.get("idle"):
        lines.append(f"- **GPU utilisation**: {e['idle']['summary']}.")
    w = e.get("what_if")
    if w:
        at = (
            f"at the measured MFU ({100 * w['measured_mfu']:.1f} %)"
            if w["measured_mfu"] is not None
            else "at the measured rate"
        )
        text = (
            f"- **What efficiency would buy**: the run is {w['run_flops']:.3g} FLOPs; {at} it takes "
            f"{w['eta_hours']:,.2f} h = {w['gpu_hours']:,.2f} GPU-h"
        )
        r = w.get("reachable")
        if r:
            text += (
                f"; at a reachable {100 * r['mfu']:.0f} % MFU of the {r['dtype']} peak it would take "
                f"**{r['eta_hours']:,.2f} h = {r['gpu_hours']:,.2f} GPU-h** ({r['why']})"
            )
        else:
            text += f"; no reachable figure: {w.get('reachable_note')}"
        lines.append(text + ".")
    if e.get("levers"):
        lines.append("- **Levers, from what the probe measured**: " + "; ".join(e["levers"]) + ".")
    return lines


def _vs(got: float | None, want: float | None, unit: str, fmt: str) -> str:
    """An actual beside its planned figure."""
    return (f"{got:{fmt}} {unit}" if got is not None else "-") + (
        f" (plan {want:{fmt}})" if want is not None else " (no plan)"
    )


def _quote(text: str) -> str:
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + " ... (whole line in the log)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _num(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _hours_table(runs: list[dict[str, Any]]) -> list[str]:
    """Where each run's billed time went (launcher.checks.hours), in seconds of instance time."""
    from launcher.checks.hours import BILLED, LABELS

    out = [
        "",
        "Where each run's billed time went, in instance-seconds (docs/hours.md); the time between legs "
        "is wall-clock time no instance billed:",
        "",
        "| run | billed | goodput | " + " | ".join(LABELS[k] for k in BILLED) + " | between legs |",
        "|---|" + "---|" * (len(BILLED) + 3),
    ]
    for run in runs:
        h = run["hours"]
        goodput = "-" if h["goodput"] is None else f"{100 * h['goodput']:.1f} %"
        cells = " | ".join(f"{h['parts'][k]:,.1f}" for k in BILLED)
        out.append(f"| {run['id']} | {h['billed_s']:,.1f} | {goodput} | {cells} | {h['gap_s']:,.1f} |")
    out.append("")
    out += [
        f"- {run['id']}: {'' if run['hours']['sums']['ok'] else '**FAIL**: '}{run['hours']['sums']['detail']}"
        for run in runs
    ]
    return out
