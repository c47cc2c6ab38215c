"""Parallel training, per rank: data parallelism (DDP, ZeRO-1: `data`), FSDP2 sharding inside
the step simulation (`fsdp`), and tensor/sequence parallelism (`tensor`)."""
