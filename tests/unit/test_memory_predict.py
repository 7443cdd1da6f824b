"""The memory program (runtime.programs.memory): a prediction on fake tensors against the same
steps measured for real, a model far past a T4 predicted in seconds without its memory, a script
that fails said in one line; and the fake side's rules (values read as zero, indices kept real)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime import contract

REPO = Path(__file__).resolve().parents[2]
MLP = REPO / "tests" / "assets" / "memory" / "mlp.py"
T4_BYTES = 15 * 2**30


def _memory(mode: str, tmp_path: Path, *args: str, world: int = 1) -> tuple[int, dict]:
    out = tmp_path / f"{mode}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(contract.MEMORY, None)
    argv = [sys.executable, "-m", "runtime.programs.memory", mode, "--out", str(out), "--timeout", "120"]
    argv += (["--world", str(world)] if world > 1 else []) + ["--", "python", str(MLP), *args]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    result = json.loads(out.read_text()) if out.exists() else {}
    assert result, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == result  # the last line says the same
    return proc.returncode, result


def test_a_prediction_is_the_measured_peak_of_the_same_steps(tmp_path: Path) -> None:
    rc, predicted = _memory("predict", tmp_path, "--width", "512", "--depth", "6", "--batch", "256")
    assert rc == 0 and predicted["ended"] == "steps" and predicted["optimizer_steps"] == 2
    rc, measured = _memory("measure", tmp_path, "--width", "512", "--depth", "6", "--batch", "256")
    assert rc == 0 and measured["ended"] == "steps" and measured["allocations"] > 100
    err = predicted["peak_bytes"] / measured["peak_bytes"] - 1
    assert abs(err) < 0.02, (predicted, measured)
    cats = predicted["categories"]
    params = 6 * (512 * 512 + 512) * 4
    assert cats["parameters"] == params and cats["optimizer"] >= 2 * params  # AdamW: two moments (and steps)
    assert sum(cats.values()) == predicted["peak_bytes"]


def test_a_model_far_past_a_t4_is_predicted_in_seconds_without_its_memory(tmp_path: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rc, predicted = _memory("predict", tmp_path, "--width", "16384", "--depth", "8")
    assert rc == 0 and predicted["ended"] == "steps"
    params = 8 * (16384 * 16384 + 16384) * 4  # 8.6 GB of fp32 weights: 2.1B parameters
    assert predicted["categories"]["parameters"] == params
    assert predicted["peak_bytes"] > 4 * params > 2 * T4_BYTES  # weights, gradients, two moments
    assert predicted["seconds"] < 60
    child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert max(child_kib, before) < 2 * 2**20  # the child never held 2 GiB: nothing was allocated


def test_a_script_that_fails_is_said_in_one_line(tmp_path: Path) -> None:
    rc, result = _memory("predict", tmp_path, "--fail")
    assert rc == 1 and result["ended"] == "error" and result["optimizer_steps"] == 0
    assert result["error"].startswith("RuntimeError: planted failure before the first step (at mlp.py:")


def test_a_command_it_cannot_read_exits_2(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "runtime.programs.memory"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv, said in (
        (["predict", "--", "bash", "x.sh"], "cannot read the command"),
        (["predict", "--world", "2", "--rank", "2", "--", "python", "x.py"], "is not a rank"),
        (["predict", "python", "x.py"], "usage"),
    ):
        proc = subprocess.run(base + argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr


def test_values_read_as_zero_but_constants_and_indices_keep_theirs() -> None:
    from runtime.memory.fake import valueless

    with valueless():
        x = torch.randn(4, 8)
        assert float(x.sum().item()) == 0.0 and not bool((x > 0).any())  # no value: zero, False
        step = torch.tensor(0.0)
        step += 1
        assert step.item() == 1.0  # a one-element constant keeps its value (AdamW's bias correction)
        data = torch.arange(100)
        ix = torch.randint(0, 90, (3,))
        batch = torch.stack([data[i : i + 8] for i in ix])  # nanoGPT's get_batch
        assert batch.shape == (3, 8) and batch[:, 1:].sub(batch[:, :-1]).eq(1).all().item()
        lin = torch.nn.Linear(8, 8)
        lin.to("cpu")  # a move to where it is: no swap of a parameter the optimizer holds
        copy = __import__("copy").deepcopy(torch.zeros(3))
        assert copy.shape == (3,)
        assert x.tolist() == [[0.0] * 8] * 4 and x.numpy().shape == (4, 8)
        torch.save({"w": lin.weight}, "never-written.pt")
    assert not Path("never-written.pt").exists()
    assert torch.randn(2).numpy().shape == (2,)  # restored on the way out


def test_the_session_and_the_adapters_stand_aside(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from runtime.memory.stand_in import MemorySession
    from runtime.session import Session

    monkeypatch.setenv(contract.MEMORY, "predict")
    sess = Session(ckpt_every=1, workdir=tmp_path)
    assert isinstance(sess, MemorySession) and sess.resume() == 0 and sess.running()
    sess.step(loss=torch.zeros(()))
    assert sess.step_count == 1 and sess.finish() == 0 and not list(tmp_path.iterdir())  # no store, no file
    monkeypatch.delenv(contract.MEMORY)
    assert type(Session(ckpt_every=1, workdir=tmp_path)) is Session


def test_an_lstm_whose_fake_kernel_hides_its_workspace_is_measured_for_that_kernel(tmp_path: Path) -> None:
    """oneDNN's RNN layer: its fake returns an empty workspace and its backward's scratch is no op's
    output; runtime.memory.opaque runs that kernel for real at its shapes. Predicted 68 % low without."""
    from runtime.memory.fake import valueless
    from runtime.memory.opaque import _MEASURED

    with valueless():
        rnn = torch.nn.LSTM(64, 64, batch_first=True)
        out, _ = rnn(torch.randn(8, 12, 64))
        out.sum().backward()
    shapes = [s for key, (s, _) in _MEASURED.items() if "mkldnn_rnn_layer.default" in key[0]]
    assert shapes and shapes[0][3][0] > 0  # the workspace the real kernel keeps (its fake says (0,))
    example = REPO / "examples" / "plain_loop" / "train.py"
    peaks = {}
    for mode in ("predict", "measure"):
        out_file = tmp_path / f"{mode}.json"
        argv = [sys.executable, "-m", "runtime.programs.memory", mode, "--out", str(out_file), "--"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        argv += ["python", str(example), "--hidden", "256", "--batch", "32"]
        subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=180, check=True)
        peaks[mode] = json.loads(out_file.read_text())["peak_bytes"]
    assert abs(peaks["predict"] / peaks["measure"] - 1) < 0.10, peaks


def test_accumulation_is_counted_and_a_larger_micro_batch_estimated_from_above(tmp_path: Path) -> None:
    """Four micro-batches of 64 a step: 8 backward passes in 2 optimizer steps, and the account's
    estimate for a micro-batch 4x larger (its activations and temporaries taken 4 times over) is
    not under the prediction of that micro-batch itself (256 rows, no accumulation): an accumulating
    run holds its gradients through the later micro-batches' backward, which one larger micro-batch
    does not, so the estimate errs on the side of saying it would not fit."""
    from launcher.ops.headroom import _micro_batch

    rc, accum = _memory("predict", tmp_path, "--width", "512", "--depth", "6", "--batch", "64", "--accum", "4")
    assert rc == 0 and accum["backwards"] == 8 and accum["optimizer_steps"] == 2
    rc, whole = _memory("predict", tmp_path, "--width", "512", "--depth", "6", "--batch", "256")
    assert rc == 0 and whole["backwards"] == 2
    estimate = accum["scaled_peaks"]["4"]
    assert whole["peak_bytes"] <= estimate <= 1.5 * whole["peak_bytes"], (estimate, whole["peak_bytes"])
    said = _micro_batch([accum], "T4", 0.0)
    assert said is not None and said["accumulation"] == 4 and said["multiple"] == 4
    assert "4x the micro-batch and 1 accumulation step(s)" in said["line"]
    assert _micro_batch([whole], "T4", 0.0) is None  # one backward a step: nothing to say
