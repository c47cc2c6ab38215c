"""The sympy symbols of the model: b (micro_batch) and s (seq_len) are free in every expression;
architecture sizes enter as numbers fixed by the ModelSpec."""
import sympy

b, s = sympy.symbols("b s", positive=True, integer=True)
