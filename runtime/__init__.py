"""preflight runtime: what runs inside a leg (the instance side).

Submodules that need torch import it themselves; `runtime.events` and
`runtime.store` are torch-free so the host can read the same wire format.
Never imports typer or skypilot.
"""
