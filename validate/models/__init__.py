"""Building the models the validator trains: reference models, HF models from a spec, peft set-ups, MoE
routing records.
"""
