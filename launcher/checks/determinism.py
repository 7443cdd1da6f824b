"""The legs' deterministic mode (runtime.session.determinism), and what it lets the resume checks
compare exactly: said as a check, never a failure (the mode is ours to ask for).
"""

from __future__ import annotations

from launcher.checks.evidence import Check, Kind, LegEvents

EXACT_ON_GPU = "deterministic mode: exact comparisons"


BAND_ON_GPU = "deterministic mode: an op without a deterministic kernel"


def check_determinism(legs: list[LegEvents], on_gpu: bool) -> Check | None:
    """What the legs' deterministic mode allows. On a GPU: every leg started with torch's
    deterministic algorithms on and no op without a deterministic kernel ran: the re-run
    steps are compared exactly (EXACT_ON_GPU); an op named, or a leg without the mode: the
    band, said so. On a CPU only a named op is said (the CPU comparisons are exact, and a
    second straight run settles a difference). Never a failure: the mode is ours to ask for."""
    named = [(ev, n, e) for ev in legs for n, e in ev.all("step") if e.get("nondeterministic")]
    if named:
        ev, n, e = named[0]
        ops = sorted({op for _, _, e2 in named for op in e2["nondeterministic"]})
        return Check(
            BAND_ON_GPU,
            True,
            f"{', '.join(ops)} ran without a deterministic kernel (first: leg {ev.leg} "
            f"step {e['step']}): "
            + (
                "the re-run steps are compared within the run's own noise band, not exactly"
                if on_gpu
                else "said; the CPU comparisons stay exact"
            ),
            ev.pointer((n, e)),
            kind=Kind.GPU_BAND,
        )
    if not on_gpu:
        return None
    starts = [ev.first("start") for ev in legs]
    off = [
        ev.leg for ev, st in zip(legs, starts) if st is None or not (st[1].get("deterministic") or {}).get("algorithms")
    ]
    if off:
        return Check(
            "deterministic mode",
            True,
            f"legs {off} did not start with torch's deterministic algorithms on "
            "(a trainer outside the session?): the re-run steps are compared within the band",
            kind=Kind.GPU_BAND,
        )
    return Check(
        EXACT_ON_GPU,
        True,
        f"all {len(legs)} legs ran with deterministic algorithms, cudnn deterministic, no "
        "TF32, and no op without a deterministic kernel: the re-run steps are compared exactly",
        kind=Kind.GPU_EXACT,
    )
