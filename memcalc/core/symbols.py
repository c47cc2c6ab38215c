"""The sympy symbols of the model: b (micro_batch) and s (seq_len) are free in every expression,
L (num_layers) where memcalc.engine.depth derives the depth; the other architecture sizes enter as
numbers fixed by the ModelSpec."""
import sympy

b, s, L = sympy.symbols("b s L", positive=True, integer=True)
