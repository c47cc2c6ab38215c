"""Screenshots of `memcalc serve` for docs/ (docs/serve-*.png), taken with playwright driving
Debian's chromium (`apt-get install -y chromium`; `pip install playwright`).

    python scripts/serve_screenshots.py [--out docs]
"""
from __future__ import annotations

import argparse
import json
import shutil
import urllib.parse

from memcalc.serve.server import start

SMOL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_hidden_layers": 30,
        "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05, "rope_theta": 100000, "tie_word_embeddings": True,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "head_dim": 64}
SHOTS = {  # name -> the page's state (its query string)
    "fits": {"model": "llama-3.2-1b", "gpu": "RTX-4090", "micro_batch": "4", "seq_len": "2048",
             "precision": "bf16-amp", "checkpointing": "per-layer"},
    "does-not-fit": {"model": "llama-3-8b", "gpu": "RTX-4090", "micro_batch": "4", "seq_len": "2048",
                     "precision": "bf16-amp", "checkpointing": "per-layer", "optimizer_impl": "fused"},
    "pasted-config": {"config": json.dumps(SMOL, indent=1), "gpu": "L4", "micro_batch": "8",
                      "seq_len": "4096", "precision": "bf16-amp", "optimizer": "adamw-8bit"},
    "bad-input": {"model": "gpt2", "gpu": "H100-80GB", "micro_batch": "2", "seq_len": "4096"},
}


def main() -> None:
    from playwright.sync_api import sync_playwright

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="docs")
    args = p.parse_args()
    server = start(warm=False)
    base = f"http://127.0.0.1:{server.server_port}/?"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        for name, state in SHOTS.items():
            page.goto(base + urllib.parse.urlencode(state))
            page.wait_for_selector("body[data-state=ready], body[data-state=error]", timeout=120_000)
            page.wait_for_timeout(1500)  # the changes list, when it does not fit
            page.screenshot(path=f"{args.out}/serve-{name}.png", full_page=True)
            print(f"{args.out}/serve-{name}.png")
        browser.close()
    server.shutdown()


if __name__ == "__main__":
    main()
