"""The real-SkyPilot tier: SkyPilot 0.14.1's own API server, offline (tests/fakes/sky_server.py,
started for the session by conftest), its parser, optimizer, prices and exceptions, on
the vendored public catalog. Everything goes through the sky backend's own code path;
nothing here stands in for SkyPilot."""

from __future__ import annotations

from pathlib import Path

import pytest

import sky
from launcher.backends.base import LegSpec
from launcher.backends.sky.api import down
from launcher.backends.sky.backend import SkyBackend
from launcher.backends.sky.reap import reap
from launcher.config.load import load_config
from launcher.config.schema import parse_gpus
from tests.helpers import SKY_IMAGE_REF as REF
from tests.helpers import assert_one_line_error, run_cli, sky_server_of
from tests.sky.test_sky_live import ledger_run

ENV = {
    "LAUNCHER_RUN_ID": "r",
    "LAUNCHER_LEG": "0",
    "LAUNCHER_RUNG": "smoke",
    "LAUNCHER_STORE": "hf://o/r",
    "LAUNCHER_MAX_STEPS": "30",
    "LAUNCHER_DEADLINE": "0",
    "LAUNCHER_FILES_SHA256": "{}",
}
# What SkyPilot's optimizer picks on GCP for each shape (catalogs/v8, vendored).
EXPECTED = {"T4:2": "n1-highmem-8", "A100:8": "a2-highgpu-8g", "H100:8": "a3-highgpu-8g"}


# sky/smoke.yaml and sky/probe.yaml differ in their name alone, and the rehearsal asks for no GPU
# (`cpus: 4+`), so the shape changes nothing of it but its nodes: the CPU rehearsal on 1 and 2
# nodes, then each shape under one GPU rung. The run (`resources.ordered`, `job_recovery`) goes
# through the managed job's dry run, not this one: test_the_run_as_a_managed_job_passes_... below.
@pytest.mark.parametrize(
    "rung, gpus, nodes",
    [
        ("rehearsal", None, 1),
        ("rehearsal", None, 2),
        ("smoke", "T4:2", 1),
        ("probe", "A100:8", 1),
        ("smoke", "H100:8", 2),
    ],
)
def test_every_rung_and_shape_passes_skypilots_own_dry_run_with_a_pick_and_a_price(
    project: Path, tmp_path: Path, rung: str, gpus: str | None, nodes: int
) -> None:
    cfg = load_config(project / "launcher.yaml")
    spec = None if gpus is None else parse_gpus(gpus)
    backend = SkyBackend(cfg, REF, nodes, sky=sky)
    leg = LegSpec("r", 0, rung, tuple(cfg.trainer.command), ENV, {"HF_TOKEN": "hf_not_a_real_token"}, gpus=spec)
    task, pick, why = backend.dry_launch(leg, tmp_path / "leg-0.sky.yaml")  # sky.launch(..., dryrun=True)
    assert pick is not None, why
    assert why == "skypilot optimizer" and pick.cloud == "GCP" and pick.nodes == nodes and pick.hourly_usd > 0
    if spec is None:  # a CPU rung: the default CPU families, 4+ vCPUs as the template asks
        assert pick.accelerators is None and pick.instance_type.split("-")[0] in ("n2", "n4")
    else:
        assert pick.instance_type == EXPECTED[gpus] and pick.accelerators == gpus
    if nodes > 1:  # the price is the cluster's: every node's VM and GPUs (the table shows cents)
        one_node = SkyBackend(cfg, REF, 1, sky=sky).dry_launch(leg, tmp_path / "one.sky.yaml")[1]
        assert pick.hourly_usd == pytest.approx(one_node.hourly_usd * nodes, abs=0.01 * nodes)


def test_the_cli_dry_run_shows_skypilots_pick_and_price(project: Path) -> None:
    res = run_cli(["up", "probe", "--gpus", "T4:2", "--backend", "sky", "--dry-run"], cwd=project)
    line = next(ln for ln in res.out.splitlines() if ln.startswith("skypilot:"))
    assert "picks 1 x n1-highmem-8 (T4:2) on GCP" in line and "/h (SkyPilot's optimizer, host VM included)" in line
    price = float(line.split("$", 1)[1].split("/h", 1)[0])
    assert price > 2 * 0.35  # the host VM on top of two T4s: what the config's GPU prices alone would say
    assert "quota: 2 legs x 90 min x 2 GPUs" in res.out


@pytest.mark.parametrize(
    "enabled, error",
    [
        ([], "NoCloudAccessError"),  # no cloud enabled (sky check found no credentials)
        (["AWS"], "CloudError"),  # a cloud whose catalog is not on this machine, and no network to fetch it
    ],
)
def test_skypilots_own_refusals_are_exit_2_with_nothing_billed(
    sky_project,
    enabled: list[str],  # noqa: ANN001
    error: str,
) -> None:
    """Raised by SkyPilot's server, told apart by type: nothing provisioned (asked of
    sky.status), nothing billed, one line naming SkyPilot's reason."""
    server = sky_server_of()
    server.set_enabled(enabled)
    try:
        res = run_cli(["up", "smoke", "--gpus", "T4:1", "--backend", "sky"], cwd=sky_project.root)
    finally:
        server.set_enabled(["GCP"])
    assert_one_line_error(res, 2, f"SkyPilot could not launch: {error}")
    run = ledger_run(sky_project)
    assert run["billed_gpu_hours"] == 0 and [leg["billed_gpu_hours"] for leg in run["legs"]] == [0.0]


def test_a_cluster_that_does_not_exist_is_gone_not_a_failed_teardown() -> None:
    assert down(sky, "pf-never-launched-l0", None) == ("gone", "")  # SkyPilot's ClusterDoesNotExist, by type
    reaped = reap("pf-never-launched-l0")
    assert not reaped.was_up and reaped.ended_at is None and "already gone" in reaped.detail


def test_no_exception_is_matched_by_name() -> None:
    source = (Path(__file__).parents[2] / "launcher" / "backends" / "sky" / "backend.py").read_text()
    assert "__name__ in" not in source and "type(err).__name__ ==" not in source


@pytest.mark.parametrize("gpus, nodes", [("T4:2", 1), ("H100:8", 2)])
def test_the_run_as_a_managed_job_passes_skypilots_parser_and_dry_run(
    project: Path, tmp_path: Path, gpus: str, nodes: int
) -> None:
    from launcher.backends.sky.job import dry_run

    cfg = load_config(project / "launcher.yaml")
    backend = SkyBackend(cfg, REF, nodes, sky=sky)
    leg = LegSpec(
        "r",
        0,
        "run",
        tuple(cfg.trainer.command),
        dict(ENV, LAUNCHER_RUNG="run"),
        {"HF_TOKEN": "hf_not_a_real_token"},
        gpus=parse_gpus(gpus),
    )
    task, pick, why = dry_run(backend, leg, tmp_path / "job-0.sky.yaml", 2e9, 9 * 3600, 3)
    assert pick is not None, why
    # Spot first, then on-demand (the `ordered` list): the job is priced at the dearest, each
    # candidate's price kept; an attempt is billed at the one it ran on (test_run_sky).
    assert pick.instance_type == EXPECTED[gpus] and pick.use_spot is False
    prices = dict(pick.candidates)
    assert list(prices) == ["spot", "on-demand"] and prices["spot"] < prices["on-demand"] == pick.hourly_usd
    on_demand = SkyBackend(cfg, REF, nodes, sky=sky).dry_launch(
        LegSpec("r", 0, "probe", tuple(cfg.trainer.command), ENV, gpus=parse_gpus(gpus)), tmp_path / "od.yaml"
    )[1]
    assert pick.hourly_usd == pytest.approx(on_demand.hourly_usd)  # SkyPilot's on-demand price, as a probe's
    loaded = sky.Task.from_yaml(str(task.path))
    resources = list(loaded.resources)
    assert [r.use_spot for r in resources] == [True, False]  # ordered: spot, then on-demand
    assert all(
        r.job_recovery == {"strategy": "FAILOVER", "max_restarts_on_errors": 3, "recover_on_exit_codes": [75]}
        for r in resources
    )  # SkyPilot's own parser keeps the code a stop on a spot notice exits with
    assert "LAUNCHER_DEADLINE" not in loaded.envs and loaded.envs["PREFLIGHT_LEG_BUDGET_S"] == str(9 * 3600)
    assert "autostop" not in task.yaml_text  # SkyPilot's jobs controller downs each recovery's cluster itself


def test_the_runs_quote_reserves_the_dearest_of_its_ordered_candidates(project: Path) -> None:
    """The run's template tries spot, then on-demand (`resources.ordered`); SkyPilot's optimizer
    prices only the first. The quote prices each and the quota guard reserves the dearest: the
    on-demand price of the same machines, what the probe (on-demand) is quoted."""
    cfg = load_config(project / "launcher.yaml")
    gpus = parse_gpus("H100:8")
    pick = SkyBackend(cfg, REF, 2, sky=sky).quote("run", gpus)
    assert pick is not None and [label for label, _ in pick.candidates] == ["spot", "on-demand"]
    spot, on_demand = (usd for _, usd in pick.candidates)
    assert spot < on_demand and pick.hourly_usd == on_demand and not pick.use_spot
    probe = SkyBackend(cfg, REF, 2, sky=sky).quote("probe", gpus)
    assert probe is not None and probe.candidates == () and probe.hourly_usd == pytest.approx(on_demand)
    res = run_cli(["up", "run", "--gpus", "H100:8", "--nodes", "2", "--backend", "sky", "--dry-run"], cwd=project)
    assert f"price: SkyPilot tries spot ${spot:.2f}/h, on-demand ${on_demand:.2f}/h" in res.out, res.out


def test_the_runs_dry_run_names_both_prices_and_the_jobs_controller(sky_project) -> None:  # noqa: ANN001
    """The managed job's dry run: SkyPilot's price for each `ordered` candidate, the dearest
    reserved; and the jobs controller VM the user pays for outside the quota, priced by SkyPilot."""
    res = run_cli(
        ["up", "run", "--gpus", "T4:2", "--backend", "sky", "--dry-run", "--skip-preflight", "test"],
        cwd=sky_project.root,
    )
    assert res.code == 0, res.out + res.err
    line = next(ln for ln in res.out.splitlines() if ln.startswith("price: SkyPilot tries"))
    assert "spot $" in line and "on-demand $" in line and "reserves the dearest" in line, line
    controller = next(ln for ln in res.out.splitlines() if ln.startswith("jobs controller:"))
    assert "on GCP" in controller and "/h" in controller and "quota does not count it" in controller, controller
