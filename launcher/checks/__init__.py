"""Every check the rungs, the drills and the report run, each with its evidence.

evidence.py     Check, Kind and LegEvents: every claim points at an event line (leg + line)
leg.py          one leg: it ended on its own, on the device it asked for
resume.py       the resume checks: step, LR, loss, the straight-through oracle
data.py         the data checks: what each resumed leg read (batch hashes), on every rank
state.py        resume checks on what the session measured itself (optimizer, RNG, loader state)
determinism.py  what the legs' deterministic mode lets the checks compare exactly
readback.py     the launcher's own read of the store after a leg (proofs 1, 6 and 7)
measure.py      the probe's measurements: sustained rate, memory trend, checkpoint-cycle cost
"""
