"""Checks inside the user's own run: memcalc.integrations.hf.MemoryCheckCallback (the HF Trainer)
and memcalc.integrations.watch.watch (a plain PyTorch loop). torch and transformers are imported
only by these modules, when used; the engine never imports them."""
