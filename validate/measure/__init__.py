"""Measuring a training step: the live-tensor tracker, the step runner and the measurement backends.
"""
