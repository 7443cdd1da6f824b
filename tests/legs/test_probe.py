"""The probe rung: its requests, and its measurements read from a leg's events."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from launcher.checks.evidence import Kind, LegEvents
from launcher.checks.measure import check_cadence, check_memory, check_sustained
from launcher.ladder import probe_plan
from tests.gpuhost import gpu_host_env
from tests.helpers import assert_one_line_error, check, checks_of, edit_config, failed, run_cli, run_rows


def test_probe_requests_are_checked_before_anything_is_recorded(project: Path) -> None:
    assert_one_line_error(run_cli(["up", "probe"], cwd=project), 2, "--gpus", "--cpu")
    assert_one_line_error(run_cli(["up", "probe", "--cpu", "--gpus", "T4:1"], cwd=project), 2, "pick one")
    assert_one_line_error(run_cli(["up", "rehearsal", "--cpu"], cwd=project), 2, "already runs on the CPU")
    assert_one_line_error(run_cli(["up", "probe", "--cpu", "--steps", "1"], cwd=project), 2, "--steps 1")
    assert_one_line_error(run_cli(["up", "static", "--steps", "5"], cwd=project), 2, "trains nothing")
    assert_one_line_error(
        run_cli(["up", "run", "--gpus", "T4:1", "--skip-preflight", ""], cwd=project),
        2,
        "--skip-preflight needs a reason",
    )
    assert run_rows(project) == 0
    dry = run_cli(["up", "probe", "--gpus", "T4:2", "--dry-run"], cwd=project, env=gpu_host_env("Tesla T4", "Tesla T4"))
    assert dry.code == 0 and "2 legs x 90 min x 2 GPUs" in dry.out


def test_cpu_probe_measures_and_resumes_cold(project: Path, hub_server, tmp_path: Path) -> None:  # noqa: ANN001
    """Also (issue 33): a store slowed on the final checkpoint (its first read held 3 s) shows in the
    report's final path, and each provider's fit and margin are the plan's needed seconds against its
    notice, said in preflight.md. A miss of GCP's 25 s notice and its wording: tests/unit/test_notice_md.py."""
    edit_config(project, store="hf://tester/ckpts")
    env = {"HF_ENDPOINT": hub_server.url, "HF_TOKEN": "hf_good", "HF_HOME": str(project / "hf-home")}
    final = probe_plan(80)[0]
    hub_server.inject("hang", 1, f"runs/*/step-{final:08d}/*", seconds=3.0)
    res = run_cli(["up", "probe", "--cpu", "--steps", "80", "--json"], cwd=project, env=env)
    assert res.code in (0, 1), res.err
    for kind in (Kind.SUSTAINED_RATE, Kind.MEMORY_FLAT, Kind.CADENCE):
        assert check(res, kind, leg=0)["evidence"], kind
    assert "tok/s over steps" in check(res, Kind.SUSTAINED_RATE, leg=0)["detail"]
    # FLOPs counted on the leg's first step, FLOP/s at the sustained rate, and no MFU on a CPU (no peak)
    flops = check(res, Kind.MFU, leg=0)["detail"]
    assert "MFLOP/token (counted on one step; 6N + 12LdT gives" in flops and "fp32 products" in flops
    assert "GFLOP/s at the sustained rate; no MFU: no peak is known for a CPU" in flops
    for kind in (Kind.RESUMED, Kind.LR, Kind.DATA_POSITION, Kind.READBACK):
        assert check(res, kind, leg=1)["ok"], kind
    assert check(res, Kind.NO_REPEAT)["ok"]
    # the rehearsal's oracle: a third leg straight through, the resumed run equal to it, and the length
    for kind, leg in ((Kind.STRAIGHT_FINISHED, 2), (Kind.TIMELINE, None), (Kind.RUN_LENGTH, None)):
        assert check(res, kind, leg=leg)["ok"], kind
    assert not checks_of(res, Kind.ON_ACCELERATOR)  # a CPU dress rehearsal makes no GPU claim
    run = run_cli(["ledger", "--json"], cwd=project).json()[0]
    assert run["rung"] == "probe" and run["gpu_count"] == 0 and run["billed_gpu_hours"] == 0
    assert not hub_server.faults  # the hang was taken
    report = run_cli(["report", "--out", str(tmp_path / "rep"), "--json"], cwd=project, env=env)
    assert report.code == 0, report.err
    notice = report.json()["plan"]["notice"]
    assert notice["step"] == final and 3.0 <= notice["seconds"] < 80 and notice["needed_s"] > notice["seconds"]
    fits = {f["provider"]: f for f in notice["per_provider"]}
    for key, notice_s in (("gcp", 25), ("azure", 25), ("aws", 110)):
        assert fits[key]["margin_s"] == pytest.approx(notice_s - notice["needed_s"], abs=1e-3), fits[key]
        assert fits[key]["fits"] == (notice["needed_s"] <= notice_s), fits[key]
    assert not fits["k8s"]["fits"]
    text = (tmp_path / "rep" / "preflight.md").read_text()
    # the seconds as the plan holds them, for whichever way each fit went
    for f in (fits["gcp"], fits["aws"]):
        said = f"with a margin of {f['margin_s']:.1f} s" if f["fits"] else f"by {-f['margin_s']:.1f} s"
        assert f"notice{'' if f['fits'] else '**'} ({f['notice_s']:g} s) {said}" in text, f
    # the cadence section: Young's interval from the measured C and the default M, R from leg 1
    c = report.json()["plan"]["cadence"]
    assert c["r_from"].startswith(run["id"] + " leg 1") and c["m_hours_instance"] == 160.0
    assert c["tau_young_s"] == pytest.approx(math.sqrt(2 * c["c_s"] * c["m_s"]))
    assert f"sqrt(2 x {c['c_s']:.3f} x {c['m_s']:,.0f}) = **{c['tau_young_s']:,.1f} s**" in text
    assert "evidence (C)" in text and "evidence (R)" in text


def _leg(tmp_path: Path, events: list[dict]) -> LegEvents:
    log = tmp_path / "leg-0.log"
    log.write_text("".join(json.dumps(dict(e, rank=0)) + "\n" for e in events))
    return LegEvents.read(0, log)


def test_a_leak_is_named_with_its_projection_over_the_run(tmp_path: Path) -> None:
    mib = 2**20
    flat = [
        {
            "event": "memory",
            "step": s,
            "kind": "cuda",
            "peak_max": 1000 * mib + (s % 20) * 1024,
            "reserved_max": 1200 * mib,
        }
        for s in range(10, 210, 10)
    ]
    assert check_memory(_leg(tmp_path, flat), 100_000).ok
    leak = [
        {
            "event": "memory",
            "step": s,
            "kind": "cuda",
            "peak_max": 1000 * mib + s * 512 * 1024,
            "reserved_max": 1200 * mib,
        }
        for s in range(10, 210, 10)
    ]
    check = check_memory(_leg(tmp_path, leak), 100_000)
    assert not check.ok and "0.50 MiB per 1000 steps" not in check.detail
    assert (
        "leaking 500.00 MiB per 1000 steps" in check.detail
        and "+48.83 GiB over the run's 100,000 steps" in check.detail
    )


def test_cadence_cost_and_push_waits(tmp_path: Path) -> None:
    def leg(save_s: float, wait: bool) -> LegEvents:
        ev: list[dict] = []
        for s in range(1, 41):
            ev.append({"event": "step", "step": s, "loss": 3.0, "lr": 1e-3, "step_s": 0.1, "tokens": s * 100})
            if s % 10 == 0:
                ev += [
                    {"event": "save", "step": s, "bytes": 10, "seconds": save_s},
                    {"event": "push", "step": s, "name": f"c{s}", "bytes": 10, "seconds": 0.5},
                    {
                        "event": "verify",
                        "step": s,
                        "name": f"c{s}",
                        "ok": True,
                        "seconds": 0.1,
                        "windows": 1,
                        "bytes_read": 10,
                    },
                ]
                if wait:
                    ev.append({"event": "push_wait", "step": s, "seconds": 0.2})
        return _leg(tmp_path, ev)

    cheap = check_cadence(leg(0.02, False))
    assert cheap.ok and "2.00 % of 10 x 0.1000 s steps" in cheap.detail
    assert not check_cadence(leg(0.2, False)).ok  # 20 % of step time on the critical path
    assert not check_cadence(leg(0.02, True)).ok  # uploads fall behind the cadence
    assert (
        "standard error"
        in check_sustained(
            _leg(
                tmp_path,
                [
                    {
                        "event": "rate",
                        "step": 9,
                        "tok_s": 5.0,
                        "window_first": 2,
                        "window_last": 9,
                        "seconds": 1.0,
                        "rel_err": None,
                    }
                ],
            )
        ).detail
    )


def test_a_cpu_probe_names_a_leg_that_trains_past_its_step_limit(tmp_path: Path, leg_tmp: Path) -> None:
    """The trainer hands the session its own step count, so LAUNCHER_MAX_STEPS is ignored: the
    probe asked for 30 steps and the legs trained to the script's 200. The run length says so."""
    from tests.legs.test_planted_bugs import copy_example, plant

    root = copy_example("flat_gpt", tmp_path)
    plant(root, "total_steps=args.max_iters,", "total_steps=args.max_iters, max_steps=args.max_iters,")
    res = run_cli(["up", "probe", "--cpu", "--steps", "30", "--json"], cwd=root, timeout=600)
    length = check(res, Kind.RUN_LENGTH)
    assert res.code == 1 and not length["ok"] and "at step 200 of 30" in length["detail"], failed(res)


def test_a_cpu_probe_catches_a_model_swapped_after_the_resume(tmp_path: Path, leg_tmp: Path) -> None:
    """The probe compared its cold resume within a band, with no oracle: a model replaced after
    the resume (the optimizer still steps the old one) passed it. With --cpu the straight-through
    run names the first step that differs, while leg 1's own resume check holds. The other classic
    plants (optimizer untracked or re-created, a curriculum restarted, a reshuffle per leg, a
    reseeded batch RNG) are caught by the same checks on the rehearsal in test_planted_bugs: the
    probe and the rehearsal call the same resume_legs.straight_and_exact -> timeline_checks."""
    from tests.legs.test_planted_bugs import copy_example, plant

    root = copy_example("flat_gpt", tmp_path)
    plant(
        root,
        "iter_num = sess.resume()\n",
        "iter_num = sess.resume()\nif iter_num:\n"
        "    import copy\n    model = copy.deepcopy(model)  # the optimizer keeps the old\n",
    )
    res = run_cli(["up", "probe", "--cpu", "--steps", "20", "--json"], cwd=root, timeout=600)
    caught = check(res, Kind.TIMELINE)
    assert res.code == 1 and not caught["ok"] and "first difference at step" in caught["detail"], failed(res)
    assert check(res, Kind.RESUMED, leg=1)["ok"], failed(res)  # the resume itself looked sound
