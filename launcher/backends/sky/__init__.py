"""The SkyPilot backend: a fresh cluster per leg (`backend`), the run as one managed job (`job`),
SkyPilot's SDK as the launcher speaks it (`api`), the task YAML each leg renders (`task`), its
requests in flight (`inflight`) and what a dead launcher left on a cloud (`reap`). SkyPilot
itself is imported lazily, by the calls that need it.
"""
