"""Memory rules of the ops a transformer step uses, precision-aware.

Each method adds one op to a Graph: what it allocates (outputs), what autograd saves
(tools/autograd/derivatives.yaml), and what its backward allocates in order. Autocast rules are
ATen's (aten/src/ATen/autocast_mode.cpp): matmuls in the low dtype with weight casts cached until
the autocast region exits; on CUDA layer_norm / softmax / log_softmax / cross_entropy run in fp32,
on CPU only cross_entropy does (checked with torch 2.13).
"""
from __future__ import annotations

from fractions import Fraction

from memcalc.core.poly import Poly
from memcalc.engine.regime import Regime, quantized_weight
from memcalc.tape.graph import Alias, FreeTemps, Grad, Graph, Returns, Temp, Value, product_saves


def numel(v: Value) -> Poly:
    """Elements of a tensor (its bytes over its element size); exact for the fractional
    coefficients of sequence-parallel sizes (b*s/t tokens)."""
    return Poly._of({m: c // v.elt if c % v.elt == 0 else Fraction(c, v.elt)  # none is 0
                     for m, c in v.size.terms.items()})


class Ops:
    """Op builders bound to a graph and a regime (memcalc.engine.regime: element sizes, device,
    tensor/sequence parallelism).

    >>> from memcalc.engine.regime import Regime; from memcalc.inputs.training import TrainingConfig
    >>> ops = Ops(Graph(), Regime.of(TrainingConfig(micro_batch=1, seq_len=8, precision="bf16-amp")))
    >>> ops.low, ops.param_elt
    (2, 4)
    """

    def __init__(self, graph: Graph, regime: Regime):
        self.g = graph
        self.regime = regime
        self.tp = regime.tensor_parallel
        self.sp = regime.sequence_parallel
        self.device = regime.device
        self.autocast = regime.autocast
        self.low = regime.compute_elt  # element size of matmul outputs
        self.param_elt = regime.param_elt
        self.buffer_elt = regime.buffer_elt
        self.weight_casts: list[Value] = []
        self._cast_cache: dict[int, Value] = {}
        self._param_sizes: dict[int, Poly] = {}

    # ---- dtype handling ---------------------------------------------------------------------
    def to(self, x: Value, elt: int, name: str = "to") -> Value:
        """x.to(dtype): a copy saving nothing; its backward converts the gradient back."""
        if x.elt == elt:
            return x
        return self.g.op(name, [x], numel(x) * elt, backward=[Grad(0)], elt=elt)

    def matmul_operand(self, x: Value) -> Value:
        """Autocast's cast of a matmul input to the low dtype; weights are cast once per forward
        and cached until autocast exits (autocast_mode.cpp cached_cast)."""
        if not self.autocast or x.elt == self.low:
            return x
        if not (x.is_param and x.requires_grad):  # cached_cast caches only leaves requiring grad
            return self.to(x, self.low, "autocast cast")
        if id(x) not in self._cast_cache:
            cast = self.to(x, self.low, f"cast {x.label}")
            self._cast_cache[id(x)] = cast
            self.g.cached_casts.add(id(cast.storage))
            self.weight_casts.append(cast)
        return self._cast_cache[id(x)]

    def fp32_op_input(self, x: Value) -> Value:
        """Inputs of autocast's fp32 ops on this device are cast up."""
        return self.to(x, 4, "autocast upcast") if self.autocast and x.elt != 4 else x

    def norm_input(self, x: Value) -> Value:
        """layer_norm / rms_norm run in fp32 under CUDA autocast, in the input dtype on CPU."""
        return self.fp32_op_input(x) if self.device == "cuda" else x

    # ---- parameters -------------------------------------------------------------------------
    def param(self, label: str, count: int, rows: int | None = None,
              last2: tuple[int, int] | None = None) -> Value:
        """A parameter of `count` elements in the regime's parameter dtype; `rows` is its dim 0
        (FSDP shards along it), `count` for 1-D parameters; `last2` its last two dims when it has
        three or more (Value.last2: what Adafactor factors)."""
        if quantized_weight(self.regime, label):
            return quantized_param(self, label, count, rows or count)
        module, leaf = label.rsplit(".", 1)
        lora = self.regime.lora
        if lora is not None and lora.modules_to_save and lora.saves_module(module):
            # peft's ModulesToSaveWrapper: the frozen original, then a trainable deepcopy that
            # forward runs (utils/other.py ModulesToSaveWrapper.update); both in the base dtype
            self.param(f"{module}.original_module.{leaf}", count, rows, last2)
            label = f"{module}.modules_to_save.default.{leaf}"
        nbytes = count * self.param_elt
        size = self._param_sizes.get(nbytes)
        if size is None:  # one Poly per size (memcalc.tape.ledger.Memory reads each size object once)
            size = self._param_sizes[nbytes] = Poly.const(nbytes)
        v = self.g.param(label, size, self.param_elt, trainable=self.regime.trainable(label))
        v.rows, v.last2 = rows or count, last2
        return v

    # ---- ops --------------------------------------------------------------------------------
    def linear(self, x: Value, w: Value, bias: Value | None, tokens: Poly, n_out: int,
               name: str = "linear") -> Value:
        """x @ w.T + bias (addmm/mm): saves x and w; backward makes grad x, grad w, grad bias.
        Autocast casts the bias, the weight, then the input (the order aten's linear passes them
        to addmm, measured), and the caller holds the uncast input until the module returns."""
        if w.quant:  # a bitsandbytes Linear4bit (QLoRA), possibly wrapped by peft
            out = linear_4bit(self, x, w, tokens, n_out, name)
            wrapped = lora_branch(self, x, w, out, tokens, n_out, name) if self.regime.lora else out
            if wrapped is not out:
                self.g.scope_end([x])
            return wrapped
        bin_ = self.matmul_operand(bias) if bias is not None else None
        win, xin = self.matmul_operand(w), self.matmul_operand(x)
        elt = self.low if self.autocast else x.elt
        inputs = [xin, win] + ([bin_] if bin_ is not None else [])
        # the bias's gradient is the incoming one reduced by validate_outputs' sum_to after addmm's
        # backward returns (`self: maybe_multiply(grad, beta)`): in a checkpoint region the
        # recomputed saved tensors are freed before it is made (Returns; measured on checkpointed
        # GPT-NeoX and reference GPT-2 rows: the bias's sum comes after the frees)
        # mm's backward makes the weight's gradient first, addmm's the input's (measured with a
        # TorchDispatchMode over nn.Linear(bias=False / True) on a 3-D input, torch 2.13: mm (out,in)
        # then mm (tokens,in); addmm: mm (tokens,in), mm (out,in), then the bias's sum)
        backward = [Grad(0), Grad(1), Returns(), Grad(2)] if bin_ is not None else [Grad(1), Grad(0)]
        out = self.g.op(name, inputs, tokens * n_out * elt, saves=product_saves(xin, win),
                        backward=backward, elt=elt)
        wrapped = lora_branch(self, x, w, out, tokens, n_out, name) if self.regime.lora else out
        if xin is not x or wrapped is not out:
            self.g.scope_end([x])  # the module's caller holds its argument until it returns
        return wrapped

    # ---- tensor parallelism (torch/distributed/tensor/parallel/style.py) ---------------------
    def col_linear(self, x: Value, w: Value, bias: Value | None, tokens: Poly, n_out: int,
                   name: str = "linear") -> Value:
        """ColwiseParallel linear (weight rows sharded; `w`, `bias`, `n_out` are the rank's).
        Forward: DTensor.from_local(x, Replicate) wraps the input, no copy. Backward: the
        input's gradient is Partial and is all-reduced into a new tensor (functional
        all_reduce: `clone` + in-place all-reduce), the partial sum freed."""
        if self.tp > 1 and not self.sp:  # under SP the input is already a Replicate DTensor
            x = self.g.view(f"{name} from_local", x, backward=[Grad(0)])
        return self.linear(x, w, bias, tokens, n_out, name)

    def row_linear(self, x: Value, w: Value, bias: Value | None, tokens: Poly, n_out: int,
                   name: str = "linear") -> Value:
        """RowwiseParallel linear (weight columns sharded, bias replicated): the local matmul
        makes a full-size partial sum, all-reduced into a new tensor (Partial -> Replicate),
        the partial freed; the gradient passes back unchanged (Replicate -> Partial is free)."""
        out = self.linear(x, w, bias, tokens, n_out, name)
        if self.sp:
            out = self.sp_reduce_scatter(out, name)
        elif self.tp > 1:
            out = self.g.op(f"{name} all_reduce", [out], out.size, backward=[Alias(0)], elt=out.elt)
        if self.tp > 1:  # the collective runs in the module's forward hook: the caller still
            self.g.scope_end([x])  # holds the module's argument until it returns
        return out

    # ---- sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2; DTensor redistribute) ----
    def seq_tokens(self, tokens: Poly) -> Poly:
        """Tokens a rank holds in the sequence-parallel regions: b*s/t under SP."""
        return self._chunk(tokens) if self.sp else tokens

    def _chunk(self, size: Poly) -> Poly:
        """One rank's 1/t share of a size along the sequence."""
        return Poly({m: Fraction(c, self.tp) for m, c in size.terms.items()})

    def sp_gather(self, x: Value, name: str = "all_gather", reduce_grad: bool = True) -> Value:
        """Shard(1) -> Replicate along the sequence (PrepareModuleInput, the trunk's end):
        all_gather_into_tensor gathers along dim 0 into a (t*b, s/t, h) buffer, `cat` lays it
        out as (b, s, h) and the buffer is freed. Backward with `reduce_grad` (the gradient is
        a Partial sum): a `cat` copy makes it contiguous along dim 0 (a full-size temporary) and
        reduce_scatter_tensor returns this rank's (b, s/t, h) share; without (the trunk's end,
        whose gradient is whole on every rank): this rank's chunk, a `clone`."""
        if not self.sp:
            return x
        full = x.size * self.tp
        back = [Temp(full), Grad(0)] if reduce_grad else [Grad(0)]
        gathered = self.g.op(name, [x], full, backward=back, elt=x.elt)
        return self.g.op(f"{name} cat", [gathered], full, backward=[Alias(0)], elt=x.elt)

    def sp_reduce_scatter(self, x: Value, name: str) -> Value:
        """Partial -> Shard(1) (RowwiseParallel(output_layouts=Shard(1))): a `cat` copy makes
        the full-size partial sum contiguous along dim 0, reduce_scatter returns (b, s/t, h).
        Backward all-gathers the gradient: a (t*b, s/t, h) buffer and its (b, s, h) `cat`."""
        copy = self.g.op(f"{name} cat", [x], x.size, backward=[Alias(0)], elt=x.elt)
        out = self.g.op(f"{name} reduce_scatter", [copy], self._chunk(x.size),
                        backward=[Temp(x.size), Grad(0)], elt=x.elt)
        self.g.scope_end([x])  # the output hook's frame holds the partial sum until it returns
        return out

    def sp_enter(self, x: Value) -> Value:
        """The trunk's input: this rank's chunk of the sequence (Replicate -> Shard(1): a slice
        made contiguous by `clone`). Backward all-gathers the gradient (buffer + cat)."""
        if not self.sp:
            return x
        return self.g.op("sequence chunk", [x], self._chunk(x.size),
                         backward=[Temp(x.size), Grad(0)], elt=x.elt)

    def sp_exit(self, x: Value) -> Value:
        """The trunk's output gathered to the whole sequence (see sp_gather)."""
        return self.sp_gather(x, "trunk all_gather", reduce_grad=False)

    def replicated_input(self, x: Value, name: str) -> Value:
        """Input of a module whose parameters are replicated DTensors (norms, embeddings, LM
        head under tensor parallelism: validate.distributed.tensor_parallel.replicate_rest): wrapped by
        DTensor.from_local, a view. Its gradients from several uses inside the module are
        summed before they leave it (one more autograd node), which moves where sums happen."""
        return self.g.view(f"{name} from_local", x) if self.tp > 1 else x

    def layer_norm(self, x: Value, w: Value, b: Value, tokens: Poly) -> Value:
        """native_layer_norm: outputs y, mean, rstd (fp32 stats); saves x, mean, rstd, w, b."""
        xin = self.norm_input(x)
        # mean/rstd: fp32 on CUDA (acc type); the input's dtype on CPU (measured, torch 2.13)
        stat_elt = xin.elt if self.device == "cpu" else 4
        stats = tokens * stat_elt
        y, _, _ = self.g.op_multi("layer_norm", [xin, w, b], [xin.size, stats, stats], saves=[xin],
                                  backward=[Grad(0), Grad(1), Grad(2)],
                                  elts=[xin.elt, stat_elt, stat_elt], save_outputs=(1, 2))
        return y

    def add(self, x: Value, y: Value, name: str = "add") -> Value:
        """x + y (same shape): saves nothing; both inputs receive the incoming gradient.
        Mixed dtypes promote (fp32 + bf16 -> fp32), and the low-dtype side gets a cast grad."""
        elt = max(x.elt, y.elt)
        back = [Alias(0) if x.elt == elt else Grad(0), Alias(1) if y.elt == elt else Grad(1)]
        return self.g.op(name, [x, y], numel(x) * elt, backward=back, elt=elt)

    def add_broadcast(self, x: Value, pos: Value, pos_grad: Poly) -> Value:
        """x (b,s,h) + pos (1,s,h): pos's gradient is summed over the batch (pos_grad bytes)."""
        return self.g.op("add", [x, pos], x.size, backward=[Alias(0), Grad(1, pos_grad)], elt=x.elt)

    def unary_saving_input(self, name: str, x: Value, temps: int = 0) -> Value:
        """gelu/silu/pow-like: saves its input; backward allocates `temps` temporaries and the grad."""
        back = [Temp(x.size) for _ in range(temps)] + [Grad(0)]
        return self.g.op(name, [x], x.size, saves=[x], backward=back, elt=x.elt)

    def unary_saving_output(self, name: str, x: Value) -> Value:
        """tanh/sigmoid-like: saves its result; backward allocates the grad."""
        return self.g.op(name, [x], x.size, backward=[Grad(0)], elt=x.elt, save_output=True)

    def scale(self, x: Value, name: str = "mul scalar") -> Value:
        """x * python scalar (or + scalar): saves nothing; backward allocates grad (mul) ."""
        return self.g.op(name, [x], x.size, backward=[Grad(0)], elt=x.elt)

    def shift(self, x: Value, name: str = "add scalar") -> Value:
        """x + python scalar: saves nothing; gradient passes through."""
        return self.g.op(name, [x], x.size, backward=[Alias(0)], elt=x.elt)

    def mul(self, x: Value, y: Value, name: str = "mul") -> Value:
        """x * y (same shape): saves both; backward allocates grad x then grad y."""
        elt = max(x.elt, y.elt)
        return self.g.op(name, [x, y], numel(x) * elt, saves=product_saves(x, y),
                         backward=[Grad(0), Grad(1)], elt=elt)

    def dropout(self, x: Value, p: float) -> Value:
        """Training dropout. CUDA: native_dropout saves a bool mask. CPU: _dropout_impl draws a
        noise tensor of x's dtype, saved by the multiply (aten/src/ATen/native/Dropout.cpp)."""
        if p <= 0:
            return x
        mask_elt = 1 if self.device == "cuda" else x.elt
        mask = self.g.op("dropout mask", [], numel(x) * mask_elt, requires_grad=False, elt=mask_elt)
        return self.g.op("dropout", [x, mask], x.size, saves=[mask], backward=[Grad(0)], elt=x.elt)

    def adapter_param(self, label: str, count: int, rows: int) -> Value:
        """A LoRA adapter parameter: fp32 under every precision (peft's autocast_adapter_dtype
        upcasts bf16/fp16 adapters, tuners_utils.cast_adapter_dtype)."""
        v = self.g.param(label, Poly.const(count * 4), 4, trainable=self.regime.trainable(label),
                         category="adapter_weights")
        v.rows = rows
        return v

    def scope_end(self, values: list[Value]) -> None:
        """Python locals alive until their function returns."""
        self.g.scope_end([v for v in values if v is not None])


def lora_branch(ops: Ops, x: Value, w: Value, result: Value, tokens: Poly, n_out: int,
                name: str) -> Value:
    """peft's lora.Linear.forward after the base layer, when the linear `w` is targeted:
    result + lora_B(lora_A(dropout(x.to(fp32)))) * scaling, cast back to result's dtype
    (peft/tuners/lora/layer.py Linear.forward; memcalc.inputs.lora)."""
    from memcalc.engine.regime import is_adapter, layer_of

    # the LM head is the module lm_head even when its weight is the tied embedding matrix
    lora, module = ops.regime.lora, "lm_head" if name == "lm_head" else w.label.rsplit(".", 1)[0]
    if lora is None or is_adapter(w.label) or not lora.targets_module(module, layer_of(module)):
        return result
    n_in = (w.quant or w.size.terms[(0, 0)] // w.elt) // n_out
    a = ops.adapter_param(f"{module}.lora_A.default.weight", n_in * lora.rank, lora.rank)
    b = ops.adapter_param(f"{module}.lora_B.default.weight", lora.rank * n_out, n_out)
    bias = ops.adapter_param(f"{module}.lora_B.default.bias", n_out, n_out) if lora.lora_bias else None
    if w.quant:  # peft's lora/bnb.py Linear4bit: "for 4bit, we need to defensively clone here"
        result = ops.g.op("lora result.clone()", [result], result.size, backward=[Alias(0)], elt=result.elt)
    xa = ops.to(x, a.elt, "lora x.to(fp32)")  # _cast_input_dtype: a copy when dtypes differ
    d = ops.dropout(xa, lora.dropout)  # nn.Dropout, or nn.Identity at p = 0 (update_layer)
    h = ops.linear(d, a, None, tokens, lora.rank, "lora_A")
    o = ops.scale(ops.linear(h, b, bias, tokens, n_out, "lora_B"), "lora * scaling")
    out = ops.to(ops.add(result, o, "lora result +"), result.elt, "lora result.to(dtype)")
    ops.scope_end([xa])  # the local `x`, rebound to the cast, lives until forward returns
    return out


# ---- bitsandbytes 4-bit (QLoRA) ----------------------------------------------------------------
BLOCKSIZE = 64  # bnb_4bit blocksize (Params4bit default); double quantisation: 256 absmax a block
CODE_BYTES = 16 * 4  # quant_state.code: the 16-value nf4/fp4 table, fp32, one per weight
DYNAMIC_MAP = "bitsandbytes name2qmap['dynamic']"
QUANTIZE_TABLES = "bitsandbytes CPU quantize_4bit tables"
QUANTIZE_TABLE_BYTES = (16 * 4, 15 * 4, 16 * 8)
"""On CPU, quantize_4bit is the Python backends/default/ops.py kernel (no CPU one is
registered); its first call in the process caches, for good, the 16-value code (fp32,
backends/utils.py _get_4bit_code's _code_4bit_cache) and, in the functools cache of
_get_4bit_quantize_bounds, the 15 fp32 midpoints and the int64 argsort order of that code:
252 bytes (measured with validate.measure.tracker seeing inside the kernel)."""


def quant_stat_bytes(n: int, double: bool) -> list[int]:
    """Bytes of the QuantState tensors of an n-element weight (bitsandbytes functional.py
    quantize_4bit; measured): absmax fp32 per 64-block, or with double quantisation absmax uint8
    per block + state2.absmax fp32 per 256 blocks + state2.code (256 fp32) + offset (fp32).

    >>> quant_stat_bytes(512 * 256, False), quant_stat_bytes(512 * 256, True)
    ([8192, 64], [2048, 64, 32, 1024, 4])
    """
    blocks = -(-n // BLOCKSIZE)
    if not double:
        return [blocks * 4, CODE_BYTES]
    return [blocks, CODE_BYTES, -(-blocks // 256) * 4, 256 * 4, 4]


def quantized_param(ops: Ops, label: str, count: int, rows: int) -> Value:
    """A Params4bit weight: two 4-bit values a byte (uint8), frozen, plus its QuantState
    tensors (alive all run, category quantization_stats); the first one also brings the
    process-global tables its quantisation caches (DYNAMIC_MAP, QUANTIZE_TABLES on CPU)."""
    v = ops.g.param(label, Poly.const(-(-count // 2)), 1, trainable=False, category="quantized_weights")
    v.rows, v.quant = rows, count
    double = ops.regime.quantization == "nf4-double"
    if double and not any(b.label == DYNAMIC_MAP for b in ops.g.buffers):
        # functional.quantize_blockwise caches create_dynamic_map() (256 fp32) on the weights'
        # device in the process-global name2qmap["dynamic"] at the first double quantisation
        ops.g.buffer(DYNAMIC_MAP, Poly.const(256 * 4), 4).storage.category = "quantization_stats"
    if ops.regime.device == "cpu" and not any(b.label.startswith(QUANTIZE_TABLES) for b in ops.g.buffers):
        for i, nbytes in enumerate(QUANTIZE_TABLE_BYTES):
            ops.g.buffer(f"{QUANTIZE_TABLES} {i}", Poly.const(nbytes), 4).storage.category = "quantization_stats"
    for i, nbytes in enumerate(quant_stat_bytes(count, double)):
        ops.g.buffer(f"{label} quant_state {i}", Poly.const(nbytes), 4).storage.category = "quantization_stats"
    return v


def linear_4bit(ops: Ops, x: Value, w: Value, tokens: Poly, n_out: int, name: str) -> Value:
    """bnb.nn.Linear4bit.forward (bitsandbytes 0.50.2 nn/modules.py, autograd MatMul4Bit):
    x.to(compute_dtype); gemm_4bit: on CPU the Python backends/default/ops.py
    _gemm_4bit_default_impl (bitsandbytes registers no CPU gemm_4bit), on CUDA
    backends/cuda/ops.py _dequant_linear_fallback (taken for every M here; its custom kernel for
    small M is not modelled): [nested: absmax dequantised (dequantize_blockwise, fp32 per block)
    + offset], the weight dequantised into a compute-dtype temporary (dequantize_4bit),
    F.linear; both freed when the op returns (on CPU the process holds them although a dispatch
    mode sees one op: measured with validate.measure.tracker seeing inside the kernel, and
    against the CPU allocator's own alloc/free stream); .to(input dtype). The caller holds its
    argument until forward returns. Nothing is saved but the packed weight (ctx.tensors, no
    saved-tensor hooks, so it never triggers a checkpoint recompute). Backward
    (MatMul4Bit.backward): [nested: absmax dequantised, fp32 per block], the weight dequantised
    in its original dtype, cast to the gradient's dtype when they differ, grad_A = grad @ W
    (measured op by op with validate.measure.tracker)."""
    g, regime = ops.g, ops.regime
    c, q, n = regime.bnb_compute_elt, regime.quant_elt, w.quant
    double = regime.quantization == "nf4-double"
    blocks = -(-n // BLOCKSIZE)
    xc = ops.to(x, c, f"{name} x.to(compute_dtype)")
    absmax = None  # backends/default/ops.py _gemm_4bit_default_impl, on every device
    if double:
        a1 = g.op(f"{name} dequantize absmax", [], Poly.const(blocks * 4), requires_grad=False)
        absmax = g.op(f"{name} absmax + offset", [a1], Poly.const(blocks * 4), requires_grad=False)
    deq = g.op(f"{name} dequantize_4bit", [absmax] if absmax else [], Poly.const(n * c),
               requires_grad=False, elt=c)
    extra = [deq] + ([absmax] if absmax else [])
    back = ([Temp(Poly.const(blocks * 4))] if double else []) + [Temp(Poly.const(n * q))]
    back += [FreeTemps(1)] if double else []  # dequantize_4bit's local absmax, on return
    if q != c:  # F.dequantize_4bit(B, state).to(grad_output.dtype): the first copy then freed
        back += [Temp(Poly.const(n * c)), FreeTemps(1)]
    out = g.op(f"{name} gemm_4bit", [xc, w] + extra, tokens * n_out * c, backward=back + [Grad(0)], elt=c)
    out = ops.to(out, x.elt, f"{name} .to(input dtype)")
    # the caller holds its argument, and the local `x` rebound to the cast, until forward returns
    ops.scope_end([x] + ([xc] if xc is not x else []))
    return out
