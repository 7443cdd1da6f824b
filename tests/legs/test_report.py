"""`launcher report`: proofs re-derived from the logs, the plan arithmetic, plots,
and the signature that `--check` re-verifies.

One local ladder (static, rehearsal, a CPU dress rehearsal of the probe, a
drill) is run once for the module; tests that doctor logs work on copies.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path, PurePath
from xml.etree import ElementTree

import pytest

from launcher.checks.evidence import LegEvents
from launcher.config.schema import Config, RungConfig, RungsConfig
from launcher.report import markdown as report_md
from launcher.report.plan import efficiency_plan
from launcher.report.proofs import proof_5
from launcher.report.proofs_store import proof_7
from launcher.report.runs import Evidence, RunData
from runtime.events import parse_line
from tests.gpuhost import gpu_host_env
from tests.helpers import assert_one_line_error, clone, run_cli

pytestmark = pytest.mark.xdist_group("report-ladder")  # the module's one ladder is walked once, on one worker


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    base = tmp_path_factory.mktemp("report")
    env = {"TMPDIR": str(base / "tmp")}
    (base / "tmp").mkdir()
    root = base / "proj"
    for args, cwd in (
        (["init", str(root)], base),
        (["review"], root),
        (["up", "static"], root),
        (["up", "rehearsal"], root),
        (["up", "probe", "--cpu", "--steps", "80"], root),
        (["drill", "cold-resume", "--kills", "1", "--at", "mid-push"], root),
    ):
        res = run_cli(args, cwd=cwd, env=env)
        assert res.code in (0, 1) and "Traceback" not in res.err, (args, res.out[-2000:], res.err[-2000:])
        if args == ["up", "rehearsal"]:
            (base / "rehearsal.out").write_text(res.out)  # what a user sees: test_the_rehearsal_fits_a_few_screens
    return root, env


def report_json(project: Path, env: dict[str, str], out: Path) -> dict:
    res = run_cli(["report", "--out", str(out), "--json"], cwd=project, env=env)
    assert res.code == 0, res.err
    return res.json()


def proofs(data: dict) -> dict[int, dict]:
    return {p["number"]: p for p in data["proofs"]}


def test_local_ladder_proves_all_but_the_gpu_rate(ladder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = ladder
    data = report_json(root, env, tmp_path / "rep")
    got = proofs(data)
    assert {n: p["status"] for n, p in got.items()} == {
        1: "PASS",
        2: "PASS",
        3: "PASS",
        4: "PASS",
        5: "MISSING",
        6: "PASS",
        7: "PASS",
        8: "PASS",
    }
    assert "no GPU rung ran" in got[5]["summary"]
    assert got[7]["numbers"]["bytes_per_param"] == pytest.approx(12.3, abs=0.3)
    assert got[7]["numbers"]["verify_bytes_read"] > 0 and got[7]["numbers"]["free_bytes_after"] > 0
    assert got[6]["numbers"]["kills"][0]["fresh_instance"] is True
    assert {r["rung"] for r in data["runs"]} == {"static", "rehearsal", "probe", "drill"}
    folder = tmp_path / "rep"
    for name in ("preflight.md", "preflight.json", "signature.json", "throughput.svg", "memory.svg"):
        assert (folder / name).is_file(), name
    svg = ElementTree.parse(folder / "throughput.svg").getroot()  # well-formed SVG, its title and its window
    texts = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert svg.tag == "{http://www.w3.org/2000/svg}svg" and "Training throughput per step" in texts
    assert "sustained window: steps " in texts and "<polyline" in (folder / "throughput.svg").read_text()
    assert "![throughput.svg](throughput.svg)" in (folder / "preflight.md").read_text()
    # every PASS rests on numbers and on event lines that really are at the cited line of the copied log
    for p in got.values():
        if p["status"] == "PASS":
            assert p["numbers"] and p["evidence"], p
        for e in p["evidence"]:
            line = (folder / e["log"]).read_text().splitlines()[e["line"] - 1]
            assert parse_line(line) == json.loads(e["text"]), (p["number"], e)
    md = (folder / "preflight.md").read_text()
    assert "6 of 8 proofs PASS" not in md and "7 of 8 proofs PASS, 0 FAIL, 1 MISSING" in md
    # the plan says how much compute the legs did, and that a CPU has no peak to hold it against
    eff = data["plan"]["efficiency"]
    assert eff["flops_per_token"] > 0 and eff["flop_s"] > 0 and eff["mfu"] is None
    assert "**Efficiency**" in md and "GFLOP/s at the sustained rate; no MFU: no peak is known for a CPU" in md


def reword_checks(project: Path) -> None:
    """Every recorded check's name and detail replaced by other words (kind, leg and facts kept)."""
    with sqlite3.connect(project / ".launcher" / "ledger.db") as db:
        db.execute("UPDATE checks SET name = 'check ' || seq || ' reworded', detail = 'said otherwise ' || seq")


def test_rewording_every_check_changes_no_proof(ladder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    """The report selects checks by kind and reads their facts, never their wording: with every
    check's name and detail rewritten in the ledger, the eight proofs come out the same."""
    root, env = ladder
    with sqlite3.connect(root / ".launcher" / "ledger.db") as db:  # every check of the ladder says its kind
        assert db.execute("SELECT count(*) FROM checks WHERE coalesce(kind, '') = ''").fetchone()[0] == 0
        assert db.execute("SELECT count(DISTINCT kind) FROM checks").fetchone()[0] >= 15
    before = proofs(report_json(root, env, tmp_path / "before"))
    copy = clone(root, tmp_path / "proj")
    reword_checks(copy)
    after = proofs(report_json(copy, env, tmp_path / "after"))
    assert {n: p["status"] for n, p in after.items()} == {n: p["status"] for n, p in before.items()}
    assert after[6]["numbers"]["kills"][0]["resumed_at"] == before[6]["numbers"]["kills"][0]["resumed_at"]


def test_the_rehearsal_fits_a_few_screens(ladder: tuple[Path, dict[str, str]]) -> None:
    """Quiet by default: the ladder's rehearsal, as a user sees it, is three legs and an answer
    (-v, every event as a sentence, is test_rehearsal_cycles_through_the_hub_when_configured's)."""
    root, _ = ladder
    out = (root.parent / "rehearsal.out").read_text()
    assert "answer: yes" in out and len(out.splitlines()) <= 15, out


def test_a_removed_verify_event_never_leaves_proof_7_passing(
    ladder: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = ladder
    copy = clone(root, tmp_path / "proj")
    for log in (copy / ".launcher" / "runs").rglob("leg-*.log"):
        lines = log.read_text().splitlines(keepends=True)
        log.write_text("".join(ln for ln in lines if (parse_line(ln) or {}).get("event") != "verify"))
    got = proofs(report_json(copy, env, tmp_path / "rep"))
    assert got[7]["status"] in ("MISSING", "FAIL")
    assert got[1]["status"] != "PASS"  # nothing verified: nothing was shown pulled back intact


def test_check_refuses_an_edited_report(ladder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = ladder
    folder = tmp_path / "rep"
    report_json(root, env, folder)
    assert run_cli(["report", "--check", str(folder)], cwd=root).code == 0
    md = folder / "preflight.md"
    md.write_text(md.read_text().replace("PASS", "PASS ", 1))
    res = run_cli(["report", "--check", str(folder)], cwd=root)
    assert res.code == 1 and "edited: preflight.md" in res.out
    md.write_text(md.read_text().replace("PASS ", "PASS", 1))
    assert run_cli(["report", "--check", str(folder)], cwd=root).code == 0
    log = next((folder / "evidence").rglob("leg-1.log"))
    log.write_text(log.read_text() + "\n")  # one byte in an evidence file
    res = run_cli(["report", "--check", str(folder), "--json"], cwd=root)
    assert res.code == 1 and res.json()["problems"] == [f"edited: {log.relative_to(folder)}"]
    (folder / "extra.txt").write_text("x")
    assert "added: extra.txt" in run_cli(["report", "--check", str(folder)], cwd=root).out
    assert_one_line_error(run_cli(["report", "--check", str(tmp_path)], cwd=root), 2, "not a report folder")


@pytest.mark.parametrize("files", [["preflight.md"], 3, {"preflight.md": 5}, None])
def test_check_refuses_a_malformed_signature_naming_it(files: object, tmp_path: Path) -> None:
    """A signature whose `files` is not a map of paths to sha256 strings: a finding (exit 1,
    one line naming the file), never a traceback."""
    folder = tmp_path / "rep"
    folder.mkdir()
    (folder / "preflight.md").write_text("# report\n")
    (folder / "signature.json").write_text(json.dumps({"algorithm": "sha256", "digest": "0" * 64, "files": files}))
    res = run_cli(["report", "--check", str(folder)], cwd=tmp_path)
    assert res.code == 1 and "Traceback" not in res.out + res.err, (res.out, res.err)
    assert "signature.json is malformed" in res.out, res.out


def test_quota_arithmetic_matches_launcher_spend(ladder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = ladder
    quota = report_json(root, env, tmp_path / "rep")["plan"]["quota"]
    spend = run_cli(["spend", "--json"], cwd=root, env=env).json()
    for key in ("quota_gpu_hours", "used_gpu_hours", "reserved_gpu_hours", "remaining_gpu_hours", "period_from"):
        assert quota[key] == spend[key], key
    md = (tmp_path / "rep" / "preflight.md").read_text()
    assert f"- used {spend['used_gpu_hours']:.4f}" in md and f"{spend['remaining_gpu_hours']:.4f} GPU-h remaining" in md


def test_bad_report_requests_are_refused_whole(ladder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = ladder
    assert_one_line_error(run_cli(["report", "no-such-run"], cwd=root, env=env), 2, "no run 'no-such-run'")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert_one_line_error(run_cli(["report", "--out", str(full)], cwd=root, env=env), 2, "not empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no half-written folder beside it
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    # one named run: only it is reported, and what it cannot prove is MISSING
    runs = run_cli(["ledger", "--json"], cwd=root, env=env).json()
    static = next(r["id"] for r in runs if r["rung"] == "static")
    got = proofs(report_json(root, env, tmp_path / "one"))
    assert got[8]["status"] == "PASS"
    only = proofs(run_cli(["report", static, "--out", str(tmp_path / "static"), "--json"], cwd=root, env=env).json())
    assert {p["status"] for p in only.values()} == {"MISSING"}


# --- the arithmetic on the target hardware, from a GPU leg's events --------------

READ_OK = {
    "name": "leg 0: the launcher read back its checkpoint from the store",
    "ok": True,
    "kind": "readback",
    "leg": 0,
    "detail": "step-00000005 (12,300 B) fetched whole, every file's sha256 matches the manifest",
}


def _gpu_run(
    tmp_path: Path, events: list[dict], gpus: str = "T4", count: int = 2, checks: list[dict] | None = None
) -> RunData:
    log = tmp_path / "leg-0.log"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    row = {
        "id": "r-probe",
        "rung": "probe",
        "gpu_name": gpus,
        "gpu_count": count,
        "nodes": 1,
        "legs": [{"leg": 0, "log_path": str(log), "killed": False, "exit_code": 0, "instance": "i0"}],
        "checks": [READ_OK] if checks is None else checks,
    }
    return RunData(row, [LegEvents.read(0, log)])


def _steps(
    n: int, tokens: int = 4096, ckpt_bytes: int = 12 * 1000, params: int = 1000, state_bytes: dict | None = None
) -> list[dict]:
    out: list[dict] = [{"event": "start", "rank": 0, "device": "cuda:0", "params": params}]
    for s in range(1, n + 1):
        out.append(
            {
                "event": "step",
                "rank": 0,
                "step": s,
                "loss": 1.0,
                "lr": 1e-3,
                "sample_index": s * 8,
                "tokens": s * tokens,
                "tok_s": 2000.0,
                "step_s": 2.048,
            }
        )
        if s == 5:
            if state_bytes is not None:
                out.append(
                    {
                        "event": "save",
                        "rank": 0,
                        "step": 5,
                        "bytes": ckpt_bytes,
                        "seconds": 0.1,
                        "state_bytes": state_bytes,
                    }
                )
            out += [
                {"event": "push", "rank": 0, "step": 5, "name": "step-00000005", "bytes": ckpt_bytes, "seconds": 1.0},
                {
                    "event": "verify",
                    "rank": 0,
                    "step": 5,
                    "name": "step-00000005",
                    "windows": 1,
                    "bytes_read": 100,
                    "ok": True,
                    "seconds": 0.1,
                },
                {
                    "event": "delete_local",
                    "rank": 0,
                    "step": 5,
                    "name": "step-00000005",
                    "bytes_freed": ckpt_bytes,
                    "free_bytes": 10**10,
                },
            ]
    out.append(
        {
            "event": "rate",
            "rank": 0,
            "step": n,
            "tok_s": 2000.0,
            "window_first": 21,
            "window_last": n,
            "seconds": 100.0,
            "rel_err": 0.004,
        }
    )
    return out


def test_proof_5_eta_is_the_run_steps_at_the_sustained_rate(tmp_path: Path) -> None:
    cfg = Config(project="t", rungs=RungsConfig(run=RungConfig(steps=90_000, budget_minutes=1440)), root=tmp_path)
    proof = proof_5([_gpu_run(tmp_path, _steps(60))], cfg, Evidence())
    assert proof.status == "PASS"
    assert proof.numbers["eta_s"] == pytest.approx(90_000 * 4096 / 2000.0)  # 51.2 h
    assert "90,000 x 4,096 tokens / 2,000.0 tok/s = 51.2 h" in proof.summary
    noisy = _steps(60)
    noisy[-1]["rel_err"] = 0.08
    assert proof_5([_gpu_run(tmp_path, noisy)], cfg, Evidence()).status == "FAIL"


def test_the_plan_states_mfu_and_what_a_reachable_mfu_would_buy(tmp_path: Path) -> None:
    cfg = Config(project="t", rungs=RungsConfig(run=RungConfig(steps=90_000, budget_minutes=1440)), root=tmp_path)
    events = [
        {
            "event": "flops",
            "rank": 0,
            "step": 1,
            "flops_per_token": 5e9,
            "dtype": "fp32",
            "device_name": "Tesla T4",
            "formula_flops_per_token": 4.9e9,
        }
    ] + _steps(60)
    run = _gpu_run(tmp_path, events)
    p5 = proof_5([run], cfg, Evidence())
    eff = efficiency_plan(cfg, run, run.legs[0], p5, Evidence(), None)
    # 2,000 tok/s x 5 GFLOP/token = 10 TFLOP/s on 2 x T4 at 8.1 TFLOP/s fp32 each
    assert eff["mfu"] == pytest.approx(10e12 / (2 * 8.1e12)) and eff["gpu"] == "T4"
    w = eff["what_if"]
    assert w["eta_hours"] == pytest.approx(51.2) and w["gpu_hours"] == pytest.approx(102.4)
    run_flops = 90_000 * 4096 * 5e9
    assert w["reachable"]["eta_hours"] == pytest.approx(run_flops / (0.4 * 65e12 * 2) / 3600)
    assert any(lever.startswith("fp16 autocast") for lever in eff["levers"])
    md = "\n".join(report_md._efficiency(eff))
    assert "MFU 61.7 % of 2 x T4's dense fp32 peak" in md and "at a reachable 40 % MFU of the fp16 peak" in md


def test_proof_7_flags_a_checkpoint_smaller_than_the_model_and_optimizer(tmp_path: Path) -> None:
    ok = proof_7([_gpu_run(tmp_path, _steps(10, ckpt_bytes=12_300, params=1000))], Evidence())
    assert ok.status == "PASS" and ok.numbers["bytes_per_param"] == 12.3
    small = proof_7([_gpu_run(tmp_path, _steps(10, ckpt_bytes=2_000, params=1000))], Evidence())
    assert small.status == "FAIL" and "much smaller" in small.summary


def test_proof_7_sizes_against_what_the_saved_optimizer_keeps(tmp_path: Path) -> None:
    # Plain SGD keeps no state: 4 B/param of weights *is* the real size (it false-FAILed before).
    sgd = proof_7(
        [_gpu_run(tmp_path, _steps(10, ckpt_bytes=4_400, params=1000, state_bytes={"model": 4_000}))], Evidence()
    )
    assert sgd.status == "PASS" and "0.0 B/param of optimizer state, 4.0 of weights" in sgd.summary, sgd.summary
    momentum = _steps(10, ckpt_bytes=4_400, params=1000, state_bytes={"model": 4_000, "optimizer": 4_000})
    short = proof_7([_gpu_run(tmp_path, momentum)], Evidence())
    assert short.status == "FAIL" and "smaller than the state it claims to hold" in short.summary


def test_proof_7_rests_on_the_launchers_own_read_of_the_store(tmp_path: Path) -> None:
    events = _steps(10, ckpt_bytes=12_300, params=1000)
    unread = proof_7([_gpu_run(tmp_path, events, checks=[])], Evidence())
    assert unread.status == "MISSING" and "none was made" in unread.summary
    bad = dict(READ_OK, ok=False, detail="step-00000005 is not in file:///store")
    failed = proof_7([_gpu_run(tmp_path, events, checks=[bad])], Evidence())
    assert failed.status == "FAIL" and "is not in file:///store" in failed.summary


def test_a_gpu_run_is_not_hidden_by_a_newer_cpu_rehearsal_of_its_rung(
    ladder: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    from launcher.ledger.db import Ledger
    from launcher.report.runs import select_runs

    root, _ = ladder
    copy = clone(root, tmp_path / "proj")
    ledger = Ledger(copy / ".launcher" / "ledger.db")
    try:
        cpu_probe = next(r for r in ledger.runs() if r["rung"] == "probe")
        older_gpu = {
            k: cpu_probe[k]
            for k in ("project", "rung", "backend", "nodes", "store_uri", "review_id", "files_digest", "config_sha256")
        }
        older_gpu.update(
            id="older-gpu-probe",
            gpu_name="T4",
            gpu_count=2,
            started_at=cpu_probe["started_at"] - 60,
            ended_at=cpu_probe["started_at"] - 1,
            exit_code=0,
            verdict="pass",
        )
        ledger.begin_run(older_gpu, {})
        picked = [(r["rung"], r["id"]) for r in select_runs(ledger, [])]
    finally:
        ledger.close()
    probes = [rid for rung, rid in picked if rung == "probe"]
    assert probes == ["older-gpu-probe", cpu_probe["id"]]
    assert [rung for rung, _ in picked].count("rehearsal") == 1


# --- the gate in front of rung 4 -----------------------------------------------------


def test_the_run_launches_only_past_a_signed_passing_report(
    ladder: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = ladder
    proj = clone(root, tmp_path / "proj")
    res = run_cli(["up", "run", "--cpu", "--dry-run"], cwd=proj, env=env)
    assert res.code == 3 and "no signed preflight report for exactly these files" in res.out
    assert run_cli(["report"], cwd=proj, env=env).code == 0  # into .launcher/reports/
    res = run_cli(["up", "run", "--cpu", "--dry-run"], cwd=proj, env=env)
    assert res.code == 0 and "passes (proofs 1, 2, 3, 4, 6, 7, 8 PASS)" in res.out, res.out + res.err
    # on a GPU the rate must have been measured there: proof 5 is named, with the command that makes it
    res = run_cli(["up", "run", "--gpus", "T4:1"], cwd=proj, env=env | gpu_host_env("Tesla T4"))
    assert_one_line_error(res, 3, "not every proof PASS", "proof 5 MISSING", "launcher up probe --gpus T4:1")
    res = run_cli(["up", "run", "--cpu", "--steps", "20", "--json"], cwd=proj, env=env)
    assert res.code == 0, res.err
    run = run_cli(["ledger", res.json()["run_id"], "--json"], cwd=proj, env=env).json()[0]
    [folder] = list((proj / ".launcher" / "reports").iterdir())
    assert run["preflight"]["gate"] == "passed" and run["preflight"]["report"] == str(folder)
    assert run["preflight"]["digest"] == json.loads((folder / "signature.json").read_text())["digest"]
    status = run_cli(["status", run["id"]], cwd=proj, env=env).out
    assert f"preflight: report {folder}" in status and "step 20 of 20 (100.0 %); 1 legs, 0 restarts" in status
    # a finished run's actuals go beside the plan in the next report
    data = report_json(proj, env, tmp_path / "after")
    [actual] = data["plan"]["actuals"]
    assert actual["run"] == run["id"] and actual["last_step"] == 20 and actual["preflight"]["gate"] == "passed"
    assert "The run, actual vs plan" in (tmp_path / "after" / "preflight.md").read_text()


def test_an_edited_or_hollow_report_lets_nothing_launch(ladder: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = ladder
    proj = clone(root, tmp_path / "proj")
    assert run_cli(["report"], cwd=proj, env=env).code == 0
    [folder] = list((proj / ".launcher" / "reports").iterdir())
    body = (folder / "preflight.json").read_text()
    (folder / "preflight.json").write_text(body.replace('"project": "proj"', '"project": "proj2"'))
    res = run_cli(["up", "run", "--cpu"], cwd=proj, env=env)
    assert_one_line_error(res, 3, f"report {folder.name} fails its signature", "edited: preflight.json")
    (folder / "preflight.json").write_text(body)
    assert run_cli(["up", "run", "--cpu", "--dry-run"], cwd=proj, env=env).code == 0
    # the signed report still says PASS, but the drill's evidence is gone from the ledger's logs
    with sqlite3.connect(proj / ".launcher" / "ledger.db") as db:
        logs = [
            r[0]
            for r in db.execute("SELECT l.log_path FROM legs l JOIN runs r ON r.id = l.run_id WHERE r.rung = 'drill'")
        ]
    for log in logs:
        Path(log).unlink()
    res = run_cli(["up", "run", "--cpu"], cwd=proj, env=env)
    assert_one_line_error(res, 3, f"report {folder.name} says proof", "PASS, but its runs in the ledger give")
    # and reviewed files that changed since the report have none
    (proj / "train.py").write_text((proj / "train.py").read_text() + "\n# changed\n")
    assert run_cli(["review"], cwd=proj, env=env).code == 0
    res = run_cli(["up", "run", "--cpu"], cwd=proj, env=env)
    assert_one_line_error(res, 3, "no signed preflight report for exactly these files")


def test_the_svg_charts_ticks_and_text_are_what_a_reader_needs() -> None:
    """Ticks 1, 2 or 5 times a power of ten apart, covering the range; a chart's text escaped
    (a run id or a label with `<` or `&` cannot break the file); every line labelled in the legend."""
    from launcher.report.svg import Chart, Line, Panel, nice_ticks

    assert nice_ticks(0, 1) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(7, 13) == [7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0]
    assert nice_ticks(0, 72_000) == [0.0, 20_000.0, 40_000.0, 60_000.0]
    assert nice_ticks(3e-4, 3e-3) == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3])
    assert nice_ticks(5, 5) == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]  # a flat series still gets an axis
    panel = Panel(ylabel="loss <nats>", y_from_zero=True)
    panel.lines.append(Line([1, 2, 3], [3.0, 2.5, float("nan")], "#1f77b4", "leg 0 & <1>"))
    panel.vlines.append(Line([2], [], "#d62728", "resume", style=":"))
    text = Chart("run a&b <c>", "optimizer step", [panel]).render()
    root = ElementTree.fromstring(text)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "run a&b <c>" in texts and "leg 0 & <1>" in texts and "resume" in texts and "loss <nats>" in texts
    [line] = root.iter("{http://www.w3.org/2000/svg}polyline")
    assert len(line.get("points").split()) == 2  # the NaN is left out, not drawn at a made-up place


def test_reports_made_in_one_second_each_get_a_folder_of_their_own(tmp_path: Path) -> None:
    """The default folder is named for the second; a report takes 0.3 s, and a second one in the
    same second was refused ("exists and is not empty") with nothing on stdout. Now it takes the
    next free name, and a report that loses the rename to one running beside it takes another."""
    from launcher.report import folder

    cfg = Config(project="p", state_dir=str(tmp_path / ".launcher"))
    first = folder._default_dir(cfg)
    first.mkdir(parents=True)
    (first / "preflight.json").write_text("{}")
    made = []
    with pytest.MonkeyPatch.context() as mp:  # the names are made as they are tried: a tuple of a
        real = PurePath.with_name  # million of them made every report take 4 s (session 15)
        mp.setattr(PurePath, "with_name", lambda self, name: made.append(name) or real(self, name))
        second = folder._default_dir(cfg)
    assert len(made) <= 1, len(made)
    assert second.parent == first.parent and not second.exists()
    assert second.name == first.name + "-2" or second.name > first.name  # the same second, or a later one
    tmp = tmp_path / ".launcher" / "reports" / ".report-x"
    tmp.mkdir()
    (tmp / "preflight.json").write_text('{"mine": 1}')
    names = iter([tmp_path / ".launcher" / "reports" / "other"])
    placed = folder._place(tmp, first, again=lambda: next(names))  # `first` was taken meanwhile
    assert placed.name == "other" and (placed / "preflight.json").read_text() == '{"mine": 1}'
    assert (first / "preflight.json").read_text() == "{}"  # the other report's folder, untouched
