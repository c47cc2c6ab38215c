"""The formulas of validate/DISTRIBUTED_MEMORY.md in code, checked against measured runs.

An independent second method for the distributed measurements (and a reference for the engine):
per-rank component sizes from parameter shapes alone (FSDP2 padded shards, ZeRO-1 partitions),
and phase peaks as shifts of the measured single-process phase peaks.

    python -m validate.distributed.formulas validate/results/dist-ci.jsonl

prints every rank's measured phase peak next to the formula and exits 1 on any difference.

>>> shard_elements((1001, 128), 4)   # 251 rows per rank, the last rank has 248
(32128, [32128, 32128, 32128, 31744])
>>> zero_partition([("a", 10), ("b", 30), ("c", 20)], 2)
([30, 30], [['b'], ['c', 'a']])
>>> adam_temporaries([100, 50])   # sqrt+div of the first, then of the second with the first's denom
800
"""
from __future__ import annotations

import math
import sys

E = 4  # bytes per element: fp32 parameters, gradients and Adam states
PHASES = ("forward", "backward", "optimizer")


def shard_elements(shape, world_size: int) -> tuple[int, list[int]]:
    """FSDP2 dim-0 sharding of one parameter: (padded shard elements, real elements per rank).

    torch.chunk rows c = ceil(d0 / W); every rank stores c rows (padded), rank r owns
    max(0, min(c, d0 - r c)) of them (_fsdp_param.py _init_sharded_param).
    """
    d0, inner = shape[0], math.prod(shape[1:])
    rows = -(-d0 // world_size)
    return rows * inner, [max(0, min(rows, d0 - r * rows)) * inner for r in range(world_size)]


def zero_partition(numels, world_size: int) -> tuple[list[int], list[list]]:
    """ZeroRedundancyOptimizer's sorted-greedy partition of (name, elements) pairs given in
    parameter order: (elements per rank, names per rank in the local optimizer's order)."""
    sizes, names = [0] * world_size, [[] for _ in range(world_size)]
    for name, n in sorted(numels, key=lambda t: t[1], reverse=True):
        rank = sizes.index(min(sizes))
        names[rank].append(name)
        sizes[rank] += n
    return sizes, names


def adam_temporaries(numels, e: int = E) -> int:
    """For-loop Adam's step temporaries: sqrt and div of tensor i while tensor i-1's denom is
    still referenced by the loop variable."""
    best, prev = 0, 0
    for n in numels:
        best, prev = max(best, e * (prev + 2 * n)), n
    return best


class Layout:
    """Parameter shapes of a model in optimizer order, grouped as FSDP2 groups them here: one
    group per decoder layer, then the root (everything else, tied weights once)."""

    def __init__(self, spec, training, hf_config=None):
        from validate.models.layers import decoder_layers
        from validate.measure.step import build_trainee

        model = build_trainee(spec, training, hf_config).model
        in_layer, self.groups = set(), []
        for i, layer in enumerate(decoder_layers(model)):
            params = list(layer.parameters())
            in_layer |= {id(p) for p in params}
            self.groups.append((f"layer{i}", [tuple(p.shape) for p in params]))
        named = list(model.named_parameters())
        self.groups.append(("root", [tuple(p.shape) for _, p in named if id(p) not in in_layer]))
        self.shapes = [(n, tuple(p.shape)) for n, p in named]
        self.param_count = sum(math.prod(s) for _, s in self.shapes)
        self.buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())

    def padded(self, world_size: int) -> dict[str, int]:
        """S_g: padded shard elements per group."""
        return {g: sum(shard_elements(s, world_size)[0] for s in shapes) for g, shapes in self.groups}

    def local(self, world_size: int, rank: int) -> list[int]:
        """n_p,r: rank r's real shard elements of each parameter, in optimizer order."""
        return [shard_elements(s, world_size)[1][rank] for _, s in self.shapes]


def components(layout: Layout, world_size: int, sharding: str, rank: int, e: int = E) -> dict:
    """Persistent per-rank bytes by kind (DISTRIBUTED_MEMORY.md sections 3-5)."""
    P, k = layout.param_count, len(layout.shapes)
    if sharding in ("none", "zero1"):
        out = {"parameters": e * P, "ddp_bucket": e * P, "gradients": e * P}
        if sharding == "none":
            out["adam_states"] = 2 * e * P + 4 * k
        else:
            sizes, names = zero_partition([(n, math.prod(s)) for n, s in layout.shapes], world_size)
            out["adam_states"] = 2 * e * sizes[rank] + 4 * len(names[rank])
        return out
    S = layout.padded(world_size)
    U = {g: world_size * s for g, s in S.items()}
    return {"sharded_parameters": e * sum(S.values()), "gradients": e * sum(S.values()),
            "adam_states": 2 * e * sum(layout.local(world_size, rank)) + 4 * len(layout.shapes),
            "device_mesh": 4 * world_size,
            "all_gather_output": {g: e * u for g, u in U.items()},
            "unsharded": {g: e * u for g, u in U.items()},
            "reduce_scatter_input": {g: e * u for g, u in U.items()},
            "reduce_scatter_output": {g: e * s for g, s in S.items()}}


def phase_peaks(single: dict, layout: Layout, world_size: int, sharding: str, rank: int,
                e: int = E) -> dict:
    """Per-rank phase peaks from the single-process phase peaks (DISTRIBUTED_MEMORY.md 6.3).

    zero3's backward is not a shift; 'backward_floor' is its value at the head's backward.
    """
    P, k, W = layout.param_count, len(layout.shapes), world_size
    t_all = adam_temporaries([math.prod(s) for _, s in layout.shapes], e)
    if sharding == "none":
        return {p: single[p] + e * P for p in PHASES}
    if sharding == "zero1":
        sizes, names = zero_partition([(n, math.prod(s)) for n, s in layout.shapes], W)
        shift = e * P - 2 * e * P - 4 * k + 2 * e * sizes[rank] + 4 * len(names[rank])
        order = dict(layout.shapes)
        local = [math.prod(order[n]) for n in names[rank]]
        return {"forward": single["forward"] + shift, "backward": single["backward"] + shift,
                "optimizer": single["optimizer"] + shift - t_all + adam_temporaries(local, e)}
    S = layout.padded(W)
    U = {g: W * s for g, s in S.items()}
    last = [g for g, _ in layout.groups if g != "root"][-1]
    local = layout.local(W, rank)
    sharded = e * sum(S.values()) + 2 * e * sum(local) + 4 * W - 3 * e * P
    out = {"optimizer": single["optimizer"] - 4 * e * P + 2 * e * sum(S.values())
           + 2 * e * sum(local) + 4 * W - t_all + adam_temporaries(local, e)}
    if sharding == "zero2":
        out["forward"] = single["forward"] + sharded + e * sum(U.values()) + e * U[last]
        out["backward"] = single["backward"] + sharded + e * sum(U.values())
    else:
        out["forward"] = single["forward"] + sharded + e * U["root"] + e * U[last]
        out["backward_floor"] = single["backward"] + sharded + e * U["root"] + e * U[last]
    return out


def measured_components(result: dict) -> dict:
    """The same kinds as components(), read from one rank's traced result
    (measure_distributed(..., events=True)): steady optimizer-phase breakdown and event sizes."""
    extra = result["extra"]
    at_optimizer = extra["peak_at"]["phases"]["optimizer"].get("breakdown", {})
    out = {"adam_states": at_optimizer.get("optimizer.state"), "gradients": at_optimizer.get("grads")}
    if "fsdp2" not in extra:
        sizes = _sizes_by_site(result.get("events", []))
        out.update(parameters=at_optimizer.get("model.build"), ddp_bucket=sum(sizes["ddp.bucket"][:1]))
        return out
    sizes = _sizes_by_site(result.get("events", []))
    out.update(sharded_parameters=extra["fsdp2"]["local_param_bytes"],
               device_mesh=at_optimizer.get("other"),
               all_gather_output=sorted(set(sizes["fsdp.all_gather_output"])),
               unsharded=sum(sizes["fsdp.unsharded_param"]),
               reduce_scatter_input=sorted(set(sizes["fsdp.reduce_scatter_in"])),
               reduce_scatter_output=sorted(set(sizes["fsdp.reduce_scatter_out"])))
    return out


def _sizes_by_site(events) -> dict:
    sizes: dict[str, list[int]] = {}
    for event in events:
        for shape, dtype, site in event[5]:
            itemsize = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4}.get(dtype, 4)
            sizes.setdefault(site, []).append(math.prod(shape) * itemsize)
    return {k: v for k, v in sizes.items()} | {k: [] for k in (
        "ddp.bucket", "fsdp.all_gather_output", "fsdp.unsharded_param", "fsdp.reduce_scatter_in",
        "fsdp.reduce_scatter_out") if k not in sizes}


def component_misses(layout: Layout, result: dict) -> dict:
    """{kind: (measured, formula)} for every kind where a traced rank result differs."""
    want = components(layout, result["world_size"], result["sharding"], result["rank"])
    got = measured_components(result)
    for kind in ("all_gather_output", "reduce_scatter_input", "reduce_scatter_output"):
        if kind in want:
            want[kind] = sorted(set(want[kind].values()))
    if "unsharded" in want:  # each per-parameter storage is allocated once (then resized)
        want["unsharded"] = sum(want["unsharded"].values())
    if "parameters" in want:  # DDP/ZeRO-1: the built model's storages include its buffers
        want["parameters"] += layout.buffer_bytes
    return {k: (got.get(k), v) for k, v in want.items() if k in got and got.get(k) != v}


def check_rows(rows, out=sys.stdout) -> int:
    """Compare every ok row's per-rank phase peaks with phase_peaks(); the number of misses."""
    from memcalc.inputs.specs import ModelSpec
    from memcalc.inputs.training import TrainingConfig
    from validate.measure.backends import measure

    cache, misses = {}, 0
    for row in (r for r in rows if r.get("status") == "ok"):
        spec = ModelSpec(**row["model"])
        fields = {k: v for k, v in row["training"].items() if k in TrainingConfig.model_fields}
        training = TrainingConfig(**fields)
        if "world_size" in TrainingConfig.model_fields:
            training = training.with_(world_size=1, sharding="none")
        key = repr((row["model"], fields))
        if key not in cache:
            cache[key] = (measure(spec, training, hf_config=row.get("hf_config")).phases,
                          Layout(spec, training, row.get("hf_config")))
        single, layout = cache[key]
        for rank, measured in enumerate(row["ranks"]):
            want = phase_peaks(single, layout, row["world_size"], row["sharding"], rank)
            for phase, value in want.items():
                got = measured["phases"][phase.replace("_floor", "")]
                bad = got < value if phase.endswith("_floor") else got != value
                misses += bad
                print(f"{row['name']:26s} rank {rank} {phase:14s} measured {got:>11,} "
                      f"formula {value:>11,} {'MISS' if bad else 'ok'}", file=out)
    return misses


if __name__ == "__main__":
    from validate.run.compare import read_jsonl

    if len(sys.argv) != 2:
        sys.exit("usage: python -m validate.distributed.formulas RESULTS.jsonl")
    sys.exit(1 if check_rows(read_jsonl(sys.argv[1])) else 0)
