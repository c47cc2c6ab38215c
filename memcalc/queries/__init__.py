"""Questions asked of the engine: estimate, capacity, grids, plans, tables, plots, the pre-flight
check.
"""
