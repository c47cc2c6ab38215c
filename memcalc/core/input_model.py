"""The base of memcalc's input models (ModelSpec, TrainingConfig, MoESpec): frozen pydantic v2
models that forbid unknown fields, take no coercions (strict) and no inf/nan, and turn every
validation failure into one SpecError naming the field (memcalc.core.errors.from_pydantic), however
they are built (`Model(...)` or `Model.make(...)`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from memcalc.core.errors import from_pydantic

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11


class FrozenModel(BaseModel):
    """A frozen, strict input model whose validation failures are SpecErrors.

    >>> from memcalc.inputs.training import TrainingConfig
    >>> TrainingConfig.make(micro_batch=0, seq_len=8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: micro_batch: ...
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    error_name: ClassVar[str | None] = None
    """The name a cross-field failure is reported under (None: the class's name)."""

    def __init__(self, **fields: object) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as err:  # one SpecError naming the field
            raise from_pydantic(err, self.error_name or type(self).__name__) from None

    @classmethod
    def make(cls, **fields: object) -> Self:
        """Build one, a validation failure raised as one SpecError naming the field.

        >>> from memcalc.inputs.specs import ModelSpec
        >>> ModelSpec.make(family="gpt2", vocab_size=100, hidden_size=64, num_layers=2, num_heads=4).head_size
        16
        """
        return cls(**fields)
