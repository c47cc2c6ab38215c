"""TRL's DPOTrainer as a validated client (trl pinned in the `validate` extra): a real
trl.DPOTrainer (use_cpu, the DPOConfig given) on a random-weight HF model, a synthetic
preference dataset tokenised by a word-level tokenizer built in memory (nothing downloaded),
`steps` optimizer steps under the live-tensor tracker, measured per step as
validate.run.trainer_run measures the HF Trainer (its run_tracked_trainer, with TRL's config
class and trainer).

Every prompt has `prompt_len` tokens and every chosen and rejected completion
`seq_len - prompt_len` (the last the EOS), so DataCollatorForPreference pads nothing: the batch is
2 * per_device_train_batch_size rows of seq_len tokens, attention_mask all ones.

memcalc's prediction for it is TrainingConfig.from_trainer_args(the same fields, trainer='dpo');
measure_sft runs trl.SFTTrainer on the prompt and chosen completion of the same examples.
"""
from __future__ import annotations

import copy

import torch

from validate.measure.backends import Measurement
from validate.run.trainer_run import run_tracked_trainer, steady_measurement


def word_tokenizer(vocab_size: int):
    """A PreTrainedTokenizerFast over <pad>, <eos>, <unk> and the words w3 .. w{V-1}, split on
    spaces (special tokens that are no word's prefix: the tokenizer matches them inside words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def preference_dataset(vocab_size: int, examples: int, prompt_len: int, completion_len: int,
                       seed: int = 0):
    """A datasets.Dataset of prompt / chosen / rejected strings; completions end with EOS."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)

    def words(n: int) -> str:
        return " ".join(f"w{int(i)}" for i in torch.randint(3, vocab_size, (n,), generator=g))

    rows = [{"prompt": words(prompt_len), "chosen": " " + words(completion_len - 1) + " <eos>",
             "rejected": " " + words(completion_len - 1) + " <eos>"} for _ in range(examples)]
    return Dataset.from_list(rows)


def measure_dpo(spec, training, dpo_args: dict, prompt_len: int, hf_config: dict | None = None,
                steps: int = 3, seed: int = 0) -> Measurement:
    """Run trl.DPOTrainer for `steps` optimizer steps; steady-state peak over steps >= 2.
    `training` is the predicted TrainingConfig (micro_batch: the rows, 2x the pairs)."""
    import trl

    pairs = training.micro_batch // 2
    data = preference_dataset(spec.vocab_size, steps * pairs * training.grad_accum, prompt_len,
                              training.seq_len - prompt_len, seed)

    def make(model, args, meter):
        ref = None
        if training.lora is None and training.dpo_reference == "model":
            ref = copy.deepcopy(model).eval()  # what create_model_from_path loads: a second copy
        return trl.DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=data,
                              processing_class=word_tokenizer(spec.vocab_size),
                              peft_config=peft_config(training, model), callbacks=[meter])
    return _measure(spec, training, dpo_args, hf_config, steps, seed, make, "dpo")


def measure_sft(spec, training, sft_args: dict, prompt_len: int, hf_config: dict | None = None,
                steps: int = 3, seed: int = 0, example_len: int | None = None) -> Measurement:
    """Run trl.SFTTrainer (a prompt-completion dataset: completion_only_loss) for `steps`
    optimizer steps; steady-state peak over steps >= 2. Each example has `example_len` tokens
    (the row's length by default). With `packing` in `sft_args` (BFD) the rows are
    per_device_train_batch_size bins of max_length tokens, and max_length / example_len
    examples fill each exactly, so every micro-batch is one padding-free row of
    `training.seq_len` tokens (DataCollatorForLanguageModeling with padding_free: position_ids
    restarting per example; memcalc's attention_mask='packed'). With `padding_free` and no
    packing, the micro-batch's per_device_train_batch_size examples are that row.)"""
    import trl

    rows, row_len, per_row = training.micro_batch, training.seq_len, 1
    if sft_args.get("packing") or sft_args.get("padding_free"):  # one row of rows x row_len tokens
        rows = sft_args["per_device_train_batch_size"]
        row_len = sft_args["max_length"] if sft_args.get("packing") else training.seq_len // rows
        per_row = row_len // (example_len or row_len) if sft_args.get("packing") else 1
        if rows * row_len != training.seq_len or per_row * (example_len or row_len) != row_len:
            raise ValueError(f"packed SFT: {rows} rows of {row_len} tokens filled by examples of "
                             f"{example_len} must make the one row of {training.seq_len} tokens")
    example_len = example_len or row_len
    data = preference_dataset(spec.vocab_size, steps * rows * training.grad_accum * per_row,
                              prompt_len, example_len - prompt_len, seed)
    data = data.remove_columns("rejected").rename_column("chosen", "completion")

    def make(model, args, meter):
        return trl.SFTTrainer(model=model, args=args, train_dataset=data,
                              processing_class=word_tokenizer(spec.vocab_size), callbacks=[meter])
    return _measure(spec, training, sft_args, hf_config, steps, seed, make, "sft")


def _measure(spec, training, fields: dict, hf_config, steps: int, seed: int, make, kind: str) -> Measurement:
    """The tracked Trainer run of validate.run.trainer_run with TRL's config class (`kind`'s)
    and trainer (`make(model, config, meter)`), measured as the HF Trainer is."""
    import trl

    args = {**fields, "max_steps": steps}
    if kind != "grpo":  # GRPOConfig has no dataset_num_proc (no tokenised dataset)
        args["dataset_num_proc"] = None
    config = getattr(trl, {"dpo": "DPOConfig", "sft": "SFTConfig", "grpo": "GRPOConfig"}[kind])
    meter, model, description, tracker = run_tracked_trainer(
        spec, training, hf_config, args, seed, make=make, args_class=config, args_in_tracker=True,
        model_training=training.with_(checkpointing="none", lora=None, quantization="none"))
    return steady_measurement(meter, model, tracker, f"trl-{kind}:{description}")


def peft_config(training, model):
    """The LoraConfig DPOTrainer gets as `peft_config` (it wraps the model itself with
    get_peft_model, and its reference is then the base with adapters disabled; a PeftModel passed
    in instead gets a frozen "ref" copy of its adapter, which memcalc does not model), or None."""
    if training.lora is None:
        return None
    from peft import LoraConfig

    kwargs = training.lora.peft_kwargs()
    if getattr(model.config, "model_type", None) == "gpt2":
        kwargs["fan_in_fan_out"] = True  # Conv1D weights are (in, out), as validate.models.finetune
    return LoraConfig(**kwargs)


def grpo_tokenizer(vocab_size: int):
    """word_tokenizer's words, with <eos> at id vocab_size, outside the model's vocabulary: generate
    never samples it, so every completion runs to max_completion_length (GRPO's completion lengths
    then do not vary with the seed, and completion_mask is all ones: an unpadded batch). The
    model's own generation_config.eos_token_id (an id inside the vocabulary, which GRPOTrainer
    adds to the stop ids) is cleared by measure_grpo."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "w1": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}, "<eos>": vocab_size}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def length_reward(completions, **_kwargs) -> list[float]:
    """The reward function of the validator's GRPO runs: the completion's length in characters."""
    return [float(len(c)) for c in completions]


def measure_grpo(spec, training, grpo_args: dict, prompt_len: int, hf_config: dict | None = None,
                 steps: int = 3, seed: int = 0) -> Measurement:
    """Run trl.GRPOTrainer (generate with transformers, a Python reward) for `steps` optimizer
    steps on prompts of `prompt_len` words; the step's peak is measured from compute_loss to the
    end of the optimizer step, and the generation (_generate_single_turn) and scoring (from there
    to compute_loss: the no-grad log-prob passes) phases each on their own, steady state over
    steps >= 2 (result.phases)."""
    import trl
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    prompts = [" ".join(f"w{int(i)}" for i in torch.randint(3, spec.vocab_size, (prompt_len,), generator=g))
               for _ in range(steps * training.micro_batch)]
    data = Dataset.from_list([{"prompt": p} for p in prompts])
    spans: dict[str, list[int]] = {"generation": [], "scoring": []}

    def make(model, args, meter):
        import trl.trainer.grpo_trainer as module

        # beta != 0 without peft: GRPOTrainer loads the reference from the policy's path
        # (create_model_from_path, in eval mode); here the same weights, copied
        model.generation_config.eos_token_id = None  # validate.models.hf's 0 is <pad>, a sampled id
        loader = module.create_model_from_path
        module.create_model_from_path = lambda *_args, **_kwargs: copy.deepcopy(model).eval()
        try:
            trainer = trl.GRPOTrainer(model=model, reward_funcs=length_reward, args=args,
                                      train_dataset=data, processing_class=grpo_tokenizer(spec.vocab_size),
                                      peft_config=peft_config(training, model), callbacks=[meter])
        finally:
            module.create_model_from_path = loader
        _measure_spans(trainer, meter, spans)
        return trainer
    result = _measure(spec, training, grpo_args, hf_config, steps, seed, make, "grpo")
    for phase, peaks in spans.items():
        result.phases[phase] = max(peaks[1:])
        result.first_step_phases[phase] = peaks[0]
    return result


def _measure_spans(trainer, meter, spans: dict) -> None:
    """Wrap the trainer's generate call and compute_loss so that each phase's peak is read on its
    own: generation (_generate_single_turn), scoring (from its return to compute_loss), and the
    step (compute_loss to the optimizer step's end: the meter's own phases)."""
    generate, compute_loss = trainer._generate_single_turn, trainer.compute_loss

    def generation(*args, **kwargs):
        tracker = meter.tracker
        tracker.reset_peak()
        out = generate(*args, **kwargs)
        spans["generation"].append(tracker.peak)
        tracker.reset_peak()
        return out

    def loss(*args, **kwargs):
        spans["scoring"].append(meter.tracker.peak)
        meter.tracker.reset_peak()
        return compute_loss(*args, **kwargs)
    trainer._generate_single_turn, trainer.compute_loss = generation, loss
