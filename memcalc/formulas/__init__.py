"""One module per memory component; each formula is plain arithmetic on ints or sympy symbols."""
