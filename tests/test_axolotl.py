"""axolotl YAML -> TrainingArguments fields -> TrainingConfig, and `memcalc check --axolotl`."""
import pytest

from memcalc.inputs.trainers.axolotl import axolotl_fields
from memcalc.cli import main
from memcalc.core.errors import MemcalcError
from memcalc.inputs.training import TrainingConfig

pytest.importorskip("yaml")

# shaped on axolotl's examples/llama-3/fft-8b.yaml (full fine-tune), clipping off
EXAMPLE = """\
base_model: meta-llama/Meta-Llama-3-8B
load_in_8bit: false
load_in_4bit: false
strict: false
datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
dataset_prepared_path: last_run_prepared
val_set_size: 0.05
output_dir: ./outputs/out
sequence_len: 2048
sample_packing: false
pad_to_sequence_len: true
wandb_project:
gradient_accumulation_steps: 8
micro_batch_size: 1
num_epochs: 1
optimizer: adamw_torch_fused
lr_scheduler: cosine
learning_rate: 2e-5
train_on_inputs: false
group_by_length: false
bf16: auto
tf32: false
gradient_checkpointing: true
max_grad_norm: 0
logging_steps: 1
warmup_steps: 100
evals_per_epoch: 2
saves_per_epoch: 1
weight_decay: 0.0
special_tokens:
  pad_token: <|end_of_text|>
"""


def test_example_gives_the_config_by_hand(tmp_path):
    path = tmp_path / "config.yml"
    path.write_text(EXAMPLE)
    fields, seq_len, mask = axolotl_fields(str(path))
    t = TrainingConfig.from_trainer_args(fields, seq_len=seq_len, attention_mask=mask, pad_tokens=1)
    by_hand = TrainingConfig(micro_batch=1, seq_len=2048, grad_accum=8, precision="bf16-amp",
                             optimizer="adamw", optimizer_impl="fused", weight_decay=0.0,
                             checkpointing="per-layer", device="cuda", attention_mask="padded",
                             pad_tokens=1, labels="separate", num_items_in_batch=True, hf_trainer=True)
    assert t == by_hand


@pytest.mark.parametrize("text, field", [
    ("adapter: lora\n", "axolotl.adapter"),
    ("sample_packing: true\n", "axolotl.sample_packing"),
    ("micro_batchsize: 2\n", "axolotl.micro_batchsize"),
])
def test_refused_by_name(text, field):
    import yaml

    with pytest.raises(MemcalcError, match=f"^{field}:"):
        axolotl_fields(yaml.safe_load(text))


def test_cli(tmp_path, capsys):
    path = tmp_path / "config.yml"
    path.write_text(EXAMPLE)
    with pytest.raises(SystemExit) as exit_:
        main(["check", "--axolotl", str(path), "--model", "gpt2", "--seq-len", "1024", "--gpu", "H100-80GB"])
        raise SystemExit(0)
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("fits: ")
    bad = tmp_path / "bad.yml"
    bad.write_text("micro_batch_size: [1\n")
    with pytest.raises(SystemExit) as exit_:
        main(["check", "--axolotl", str(bad), "--model", "gpt2", "--gpu", "H100-80GB"])
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith("memcalc: error: axolotl: ")
