"""The deterministic mode of the rungs that compare runs (runtime.session.determinism), on the CPU:
the flags the session sets, an op without a deterministic kernel named on the step that ran
it, and what the launcher makes of both (launcher.checks.determinism.check_determinism)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launcher.checks.determinism import BAND_ON_GPU, EXACT_ON_GPU, check_determinism
from launcher.checks.evidence import Kind, LegEvents
from runtime import contract

ROOT = Path(__file__).resolve().parents[2]
TRAINER = """
import sys, torch
from runtime.session import Session
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sess = Session(ckpt_every=100)
sess.track(model=model, optimizer=opt)
sess.resume()
while sess.running():
    loss = model(torch.ones(2, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if sess.step_count == 1:
        torch.zeros(3).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))  # no deterministic kernel
        torch.zeros(3).put_(torch.tensor([1, 1]), torch.tensor([1.0, 2.0]))  # the same op: named once
    sess.step(loss=loss, tokens=2)
sys.exit(sess.finish())
"""


def run_trainer(tmp_path: Path, deterministic: bool) -> list[dict]:
    (tmp_path / "t.py").write_text(TRAINER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAUNCHER_")}
    env.update(PYTHONPATH=str(ROOT), LAUNCHER_MAX_STEPS="3", CUDA_VISIBLE_DEVICES="")
    if deterministic:
        env.update({contract.DETERMINISTIC: "1", "CUBLAS_WORKSPACE_CONFIG": contract.CUBLAS_WORKSPACE})
    proc = subprocess.run([sys.executable, "t.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"event"')]


def test_the_mode_sets_the_flags_and_names_an_op_without_a_deterministic_kernel(tmp_path: Path) -> None:
    events = run_trainer(tmp_path, deterministic=True)
    start = next(e for e in events if e["event"] == "start")
    assert start["deterministic"] == {
        "algorithms": True,
        "warn_only": True,
        "cudnn_deterministic": True,
        "cudnn_benchmark": False,
        "tf32": False,
        "cublas_workspace": ":4096:8",
    }
    steps = [e for e in events if e["event"] == "step"]
    assert [e.get("nondeterministic") for e in steps] == [None, ["put_"], None]  # step 2 ran it, once
    assert next(e for e in events if e["event"] == "done")["step"] == 3  # warn-only: the leg is not killed


def test_without_the_mode_nothing_is_set_or_said(tmp_path: Path) -> None:
    events = run_trainer(tmp_path, deterministic=False)
    assert next(e for e in events if e["event"] == "start")["deterministic"] is None
    assert not any("nondeterministic" in e for e in events)


def test_the_comparing_rungs_ask_for_it_and_the_measuring_ones_do_not() -> None:
    def env(rung: str) -> dict[str, str]:
        return contract.leg_env(
            run_id="r", leg=0, rung=rung, store="file:///s", max_steps=5, deadline=1e9, files_sha256={}, on_gpu=True
        )

    for rung in ("rehearsal", "smoke", "drill"):
        assert env(rung)[contract.DETERMINISTIC] == "1" and env(rung)["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    for rung in ("probe", "run"):  # they measure speed: the trainer's own settings
        assert contract.DETERMINISTIC not in env(rung) and "CUBLAS_WORKSPACE_CONFIG" not in env(rung)


def legs(*specs: tuple[dict | None, list[str] | None]) -> list[LegEvents]:
    out = []
    for i, (settings, ops) in enumerate(specs):
        items = [
            (1, {"event": "start", "deterministic": settings}),
            (2, {"event": "step", "step": 1, "loss": 1.0, "lr": 0.1, **({"nondeterministic": ops} if ops else {})}),
        ]
        out.append(LegEvents(i, Path(f"leg-{i}.log"), items))
    return out


def test_a_gpu_run_is_compared_exactly_only_while_the_mode_held() -> None:
    on = {"algorithms": True}
    held = check_determinism(legs((on, None), (on, None)), on_gpu=True)
    assert held is not None and held.kind == Kind.GPU_EXACT and held.name == EXACT_ON_GPU and held.ok
    named = check_determinism(legs((on, None), (on, ["index_add_cuda_"])), on_gpu=True)
    assert named is not None and named.kind == Kind.GPU_BAND and named.name == BAND_ON_GPU  # its wording, on purpose
    assert "index_add_cuda_" in named.detail
    assert "noise band" in named.detail and "leg 1 step 1" in named.detail
    off = check_determinism(legs((on, None), (None, None)), on_gpu=True)
    assert (
        off is not None and off.kind == Kind.GPU_BAND and off.name == "deterministic mode" and "legs [1]" in off.detail
    )
    assert check_determinism(legs((on, None)), on_gpu=False) is None  # CPU: exact anyway, nothing to say
    cpu_named = check_determinism(legs((on, ["put_"])), on_gpu=False)
    assert cpu_named is not None and "stay exact" in cpu_named.detail
