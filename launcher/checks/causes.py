"""Causes the launcher can name beside a finding, from what the legs printed: the words that turn
"the loss differs at step 7" into why (launcher.checks.resume's straight comparison uses them)."""

from __future__ import annotations

from typing import Any

from launcher.checks.evidence import LegEvents


def rng_cause(ev: LegEvents, ref: dict[int, Any]) -> str:
    """Why a resumed leg's random draws may differ from the straight-through run's, from what
    it printed: an RNG the loop set after its restore (the `resume` event's `rng_set_after_load`),
    or the global RNG at its first step's first training forward (`rng_in`) other than the
    straight run's at that step. "" where neither is seen (or the leg did not resume)."""
    resume = ev.first("resume")
    if resume is None:
        return ""
    seeded = resume[1].get("rng_set_after_load")
    if seeded:
        return (
            f"; leg {ev.leg} set the RNG ({', '.join(map(str, seeded))}) after its restore (a set_seed after "
            "load_state?): left as set, so its random draws are not the straight-through run's"
        )
    first = min(((e["step"], e) for _, e in ev.all("step") if "rng_in" in e), key=lambda se: se[0], default=None)
    if first is None or first[0] not in ref or "rng_in" not in ref[first[0]][1]:
        return ""
    s, e = first
    if e["rng_in"] == ref[s][1]["rng_in"]:
        return ""
    return (
        f"; the global RNG at step {s}'s first forward is not the straight-through run's: one run drew "
        "from it between the checkpoint and that step and the other did not (an evaluation at the "
        "checkpoint? a loader's iter()? the RNG restored before such a draw?)"
    )
