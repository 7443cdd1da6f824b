"""The framework adapters, one `Preflight` each: `hf` (a transformers `Trainer` callback),
`lightning` (a Lightning callback) and `accelerate` (a custom Accelerate loop), with what they
do the same way in `common`. Each is imported only by a trainer of that framework.
"""
