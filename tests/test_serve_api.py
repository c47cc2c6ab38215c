"""`memcalc serve`'s JSON API and server without a browser (tests/test_serve_browser.py drives the
page): the answer against estimate() by a second route, the stacked bars against the phase peaks,
each curve point against estimate() at that point, bad input as one line naming the field, and a
page that reaches no other origin."""
import json
import re
import urllib.error
import urllib.request
from importlib import resources

import pytest

from memcalc import ModelSpec, TrainingConfig, estimate
from memcalc.core.errors import MemcalcError
from memcalc.serve import api
from memcalc.serve.server import _query, start

STATES = [{"model": "gpt2", "micro_batch": "3", "seq_len": "512", "precision": "bf16-amp"},
          {"model": "llama-3.2-1b", "gpu": "RTX-4090", "micro_batch": "2", "seq_len": "2048",
           "checkpointing": "per-layer", "optimizer": "adamw-8bit"},
          {"model": "qwen2-0.5b", "gpu": "L4", "micro_batch": "1", "seq_len": "4096", "lora_rank": "16",
           "attention": "eager"}]


@pytest.mark.parametrize("state", STATES)
def test_answer_is_estimate(state):
    a = api.answer(state)
    t = dict(micro_batch=int(state["micro_batch"]), seq_len=int(state["seq_len"]))
    t.update({k: state[k] for k in ("precision", "checkpointing", "optimizer", "attention") if k in state})
    if "lora_rank" in state:
        t["lora"] = {"rank": int(state["lora_rank"])}
    r = estimate(ModelSpec.preset(state["model"]), TrainingConfig(**t))
    assert a["peak_bytes"] == r.peak_bytes and a["estimate"]["phases"] == r.phases
    assert a["estimate"]["components"] == r.components
    assert a["fits"] == (r.peak_bytes <= a["budget_bytes"])
    # each stacked bar adds up to its phase's peak; the peak phase's bar is the peak's breakdown
    for phase, parts in a["breakdown"].items():
        assert sum(parts.values()) == r.phases[phase]
    assert a["breakdown"][r.peak_phase] == r.components
    # the curves pass through the answer, and each point is estimate() there
    for axis in ("micro_batch", "seq_len"):
        points = dict(map(tuple, a["curves"][axis]))
        assert points[t[axis]] == r.peak_bytes
        for x in list(points)[:: max(1, len(points) // 4)]:
            assert points[x] == estimate(ModelSpec.preset(state["model"]),
                                         TrainingConfig(**{**t, axis: x})).peak_bytes


@pytest.mark.parametrize("query, field", [({"micro_batch": "0"}, "micro_batch"), ({"seq_len": "1e3"}, "seq_len"),
                                          ({"precision": "fp8"}, "precision"), ({"colour": "red"}, "colour"),
                                          ({"gpu": "H1000"}, "gpu"), ({"model": "gpt5"}, "model"),
                                          ({"config": "{not json"}, "config"),
                                          ({"max_grad_norm": "nan"}, "max_grad_norm")])
def test_bad_input_names_the_field(query, field):
    with pytest.raises(MemcalcError) as err:
        api.answer(query)
    assert err.value.field == field and "\n" not in str(err.value)


def test_hub_ids_need_from_pretrained():
    if hasattr(ModelSpec, "from_pretrained"):
        pytest.skip("ModelSpec.from_pretrained exists: hub ids are read by it")
    with pytest.raises(MemcalcError, match="^model: .*from_pretrained"):
        api.answer({"model": "meta-llama/Llama-3.1-8B"})


def test_query_string_refuses_repeats():
    with pytest.raises(MemcalcError, match="^micro_batch: is given twice"):
        _query("micro_batch=1&micro_batch=2")


def test_the_page_reaches_no_other_origin():
    files = resources.files("memcalc.serve").joinpath("static")
    for name in ("page.html", "app.js", "style.css"):
        text = files.joinpath(name).read_text()
        urls = set(re.findall(r"https?://[^\s\"')]+", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (name, urls)  # the SVG namespace, not fetched
        assert "import(" not in text and "@import" not in text


def test_server_answers_and_refuses_over_http():
    server = start(warm=False)
    base = f"http://127.0.0.1:{server.server_port}/"
    try:
        with urllib.request.urlopen(base) as r:
            assert "default-src 'self'" in r.headers["Content-Security-Policy"]
            assert b"<script src=\"/app.js\">" in r.read()
        with urllib.request.urlopen(base + "api/answer?model=gpt2&micro_batch=2") as r:
            assert json.loads(r.read())["peak_bytes"] == estimate(
                ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=2, seq_len=1024)).peak_bytes
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "api/answer?model=gpt2&seq_len=x")
        assert err.value.code == 400 and json.loads(err.value.read())["field"] == "seq_len"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow  # a search of tens of cold estimates (memcalc.check)
def test_changes_with_adapters_are_json():
    """check's LoRA/QLoRA suggestions reach the page as JSON (the adapters as their fields)."""
    import json

    a = api.changes_answer({"model": "llama-3-8b", "gpu": "RTX-4090", "micro_batch": "4", "seq_len": "2048",
                            "precision": "bf16-amp", "checkpointing": "per-layer"})
    first = json.loads(json.dumps(a))["changes"][0]
    assert first["fields"]["lora"]["rank"] == 16 and first["fields"]["quantization"] == "nf4"
    assert first["headroom_bytes"] > 0 and first["gives_up"] == "the training"
