"""How fast `memcalc serve` answers a change of input.

    python benchmarks/bench_serve.py [--rounds 5] [--no-browser]

Two measurements, both against a real server on 127.0.0.1 (memcalc.serve.server.start):
1. the JSON API over HTTP (urllib): /api/answer after a change of micro-batch or sequence length
   (the engine's cached simulation), after a change of precision/checkpointing/attention/optimizer
   once the idle warmer has simulated those neighbours, and the same regime changes cold
   (a server without the warmer, each regime new to the process);
2. in the page, with Debian's chromium driven by playwright when both are there: the page's own
   figure (performance.now() from the input event to the answer drawn: body[data-last-ms]) for a
   sequence of input changes, back to back and then one a second (a person's pace: the warmer
   runs in the pauses).
Prints median, 95th percentile and max per kind, in ms.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
import urllib.parse
import urllib.request

from memcalc.serve.server import start

MODELS = ("gpt2", "llama-3-8b")
SHAPES = ([{"micro_batch": str(b)} for b in (1, 2, 3, 4, 6, 8)]
          + [{"seq_len": str(s)} for s in (256, 512, 777, 1000, 1024)])
REGIMES = [{"precision": "bf16-amp"}, {"checkpointing": "per-layer"}, {"attention": "eager"},
           {"optimizer": "adamw-8bit"}, {"precision": "fp16-amp"}, {"checkpointing": "selective"}]


def _get(base: str, q: dict) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(base + "api/answer?" + urllib.parse.urlencode(q)) as r:
        json.loads(r.read())
    return (time.perf_counter() - start) * 1000


def _stats(name: str, ms: list[float]) -> None:
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    print(f"  {name:<44} n={len(ms):3d}  median {statistics.median(ms):7.1f}  p95 {p95:7.1f}  max {ms[-1]:7.1f} ms")


def api(rounds: int) -> None:
    print("JSON API over HTTP (/api/answer):")
    warm_server = start(warm=True)
    base = f"http://127.0.0.1:{warm_server.server_port}/"
    shape, warmed = [], []
    for model in MODELS:
        q0 = {"model": model, "gpu": "H100-80GB", "micro_batch": "2", "seq_len": "1024"}
        _get(base, q0)  # the model's first answer (cold)
        for _ in range(rounds):
            shape += [_get(base, {**q0, **c}) for c in SHAPES]
        _wait_for_warmer(warm_server)
        warmed += [_get(base, {**q0, **c}) for c in REGIMES]
    warm_server.shutdown()
    cold_server = start(warm=False)
    base = f"http://127.0.0.1:{cold_server.server_port}/"
    cold, first = [], []
    for model in ("gpt2-medium", "qwen2-1.5b"):  # new to this process
        q0 = {"model": model, "gpu": "H100-80GB", "micro_batch": "2", "seq_len": "1024"}
        first.append(_get(base, q0))
        cold += [_get(base, {**q0, **c}) for c in REGIMES]
    cold_server.shutdown()
    _stats("change micro-batch / seq len", shape)
    _stats("change regime, warmed while idle", warmed)
    _stats("change regime, cold (no warmer)", cold)
    _stats("a model's first answer (cold)", first)


def _wait_for_warmer(server, limit_s: float = 120) -> None:
    """Until the warmer's queue is empty (it runs while no request comes)."""
    warmer = server.RequestHandlerClass.warmer
    deadline = time.monotonic() + limit_s
    while not warmer.jobs.empty() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the last job in flight


def browser(rounds: int, pause_s: float) -> None:
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = None
    if chromium is None:
        print("in the page: skipped (needs chromium on PATH and the playwright package)")
        return
    server = start(warm=True)
    url = f"http://127.0.0.1:{server.server_port}/?model=llama-3-8b&gpu=H100-80GB&micro_batch=2&seq_len=1024"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = b.new_context(bypass_csp=True).new_page()
        page.goto(url)
        page.wait_for_selector("body[data-state=ready]", timeout=120_000)
        _wait_for_warmer(server)
        shape, regime = [], []
        page.set_default_timeout(60_000)
        for i in range(rounds):
            for b_ in ("1", "3", "4", "8"):
                shape.append(_change(page, lambda: page.fill("#micro_batch", b_), pause_s))
            for s in ("512", "2048", str(900 + i)):
                shape.append(_change(page, lambda: page.fill("#seq_len", s), pause_s))
            for sel, v in (("#precision", "bf16-amp"), ("#checkpointing", "per-layer"), ("#precision", "fp32"),
                           ("#checkpointing", "none"), ("#attention", "eager"), ("#attention", "sdpa")):
                regime.append(_change(page, lambda: page.select_option(sel, v), pause_s))
        b.close()
    server.shutdown()
    print(f"in the page (chromium; input event -> answer drawn; {pause_s:g} s between changes):")
    _stats("change micro-batch / seq len", shape)
    _stats("change precision / checkpointing / attention", regime)


def _change(page, action, pause_s: float = 0.0) -> float:
    time.sleep(pause_s)
    before = int(page.get_attribute("body", "data-answers"))
    action()
    page.wait_for_function(f"Number(document.body.dataset.answers) > {before} && "
                           "document.body.dataset.state !== 'busy'", timeout=60_000)
    return float(page.get_attribute("body", "data-last-ms"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-browser", action="store_true")
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other work slows every figure)")
    api(args.rounds)
    if not args.no_browser:
        for pause_s in (0.0, 1.0):  # back to back, and at a person's pace
            browser(max(1, args.rounds // 2), pause_s)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
