"""TracedSpec: a ModelSpec whose program is traced from the user's own nn.Module (issue 25; no torch).

`ModelSpec.from_module(factory, ...)` registers the factory, loss and vocabulary under a key and
returns a TracedSpec naming that key; the engine (memcalc.engine.run.candidates) asks the spec for
its candidates, which memcalc.traced.build traces (FakeTensorMode, a few small shapes), fits and
caches per training regime. The architecture fields a hand-written family reads (hidden_size,
num_heads, ...) mean nothing here and are left at 1; num_layers is what the caller says.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Any, Callable

from pydantic import model_validator

from memcalc.inputs.specs import ModelSpec


@dataclass(frozen=True)
class TracedModel:
    """What a traced program is made from: the model factory (() or (TrainingConfig) -> nn.Module),
    the loss (model, batch) -> 0-d tensor, and the batch: the vocabulary of (b, s) int64 token
    ids, or a function (b, s) -> the batch tensor (an image batch whose s is its patch count)."""

    factory: Callable
    loss: Callable | None
    inputs: int | Callable
    far_seq_len: int | None = None
    """A sequence length far beyond the fitting shapes at which the fit is checked too (None: not
    checked). A size that steps with s, such as a chunked scan padding s to a multiple of its
    chunk (Qwen3-Next's gated delta rule: 64; Mamba-2: chunk_size) or a Python loop over blocks
    of s (MiniMax's lightning attention: 256), is constant over small shapes and would fit as a
    polynomial that is wrong past the first chunk; the far check refuses it by the storage or the
    op. Free under FakeTensorMode (no compute), but the model must accept the length."""


TRACED: dict[str, TracedModel] = {}
"""The registered models by key (this process)."""
_IDS = count()


def from_module(factory: Callable, inputs: int | Callable, loss: Callable | None = None, *, name: str = "module",
                num_layers: int = 1, far_seq_len: int | None = None) -> "TracedSpec":
    """Register a model and return its spec (memcalc.inputs.specs.ModelSpec.from_module documents it).

    >>> spec = from_module(lambda: None, 16, name="m")
    >>> spec.trace_key.startswith("m#"), spec.vocab_size
    (True, 16)
    """
    key = f"{name}#{next(_IDS)}"
    TRACED[key] = TracedModel(factory, loss, inputs, far_seq_len)
    vocab = inputs if isinstance(inputs, int) else 1  # a batch function: no vocabulary
    return TracedSpec(name=name, trace_key=key, vocab_size=vocab, num_layers=num_layers)


class TracedSpec(ModelSpec):
    """A model traced from its nn.Module (memcalc.traced).

    >>> TracedSpec(trace_key="k", vocab_size=8).family
    'traced'
    """

    family: str = "traced"  # type: ignore[assignment]
    implementation: str = "traced"  # type: ignore[assignment]
    trace_key: str
    hidden_size: int = 1
    num_layers: int = 1
    num_heads: int = 1
    max_position_embeddings: int = 2 ** 40

    @model_validator(mode="after")
    def _check_shapes(self) -> "TracedSpec":  # no family declaration to check against
        return self

    @property
    def traced(self) -> TracedModel:
        """The registered factory, loss and vocabulary."""
        from memcalc.core.errors import SpecError

        found = TRACED.get(self.trace_key)
        if found is None:
            raise SpecError("model", f"no traced model {self.trace_key!r} in this process",
                            "build the spec with ModelSpec.from_module(...) first")
        return found

    @property
    def param_count(self) -> int:
        """Trainable parameters, as the traced model's parameters() counts them."""
        from memcalc.traced.build import param_count

        return param_count(self)

    def traced_candidates(self, training: Any) -> Any:
        """The engine's candidate moments of this model under `training` (memcalc.traced.build)."""
        from memcalc.traced.build import traced_candidates

        return traced_candidates(self, training)


class ModuleRef:
    """A factory, loss or batch function named 'pkg.mod:name', imported on first use (so that a
    validation matrix names models without importing torch; memcalc.traced.disk keys the cache
    by the module's source, as for the object itself).

    >>> ref = ModuleRef("memcalc.traced.spec:from_module")
    >>> ref.resolve() is from_module, ref.ref
    (True, 'memcalc.traced.spec:from_module')
    """

    def __init__(self, ref: str):
        self.ref = ref

    def resolve(self) -> Callable:
        """The object the reference names."""
        from importlib import import_module

        module, _, name = self.ref.partition(":")
        return getattr(import_module(module), name)

    @property
    def __signature__(self) -> Any:  # what inspect.signature reads: the target's own
        import inspect

        return inspect.signature(self.resolve())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)
