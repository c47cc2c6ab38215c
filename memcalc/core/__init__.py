"""Foundations every layer uses: errors, units, byte polynomials, symbols, ceilings, argument checks,
bounded file reading, the input-model base.
"""
