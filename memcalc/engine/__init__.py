"""The engine: the regime derived once from TrainingConfig, one simulation of a step, depth as a
symbol, and the cached orchestration.
"""
