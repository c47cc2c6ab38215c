"""Byte units, named once: GiB is 2**30 bytes (what torch.cuda and nvidia-smi report), GB is 10**9.

>>> GIB // MIB
1024
"""
KIB = 1024
MIB = 1024 ** 2
GIB = 1024 ** 3
