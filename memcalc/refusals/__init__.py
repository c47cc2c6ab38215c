"""Whether a (model, training) step may be estimated: each refusal names the field and the fix.
"""
