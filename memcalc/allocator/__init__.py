"""The device allocator's rules (the CUDA caching allocator's rounding).
"""
