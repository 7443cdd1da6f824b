"""Command-line overrides in nanoGPT's manner, exec'd by train.py
(`exec(open("configurator.py").read())`), so it runs in train.py's globals: each argument is
either a config file, exec'd in turn, or `--key=value` for a global train.py already defines,
the value keeping that global's type. No argparse: rung 0 runs train.py up to the end of this
file, then stops it (runtime/programs/static_check.py)."""

import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if not arg.startswith("--"):
        print(f"overriding config with {arg}")
        exec(open(arg).read())
        continue
    key, _, text = arg[2:].partition("=")
    if key not in globals():
        raise ValueError(f"Unknown config key: {key}")
    try:
        value = literal_eval(text)
    except (SyntaxError, ValueError):
        value = text  # a bare string
    if type(value) is not type(globals()[key]):
        raise ValueError(f"--{key}={text}: {type(globals()[key]).__name__} expected")
    print(f"overriding: {key} = {value!r}")
    globals()[key] = value
