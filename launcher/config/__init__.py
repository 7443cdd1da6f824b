"""launcher.yaml, read and checked before anything is launched.

schema.py  the config's frozen dataclasses, their checks, `parse_gpus`
places.py  the state dir and the store: `store_uri`, and the one folder check both pass
load.py    `load_config`: the file, parsed strictly and built into those dataclasses
parse.py   a YAML mapping -> a frozen dataclass, checked against its field annotations
hub.py     the `hub:` section: the Hugging Face Hub's limits an hf:// store keeps to
"""
