"""`memcalc serve` in a real browser: Debian's chromium driven by playwright (installed by .ci/run;
no browser download). Starts the command on a free port, loads the page, asks three questions by
changing inputs, and checks every number shown against `memcalc estimate --json` run separately
with the flags the page's address bar holds; then bad input, a shared URL, and the JSON API's 400."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest

from memcalc.inputs.specs import ModelSpec

CHROMIUM = os.environ.get("MEMCALC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
try:
    import playwright.sync_api  # noqa: F401
    HAVE_PLAYWRIGHT = True
except ImportError:
    HAVE_PLAYWRIGHT = False

pytestmark = [
    pytest.mark.slow,  # a browser and a server: about 16 s
    pytest.mark.skipif(CHROMIUM is None,
                       reason="no chromium on PATH: `apt-get install -y chromium` (.ci/run does)"),
    pytest.mark.skipif(not HAVE_PLAYWRIGHT,
                       reason="playwright is not installed: `pip install playwright` (.ci/run does)"),
]

# a published config.json: HuggingFaceTB/SmolLM2-135M (hub config.json, fields memcalc reads)
SMOL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_hidden_layers": 30,
        "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05, "rope_theta": 100000, "tie_word_embeddings": True,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "head_dim": 64}


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-m", "memcalc.cli", "serve", "--port", "0", "--no-warm"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
    yield line.split()[2]
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        # bypass_csp: playwright's wait_for_function evaluates its predicate, which the page's
        # Content-Security-Policy (script-src 'self') would refuse; the page itself is unchanged
        pg = browser.new_context(bypass_csp=True, viewport={"width": 1200, "height": 1400}).new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(server)
        pg.wait_for_selector("body[data-state=ready]", timeout=60_000)
        yield pg
        assert not errors, errors
        browser.close()


def _answered(page, action) -> None:
    """Do `action`, then wait until the page has shown the answer to it."""
    before = int(page.get_attribute("body", "data-answers"))
    action()
    page.wait_for_function(f"Number(document.body.dataset.answers) > {before} && "
                           "document.body.dataset.state !== 'busy'", timeout=60_000)


def _shown(page) -> dict:
    """The numbers on the page, as `memcalc estimate --json` names them."""
    rows = lambda table, key: {r.get_attribute(f"data-{key}"): int(r.get_attribute("data-bytes"))  # noqa: E731
                               for r in page.query_selector_all(f"#{table} tbody tr")}
    return {"peak_bytes": int(page.get_attribute("#peak-bytes", "data-bytes")),
            "first_step_peak_bytes": int(page.get_attribute("#first-step-bytes", "data-bytes")),
            "phases": rows("phases", "phase"), "components": rows("components", "category")}


def _cli_flags(query: dict[str, str], tmp_path) -> list[str]:
    """The `memcalc estimate` flags of the page's query string (gpu is the page's alone)."""
    flags = []
    for key, value in query.items():
        if key == "gpu":
            continue
        if key == "config":
            path = tmp_path / "config.json"
            path.write_text(value)
            flags += ["--hf-config", str(path)]
            continue
        flags += ["--" + key.replace("_", "-"), value]
    return flags


def _check_against_cli(page, tmp_path) -> dict:
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(page.url).query))
    out = subprocess.run([sys.executable, "-m", "memcalc.cli", "estimate", *_cli_flags(query, tmp_path), "--json"],
                         capture_output=True, text=True, check=True)
    cli = json.loads(out.stdout)
    shown = _shown(page)
    assert shown["peak_bytes"] == cli["peak_bytes"]
    assert shown["first_step_peak_bytes"] == cli["first_step_peak_bytes"]
    assert shown["phases"] == cli["phases"]
    assert shown["components"] == {k: v for k, v in cli["components"].items() if v}
    # the GPU's usable memory and the headroom, against `memcalc gpus --json`
    gpus = json.loads(subprocess.run([sys.executable, "-m", "memcalc.cli", "gpus", "--json"], capture_output=True,
                                     text=True, check=True).stdout)["catalogue"]
    usable = next(g["usable_bytes"] for g in gpus if g["name"] == query["gpu"])
    assert int(page.get_attribute("#budget-bytes", "data-bytes")) == usable
    assert int(page.get_attribute("#headroom-bytes", "data-bytes")) == usable - cli["peak_bytes"]
    return query


def test_three_questions_equal_the_cli(page, tmp_path):
    # 1. gpt2, 4 x 1024 tokens in bf16 autocast on the default H100
    _answered(page, lambda: page.fill("#micro_batch", "4"))
    _answered(page, lambda: page.select_option("#precision", "bf16-amp"))
    q = _check_against_cli(page, tmp_path)
    assert (q["micro_batch"], q["precision"]) == ("4", "bf16-amp")
    assert "Fits on H100-80GB" in page.inner_text("#verdict")

    # 2. llama-3-8b at 2,048 tokens with per-layer checkpointing on an RTX 4090: does not fit
    _answered(page, lambda: page.select_option("#model", "llama-3-8b"))
    _answered(page, lambda: page.fill("#seq_len", "2048"))
    _answered(page, lambda: page.select_option("#checkpointing", "per-layer"))
    _answered(page, lambda: page.select_option("#gpu", "RTX-4090"))
    _check_against_cli(page, tmp_path)
    assert page.inner_text("#verdict").startswith("Does not fit on RTX-4090")
    assert int(page.get_attribute("#headroom-bytes", "data-bytes")) < 0
    # the search behind the changes replays the caching allocator for each candidate on device
    # bytes (memcalc.queries.preflight.check): 33 s on this 2-core machine, over playwright's 30 s
    page.wait_for_function("!document.querySelector('#changes').textContent.includes('looking')",
                           timeout=180_000)

    # 3. a pasted config.json (SmolLM2-135M), AdamW 8-bit
    _answered(page, lambda: page.select_option("#model", "__config"))  # empty config: an error line
    _answered(page, lambda: page.fill("#config", json.dumps(SMOL)))
    _answered(page, lambda: page.select_option("#optimizer", "adamw-8bit"))
    q = _check_against_cli(page, tmp_path)
    assert json.loads(q["config"]) == SMOL
    assert ModelSpec.from_hf_config(SMOL).param_count == int(page.inner_text("#moment").split("(")[-1]
                                                              .split()[1].replace(",", ""))

    # the curves cross the GPU's limit where estimate() says so (circles carry their bytes)
    for axis in ("micro_batch", "seq_len"):
        points = page.query_selector_all(f"#curve-{axis} circle")
        assert len(points) >= 5


def test_bad_input_is_one_line_naming_the_field(page):
    _answered(page, lambda: page.fill("#micro_batch", "0"))
    assert page.get_attribute("body", "data-state") == "error"
    line = page.inner_text("#error")
    assert line.startswith("micro_batch: ") and "\n" not in line
    _answered(page, lambda: page.fill("#micro_batch", "2"))
    assert page.get_attribute("body", "data-state") == "ready"


def test_a_shared_url_shows_the_same_answer(page):
    _answered(page, lambda: page.fill("#seq_len", "777"))
    url, peak = page.url, page.get_attribute("#peak-bytes", "data-bytes")
    other = page.context.new_page()
    other.goto(url)
    other.wait_for_selector("body[data-state=ready]", timeout=60_000)
    assert other.get_attribute("#peak-bytes", "data-bytes") == peak
    assert other.input_value("#seq_len") == "777"
    other.close()


def test_api_answers_400_with_the_field(server):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server + "api/answer?model=gpt2&precision=fp8")
    assert err.value.code == 400
    body = json.loads(err.value.read())
    assert body["field"] == "precision" and body["error"].startswith("precision: ")
    if not hasattr(ModelSpec, "from_pretrained"):  # hub ids: refused in one line until it exists
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server + "api/answer?model=meta-llama/Llama-3.1-8B")
        assert json.loads(err.value.read())["error"].startswith("model: ")
