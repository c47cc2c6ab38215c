"""What the user gives: the model (ModelSpec, presets, MoE, LoRA), the training step (TrainingConfig),
GPUs, and the readers of HF configs and trainer configs.
"""
