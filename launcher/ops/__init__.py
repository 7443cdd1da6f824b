"""Operating runs: what is live, what it costs, and ending it.

status.py     `launcher status`: the check before a kill
stop.py       `launcher stop`: a graceful stop, confirmed
watch.py      a run watched against its plan (rate, ETA, spend)
spend.py      quota periods and the pre-launch arithmetic; `launcher spend`
shape.py      the ranks and accumulation a launch trains in; a resume of another shape refused
reconcile.py  runs a dead launcher left open: ended, their reservations released
"""
