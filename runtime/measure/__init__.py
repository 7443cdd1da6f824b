"""What a leg measures about itself while it trains: where a step's time goes (`steptime`), FLOPs
counted on a real step (`flops`), the instance's headroom (`health`) and what the session prints
once per metrics window (`window`: rate, MFU, memory). The arithmetic the launcher shares with
them is in the wire, `runtime.metrics` and `runtime.peaks`.
"""
