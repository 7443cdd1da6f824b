"""Programs the launcher runs with `python -m` in the trainer's interpreter (the image's on a cloud):
rung 0's check of the trainer's script (`static_check`, with its source reading in
`static_source`), the loadability of a stored checkpoint (`loadcheck`) and the spot-notice watcher
every sky leg runs beside its trainer (`notice`). Each is a command line: its output is events.
"""
