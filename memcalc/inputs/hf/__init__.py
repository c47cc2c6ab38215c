"""Hugging Face config.json readers: every key modelled, inert with a reason, or refused.
"""
