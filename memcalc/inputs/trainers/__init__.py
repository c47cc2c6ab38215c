"""Trainer configs read into TrainingConfig fields: transformers.TrainingArguments, DeepSpeed JSON,
axolotl YAML.
"""
