"""Running validation cases: the `python -m validate` CLI, cases, the runner, comparison with
predictions, the HF Trainer client, demos.
"""
