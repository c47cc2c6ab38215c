"""Per-rank measurement on gloo: launching ranks, wrapping for DDP/ZeRO/FSDP2/TP, the distributed
tracker.
"""
