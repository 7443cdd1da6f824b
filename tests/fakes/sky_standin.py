"""A STRICT stand-in for the `sky` module (SkyPilot 0.14.1's client SDK) — no cloud.

No cloud is reachable from the build machine, so the sky backend is tested
against this. The project rule: a stand-in may never be more lenient than the
thing it stands in for. So:

- Every SDK function has the real one's call signature: the arguments are bound
  against `inspect.signature(real sky.<name>)` first, so an argument the real SDK
  rejects raises TypeError here too. `Task`, `Dag`, `Resources`, `ClusterStatus`
  and `exceptions` ARE SkyPilot's; every error raised is SkyPilot's own class
  (ClusterDoesNotExist, NoCloudAccessError, ResourcesUnavailableError, the
  managed-secret RuntimeError of `sky.execution._resolve_managed_secrets`, ...).
- `launch` serializes the task exactly as the real client does
  (`convert_entrypoint_to_dag`, the autostop override, `dump_dag_to_yaml_str`),
  and the request is executed by a DETACHED worker process (its own session),
  as the API server executes requests independently of its client: a client
  killed mid-request leaves the request running. Every other request (`down`,
  `status`, `cancel`, `cost_report`, `api_cancel`) runs in a worker too, so its
  effect lands some time after the call returns, as it does for real. The worker
  loads the DAG with the server's loader (`dag_utils.load_dag_from_yaml_str`)
  and resolves secrets with SkyPilot's own code.
- All state is on disk under `state_dir`, so a later process (a launcher run
  after the first was `kill -9`ed) sees the same clusters and requests.
- A "cluster" is `state_dir/clusters/<name>/`: a copy of `app_dir` as `app/`
  (the image's `/app`), a fresh `home/` (its own disk: nothing survives a leg),
  `meta.json`. Its one job runs the task's real `setup` and then, only if setup
  exited 0, its `run`, with bash, in its own session, detached from everything:
  `down`/`cancel` SIGKILL every process of the node, as a deleted machine
  takes them: that session's (a `timeout` in `run` makes its own process group,
  so killing the group alone would miss it) and every process whose environment
  names the node (PREFLIGHT_STANDIN_NODE: torchrun starts each rank in a session
  of its own), scanned again until none is left, before the disk is removed.
- The job's environment is NOT the caller's: it is what a fresh cloud machine
  gives a job — PATH (with this Python's bin dir first, standing for the
  image's), locale, HOME=<cluster>/home — plus the task's envs, its secrets'
  values, SkyPilot's SKYPILOT_* node variables and LAUNCHER_APP_DIR. A variable
  the launcher forgot to pass does not leak in from the test process. What a
  cloud machine would reach by itself (the hub a test stands up in place of
  huggingface.co: HF_ENDPOINT, ...) is given explicitly as `cluster_env`.

The stand-in, by what it fakes (each module's docstring says more):
- sky_client.py: `StrictSky`, the `sky` module: the SDK calls (launch, down, status, cancel,
  cost_report, api_cancel, tail_logs, optimize); sky_requests.py: its requests as a client sees
  them (stream_and_get, get, api_status).
- sky_clusters.py: the worker (the "API server") executing a request: clusters and their one job.
- sky_jobs.py: `fake.jobs`, managed jobs as a client sees them (`sky.jobs`); sky_jobs_worker.py: the
  API server's half of managed jobs; sky_controller.py: a managed job's controller, and
  sky_attempts.py its attempts (placed, watched, cancelled);
  sky_job_state.py: managed jobs on disk (job_record, preempt_job, shutdown_jobs, stop_controller).
- sky_proc.py: what they share: files and processes, the on-disk state, a node's job process.
- sky_executor.py: the executor that workers and controllers are forked from.

What it cannot emulate, and so refuses (NotImplementedError) rather than fake:
a managed job of more than one node, several candidate resources (for a plain `launch`), `workdir` / `file_mounts` /
storage or volume mounts, `resize`, SkyPilot's internal `_...` launch arguments,
streaming a server-side `log_path`, `tail_logs(preload_content=False)`.
What it does not do (stricter than SkyPilot, or simply absent): it never reuses
a cluster (launching onto an existing name is a RuntimeError: every leg gets a
fresh one); autostop/autodown is recorded but never fires (only `down` ends a
cluster); resources are not checked against SkyPilot's catalogs (that needs
the network; `launcher.backends.sky.task` checks accelerator names itself); there are no
prices (`cost_report` has no `total_cost`); there is one job per cluster (id 1).
`api_cancel` kills a request's worker: a cancelled launch that had already
claimed its cluster leaves it behind (INIT, or UP with its job running if the
job had started), as a real cancelled launch can — `down` removes it.
Process bookkeeping reads /proc: Linux only.

Run as a script: `python tests/fakes/sky_standin.py serve-request <dir>` is the worker,
`job-controller <job dir>` a managed job's controller, `executor <dir>` the executor,
`preempt <state_dir> <job_id>` preempts a
managed job; `python -m tests.fakes.sky_standin launcher <args...>` runs the real launcher CLI with
this stand-in installed from the environment (see `install_from_env`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (`python tests/fakes/sky_standin.py ROLE ...`): its own
    # folder is on sys.path, not the repo root that `tests.fakes` is found from
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakes.sky_client import StrictSky  # noqa: E402
from tests.fakes.sky_clusters import serve_request  # noqa: E402
from tests.fakes.sky_controller import run_controller  # noqa: E402
from tests.fakes.sky_executor import run_executor  # noqa: E402
from tests.fakes.sky_job_state import job_record, preempt_job, shutdown_jobs, stop_controller  # noqa: E402
from tests.fakes.sky_proc import JOB_CANCELLED, JOB_FAILED, JOB_NOT_FINISHED, JOB_NOT_FOUND, JOB_SUCCEEDED  # noqa: E402

__all__ = [
    "JOB_CANCELLED",
    "JOB_FAILED",
    "JOB_NOT_FINISHED",
    "JOB_NOT_FOUND",
    "JOB_SUCCEEDED",
    "StrictSky",
    "install_from_env",
    "job_record",
    "main",
    "preempt_job",
    "shutdown_jobs",
    "stop_controller",
]


# ---------------------------------------------------------------- running the real launcher against it


def install_from_env() -> StrictSky | None:
    """With PREFLIGHT_TEST_SKY_STATE set, make the launcher's `sky_module()` return a StrictSky.

    PREFLIGHT_TEST_SKY_APP: the directory standing for the image's /app.
    PREFLIGHT_TEST_SKY_NO_CLOUD=1 / PREFLIGHT_TEST_SKY_CAPACITY=1 / PREFLIGHT_TEST_SKY_CREDENTIALS=1:
    launches fail as with no cloud enabled / no capacity / refused credentials.
    PREFLIGHT_TEST_SKY_PENDING_S / PREFLIGHT_TEST_SKY_CONTROLLER_UP_S: seconds a launch request
    waits queued / the jobs controller takes to come up (StrictSky's pending_s, controller_up_s). PREFLIGHT_TEST_SKY_CLUSTER_ENV: a JSON object, the
    cloud machine's own environment (see StrictSky)."""
    state = os.environ.get("PREFLIGHT_TEST_SKY_STATE")
    if not state:
        return None
    fake = StrictSky(
        Path(state),
        Path(os.environ["PREFLIGHT_TEST_SKY_APP"]),
        no_cloud=os.environ.get("PREFLIGHT_TEST_SKY_NO_CLOUD") == "1",
        capacity=os.environ.get("PREFLIGHT_TEST_SKY_CAPACITY") == "1",
        credentials=os.environ.get("PREFLIGHT_TEST_SKY_CREDENTIALS") == "1",
        pending_s=float(os.environ.get("PREFLIGHT_TEST_SKY_PENDING_S") or 0),
        controller_up_s=float(os.environ.get("PREFLIGHT_TEST_SKY_CONTROLLER_UP_S") or 0),
        cluster_env=json.loads(os.environ.get("PREFLIGHT_TEST_SKY_CLUSTER_ENV") or "{}"),
    )
    import launcher.backends.sky.backend as backend_module
    import launcher.backends.sky.task as skytask_module

    skytask_module.sky_module = lambda: fake  # type: ignore[assignment]
    backend_module.sky_module = lambda: fake  # type: ignore[assignment]
    return fake


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve-request"] and len(argv) == 2:
        serve_request(Path(argv[1]))
        return 0
    if argv[:1] == ["job-controller"] and len(argv) == 2:
        run_controller(Path(argv[1]))
        return 0
    if argv[:1] == ["executor"] and len(argv) == 2:
        run_executor(Path(argv[1]))
        return 0
    if argv[:1] == ["preempt"] and len(argv) == 3:
        preempt_job(Path(argv[1]), int(argv[2]))
        return 0
    if argv[:1] == ["launcher"]:
        install_from_env()
        from launcher.entry import main as launcher_main

        return launcher_main(argv[1:])
    print(
        "usage: sky_standin.py serve-request <request dir> | job-controller <job dir> | executor <state dir> | "
        "preempt <state dir> <job id> | launcher <args...>",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
