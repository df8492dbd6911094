"""Every figure the docs quote, as a claim: its id, what it says, its unit and the target it is held to. The
benchmarks append records of these claims (benchmarks/results.py); docs/RESULTS.md shows each claim's current
record and the README's headline table is made from them. A claim is defined once, here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    words: str
    unit: str
    # The figure depends on the machine's speed (a time, a rate, a ratio of two timed programs, a loss reached in a
    # time budget): a record taken while the machine had more runnable threads than cores never becomes current
    # in place of one that was not.
    speed: bool
    command: str  # what measures it afresh
    target: tuple[str, float] | None = None  # (">=", 2.5): the value must compare so
    fmt: str = ""  # how the value is written; empty: the unit's default (UNIT_FORMATS)


UNIT_FORMATS = {"x": "{:.2f}×", "%": "{:.1f}%", "s": "{:.1f} s", "min": "{:.2f} min", "loss": "{:.3f}",
                "tokens/s": "{:,.0f} tokens/s", "MB": "{:,.0f} MB", "GiB": "{:.1f} GiB", "MB/s": "{:.2f} MB/s",
                "s/iter": "{:.2f} s/iter", "s/step": "{:.2f} s/step", "ms/step": "{:,.0f} ms/step"}

GROUPS = {
    "quickstart": "The quickstart and the README's walk-through",
    "shakespeare": "Tiny Shakespeare to val ≤ 1.88",
    "cpu10m": "nanoGPT's 10.7M model on a CPU",
    "data": "Data preparation, decoding and evaluation on a CPU",
    "gpu": "On one GPU",
    "planner": "The memory planner against measured peaks",
    "finetune": "Fine-tuning and RL",
    "runs": "Other experiments on a CPU: growth, continued pretraining, memory, serving",
    "forensics": "`data audit` and `data trace`",
    "testing": "The test suite",
}

_SHK = "python -m benchmarks.bench_shakespeare"
_TRAIN = "python -m benchmarks.bench_train"
_GPU = "python -m benchmarks.bench_gpu --steps 10 --fp8"
_MEM = "python -m benchmarks.bench_gpu --shapes --memory"
_SFT = "python -m benchmarks.bench_sft --lora"


def _planner(shape: str, batch: int, seq: int, ckpt: bool) -> Claim:
    how = "with activation checkpointing" if ckpt else "eager"
    return Claim(f"`burnout plan`'s peak for {shape} at {batch} × {seq}, {how}, against the measured peak "
                 "(above it: a run it lets start fits)", "%", False, _MEM + f" {shape}", (">", 0.0), "{:+.1f}%")


CLAIMS: dict[str, Claim] = {
    # The quickstart (`make demo`) and the walk-through of the README
    "quickstart.val_loss": Claim("`burnout quickstart`, 3 minutes on the CPU: val loss at the end", "loss", True,
                                 "python -m benchmarks.bench_quickstart"),
    "quickstart.tokens_per_s": Claim("`burnout quickstart`: training tokens/s over its run", "tokens/s", True,
                                     "python -m benchmarks.bench_quickstart"),
    "quickstart.loaded_gap": Claim("`burnout quickstart` beside two busy loops: its val bits per byte above a quiet "
                                   "run's", "%", False, "burnout quickstart beside two `python3 -c 'while True: "
                                   "pass'`, then alone; burnout eval RUN --tasks val", ("<=", 10.0), "{:+.1f}%"),
    "quickstart.walk_train_val_loss": Claim("the README's walk-through: `train … train.max_steps=200`'s val loss",
                                            "loss", False, "the README's walk-through", fmt="{:.4f}"),
    "quickstart.walk_train_minutes": Claim("the README's walk-through: `train`'s wall minutes", "min", True,
                                           "the README's walk-through"),
    "quickstart.walk_sft_minutes": Claim("the README's walk-through: `sft`'s wall minutes", "min", True,
                                         "the README's walk-through"),
    "quickstart.walk_sft_val_loss": Claim("the README's walk-through: `sft`'s val loss (assistant tokens)", "loss",
                                          False, "the README's walk-through", fmt="{:.4f}"),
    "quickstart.first_hour_minutes": Claim("`bench_first_hour`: raw text to an exported chat model (train --minutes "
                                           "6, sft --minutes 5), every step's wall minutes together", "min", True,
                                           "python -m benchmarks.bench_first_hour --root DIR"),
    # Tiny Shakespeare
    "shakespeare.val_loss": Claim("`burnout train shakespeare-fast`: val loss over the whole val split", "loss",
                                  False, _SHK, ("<=", 1.88)),
    "shakespeare.wall_s": Claim("`burnout train shakespeare-fast`: wall seconds from the command's start (data "
                                "prepared before)", "s", True, _SHK, ("<=", 40.0)),
    "shakespeare.with_prepare_s": Claim("the same, the command also preparing its data", "s", True,
                                        _SHK + " --include-prepare"),
    "shakespeare.nanogpt_s": Claim("nanoGPT's own CPU recipe for Tiny Shakespeare (its README's command): wall "
                                   "seconds from its start", "s", True, _SHK + " --nanogpt DIR"),
    "shakespeare.nanogpt_val_loss": Claim("nanoGPT's own CPU recipe: its last val loss (its estimate over "
                                          "eval_iters batches)", "loss", False, _SHK + " --nanogpt DIR"),
    # nanoGPT's 10.7M model
    "cpu10m.nanogpt_ratio": Claim("10.7M, ours against nanoGPT's own train.py: its s/iter over our s/step", "x", True,
                                  _TRAIN + " --nanogpt DIR", (">=", 2.5)),
    "cpu10m.nanogpt_s_per_iter": Claim("nanoGPT's train.py at the 10.7M shape: seconds an iteration", "s/iter", True,
                                       _TRAIN + " --nanogpt DIR"),
    "cpu10m.ours_s_per_step": Claim("ours at the 10.7M shape, beside nanoGPT: seconds a step", "s/step", True,
                                    _TRAIN + " --nanogpt DIR"),
    "cpu10m.hf_peer_ratio": Claim("10.7M `auto` on a CPU where auto trains in bf16: tokens/s over transformers' "
                                  "GPT2LMHeadModel at nanoGPT's settings", "x", True, _TRAIN, (">=", 2.5)),
    "cpu10m.hf_peer_ratio_fp32": Claim("the same on a CPU where auto trains in fp32 (no bf16 instructions)", "x", True,
                                       _TRAIN),
    "cpu10m.fp32_ratio": Claim("10.7M in fp32 against the same peer", "x", True, _TRAIN),
    "cpu10m.nodrop_ratio": Claim("10.7M `auto` without dropout against the peer with it", "x", True,
                                 _TRAIN + " --variants nodrop"),
    "cpu10m.tokens_per_s": Claim("10.7M `auto`: our tokens/s", "tokens/s", True, _TRAIN),
    "cpu10m.peer_tokens_per_s": Claim("10.7M: the transformers peer's tokens/s", "tokens/s", True, _TRAIN),
    "cpu10m.peak_rss_mb": Claim("10.7M `auto`: our peak RSS", "MB", False, _TRAIN),
    "cpu10m.peer_peak_rss_mb": Claim("10.7M: the transformers peer's peak RSS", "MB", False, _TRAIN),
    "cpu10m.data_fraction": Claim("10.7M: data loading's share of the step", "%", True, _TRAIN, ("<=", 2.0)),
    # Data, decoding, evaluation
    "data.workers_speedup": Claim("pre-tokenization: 2 workers' MB/s over one's", "x", True,
                                  "python -m benchmarks.bench_data --mb 10", (">=", 1.8)),
    "data.peak_rss_growth": Claim("pre-tokenization: peak RSS for 10× the text, over the small corpus's", "x", False,
                                  "python -m benchmarks.bench_data --mb 10"),
    "data.kv_decoding_ratio": Claim("KV-cached greedy decoding (llama-tiny, 32 + 128 tokens) against transformers' "
                                    "generate", "x", True, "python -m benchmarks.bench_generate", (">=", 1.5)),
    "data.hellaswag_ratio": Claim("HellaSwag scoring (200 items), lm-eval's time over ours, identical scores", "x",
                                  True, "python -m benchmarks.bench_eval", (">=", 2.0)),
    "data.arc_ratio": Claim("ARC-Easy scoring (200 items), lm-eval's time over ours, identical scores", "x", True,
                            "python -m benchmarks.bench_eval", (">=", 2.0)),
    "data.harness_arc_ratio": Claim("`eval --harness` ARC-Easy 0-shot against lm-eval's HF backend", "x", True,
                                    "python -m benchmarks.bench_harness --repeats 5", (">=", 2.0)),
    "data.harness_gsm8k_ratio": Claim("`eval --harness` GSM8K 8-shot generation against lm-eval's HF backend", "x",
                                      True, "python -m benchmarks.bench_harness --repeats 5", (">=", 2.0)),
    "data.trace_tokens_per_s": Claim("`data trace` scan, one thread", "M tokens/s", True,
                                     "python -m benchmarks.bench_trace --tokens 1000000000", (">=", 500.0),
                                     "{:,.0f}M tokens/s"),
    # GPU
    "gpu.llama1b.tokens_per_s": Claim("llama-1b, 16 × 2048, bf16, compiled: our tokens/s", "tokens/s", True, _GPU),
    "gpu.llama1b.mfu": Claim("llama-1b: our MFU over the GPU's dense bf16 datasheet peak", "%", True, _GPU,
                             (">=", 50.0)),
    "gpu.llama1b.peer_ratio": Claim("llama-1b: ours over transformers' LlamaForCausalLM step, the same settings", "x",
                                    True, _GPU, (">=", 1.3)),
    "gpu.gpt2_134m.tokens_per_s": Claim("gpt2-134m, 64 × 512, bf16, compiled: our tokens/s", "tokens/s", True, _GPU),
    "gpu.gpt2_134m.mfu": Claim("gpt2-134m: our MFU over the GPU's dense bf16 datasheet peak", "%", True, _GPU),
    "gpu.gpt2_134m.peer_ratio": Claim("gpt2-134m: ours over transformers' GPT2LMHeadModel step, the same settings",
                                      "x", True, _GPU, (">=", 1.3)),
    "gpu.fp8_ratio": Claim("llama-1b: fp8 (tensorwise) tokens/s over our bf16's", "x", True, _GPU, (">=", 1.25)),
    "gpu.fp8_loss_gap": Claim("llama-1b, 300 steps of 8 × 1024: fp8 (tensorwise) mean loss of the last 50 above "
                              "bf16's", "%", False, "python -m benchmarks.bench_gpu --shapes --curve DATA_DIR --fp8",
                              ("<=", 1.0), "{:+.2f}%"),
    "gpu.fp8_rowwise_loss_gap": Claim("the same with rowwise scaling", "%", False,
                                      "python -m benchmarks.bench_gpu --shapes --curve DATA_DIR --fp8 rowwise",
                                      ("<=", 1.0), "{:+.2f}%"),
    "gpu.sft_packing_ratio": Claim("llama-1b fine-tuning on Alpaca: packed rows' assistant targets/s over padded",
                                   "x", True, "python -m benchmarks.bench_gpu --shapes --steps 20 --packing RUN/data"),
    # The memory planner
    **{f"planner.eager.{s}.{b}x{t}{'.ckpt' * c}": _planner(s, b, t, c) for s, b, t, c in [
        ("llama-1b", 4, 2048, False), ("llama-1b", 8, 2048, False), ("llama-1b", 8, 2048, True),
        ("llama-1b", 16, 2048, True), ("gpt2-134m", 16, 512, False), ("gpt2-134m", 32, 512, False),
        ("gpt2-134m", 32, 512, True), ("gpt2-134m", 64, 512, True), ("llama-2b", 8, 2048, True),
        ("llama-3b", 8, 2048, True), ("llama-3b", 2, 2048, False)]},
    "planner.compiled.llama-1b.16x2048": Claim("`burnout plan`'s peak for llama-1b at 16 × 2048, compiled, against the "
                                               "measured peak", "%", False, _GPU, fmt="{:+.1f}%"),
    "planner.compiled.gpt2-134m.64x512": Claim("`burnout plan`'s peak for gpt2-134m at 64 × 512, compiled, against the "
                                               "measured peak", "%", False, _GPU, fmt="{:+.1f}%"),
    # Fine-tuning and RL
    "finetune.gsm8k_base": Claim("GSM8K, 200 test answers ending in `#### <number>`: the base", "%", False, _SFT),
    "finetune.gsm8k_full": Claim("the same after full SFT (800 steps)", "%", False, _SFT, (">=", 80.0)),
    "finetune.gsm8k_lora": Claim("the same after LoRA r=16 (800 steps)", "%", False, _SFT, (">=", 80.0)),
    "finetune.alpaca_stops": Claim("Alpaca: held-out answers that stop at `<|im_end|>` after 300 SFT steps", "%",
                                   False, "python -m benchmarks.bench_sft", (">=", 90.0)),
    "finetune.dpo_accuracy": Claim("DPO from the GSM8K fine-tune: held-out reward accuracy at its last evaluation",
                                   "%", False, "python -m benchmarks.bench_sft", (">=", 70.0)),
    "finetune.lora_step_ratio": Claim("LoRA r=16's step time over full fine-tuning's (8 × 512)", "x", True,
                                      "python -m benchmarks.bench_sft --tasks step-time"),
    "finetune.packing_ratio": Claim("SFT on a CPU: packed rows' assistant targets/s over padded", "x", True,
                                    "python -m benchmarks.bench_sft --tasks packing --base-steps 50 --timing-steps 20"),
    "finetune.dpo_packing_ratio": Claim("DPO on a CPU: packed pairs/s over padded", "x", True,
                                        "python -m benchmarks.bench_sft --tasks dpo-packing --base-steps 2 "
                                        "--timing-steps 30"),
    "finetune.rl_pass1_before": Claim("RL on two-digit additions: held-out pass@1 of the SFT model", "%", False,
                                      "python -m benchmarks.bench_rl"),
    "finetune.rl_pass1_after": Claim("the same after 150 GRPO steps", "%", False, "python -m benchmarks.bench_rl"),
    # Other experiments on a CPU
    "runs.growth_small_on": Claim("4 layers trained on for the FLOPs of growing to 8: val loss", "loss", False,
                                  "python -m benchmarks.bench_growth"),
    "runs.growth_grown": Claim("grown from 4 to 8 layers, trained on at equal FLOPs: val loss", "loss", False,
                               "python -m benchmarks.bench_growth"),
    "runs.growth_scratch": Claim("8 layers from scratch at equal FLOPs: val loss", "loss", False,
                                 "python -m benchmarks.bench_growth"),
    "runs.continued_fresh": Claim("Python's docs, then 150 steps of Shakespeare, a fresh optimizer: Shakespeare val "
                                  "loss", "loss", False, "python -m benchmarks.bench_continued_pretraining"),
    "runs.continued_carry": Claim("the same with the parent's optimizer moments carried", "loss", False,
                                  "python -m benchmarks.bench_continued_pretraining"),
    "runs.continued_scratch": Claim("150 steps of Shakespeare from scratch: Shakespeare val loss", "loss", False,
                                    "python -m benchmarks.bench_continued_pretraining"),
    **{f"runs.planner_cpu.{case}": Claim(f"`burnout plan`'s peak for bench_memory's {case} case against the CPU "
                                         "allocator's measured peak", "%", False,
                                         f"python -m benchmarks.bench_memory --device cpu --only {case}",
                                         fmt="{:+.2f}%")
       for case in ("llama-tiny", "llama-tiny-ckpt", "gpt2-10m", "llama-small-fp32", "gpt2-10m-compiled",
                    "llama-small-compiled")},
    **{f"runs.adamw8bit_bytes.{m}": Claim(f"8-bit AdamW's state bytes per parameter, {m}", "bytes/param", False,
                                          "python -m benchmarks.bench_optimizer_state", fmt="{:.3f} bytes")
       for m in ("llama-tiny", "llama-small")},
    **{f"runs.serve_rps.{n}": Claim(f"`burnout serve` (the quickstart's model), {n} client{'s' * (n > 1)}: "
                                    "requests/s", "requests/s", True, "python -m benchmarks.bench_serve RUN",
                                    fmt="{:.2f} requests/s") for n in (1, 4, 16)},
    # Forensics
    "forensics.audit_mb_per_cpu_s": Claim("`data audit`: MB of text per CPU-second (100 MB corpus)", "MB/s", False,
                                          "python -m benchmarks.bench_audit --mb 100 --small-mb 10"),
    "forensics.audit_peak_rss_mb": Claim("`data audit`: peak RSS for a 100 MB corpus", "MB", False,
                                         "python -m benchmarks.bench_audit --mb 100 --small-mb 10"),
    "forensics.plants_top_ten": Claim("planted garbage of the first five sets in its source's top ten", "cells",
                                      False, "python -m benchmarks.bench_audit_plants", fmt="{:,.0f} of 744 cells"),
    "forensics.sixth_set_top_ten": Claim("planted garbage of the sixth set (no rule tuned on it) in its source's top "
                                         "ten", "cells", False,
                                         "python -m benchmarks.bench_audit_plants --sets 'held out sixth'",
                                         fmt="{:,.0f} of 240 cells"),
    # The test suite
    "testing.suite_minutes": Claim("`make test`'s pytest on 2 quiet cores, at most", "min", True,
                                   "python -m benchmarks.bench_suite", fmt="{:.1f} min"),
    "testing.fast_minutes": Claim("`make test-fast`'s pytest on 2 quiet cores", "min", True,
                                  "python -m benchmarks.bench_suite --fast", ("<=", 3.0), "{:.1f} min"),
    "testing.mutants_surviving": Claim("mutants of the guarantees' functions that survive and are not equivalent",
                                       "mutants", False, "make mutation", ("<=", 0.0), "{:.0f}"),
}

# The README's headline table: (what, the measured cell, evidence). In the measured cell `{ID}` is claim ID's current
# figure, `{ID:torch}` the torch of that record, `{range:PREFIX}` the lowest to highest current figure of the claims
# whose ids start with PREFIX; a part in [brackets] is left out while a claim it names has no record.
README_ROWS = [
    ("The offline demo on a 2-core laptop-class CPU",
     "a 1.5M-parameter LLaMA, 3 minutes: val loss {quickstart.val_loss} (a uniform guess: 8.318)",
     "[PERFORMANCE.md](docs/PERFORMANCE.md#the-quickstart)"),
    ("Tiny Shakespeare, character level, to val ≤ 1.88 on 2 CPU cores",
     "val {shakespeare.val_loss} in {shakespeare.wall_s}[ (nanoGPT's own recipe: {shakespeare.nanogpt_s})]",
     "[PERFORMANCE.md](docs/PERFORMANCE.md#tiny-shakespeare-val--188-in--40-s)"),
    ("nanoGPT's 10.7M model on 2 CPU cores, beside nanoGPT's own train.py",
     "{cpu10m.nanogpt_ratio} its speed (goal ≥ 2.5×)",
     "[PERFORMANCE.md](docs/PERFORMANCE.md#the-107m-model-against-nanogpt)"),
    ("llama-1b on one H100",
     "{gpu.llama1b.tokens_per_s}, MFU {gpu.llama1b.mfu}, {gpu.llama1b.peer_ratio} transformers' compiled step "
     "(torch {gpu.llama1b.tokens_per_s:torch})",
     "[PERFORMANCE.md](docs/PERFORMANCE.md#on-a-gpu)"),
    ("HellaSwag / ARC-Easy scoring against lm-evaluation-harness",
     "identical scores, {data.hellaswag_ratio} / {data.arc_ratio} faster",
     "[PERFORMANCE.md](docs/PERFORMANCE.md#hellaswag-scoring--2-lm-eval-identical-scores)"),
    ("Will it fit? the memory planner against measured H100 peaks",
     "eager: every prediction above the peak, {range:planner.eager.} (134M to 3B); compiled: "
     "{planner.compiled.llama-1b.16x2048} and {planner.compiled.gpt2-134m.64x512}, within the 5% margin the plan adds",
     "[PERFORMANCE.md](docs/PERFORMANCE.md#memory-planner-accuracy)"),
    ("Fine-tuning a 4M model: GSM8K answers ending in `#### n`",
     "{finetune.gsm8k_base} → {finetune.gsm8k_full} (full SFT), {finetune.gsm8k_lora} (LoRA)",
     "[FINETUNING.md](docs/FINETUNING.md#the-evidence)"),
    ("Killed with SIGKILL at any moment, then resumed", "final weights bitwise equal to an uninterrupted run",
     "[RELIABILITY.md](docs/RELIABILITY.md)"),
    ("The tests behind those guarantees, mutated",
     "every non-equivalent mutant killed ({testing.mutants_surviving} survive)",
     "[TESTING.md](docs/TESTING.md#mutation-testing)"),
    ("What is in your data, and where a string came from", "`burnout data audit`, `burnout data trace`",
     "[FORENSICS.md](docs/FORENSICS.md)"),
]
