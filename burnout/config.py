"""Typed configuration: model, data, tokenizer and training sections of a run.

A run config is YAML. Each section maps onto a dataclass below; unknown keys, wrong types and
impossible values are rejected with a BurnoutError that names the offending key. Model presets live
in `burnout/configs/models/NAME.yaml`; a run config may name one (`model: llama-1b`) or name one and change
fields (`model: {preset: llama-1b, n_layer: 8}`). Command-line overrides are `dotted.key=value`
strings whose value is parsed as YAML (`train.lr=3e-4`, `model.tie_embeddings=false`).
"""

from __future__ import annotations

import copy
import dataclasses
import decimal
import json
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from burnout.base.files import CHECKPOINT_DIR, EOT_TOKEN
from burnout.base.text import first_line
from burnout.base.values import SEED_MAX, checked_number
from burnout.errors import BurnoutError

# tokenizer.chat_template of a chat model (burnout/core/chat_template.py renders it).
CHATML = "chatml"
CONFIG_DIR = Path(__file__).resolve().parent / "configs"  # package data (pyproject: package-data)
MODEL_PRESET_DIR = CONFIG_DIR / "models"


@dataclass
class ModelConfig:
    family: Literal["gpt2", "llama"] = "llama"
    vocab_size: int = 32000
    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    # None means one key/value head per query head (plain multi-head attention).
    n_kv_head: int | None = None
    # None means 4·d_model (gpt2) or 8/3·d_model rounded up to ffn_multiple_of (llama).
    ffn_hidden: int | None = None
    ffn_multiple_of: int = 256
    context_length: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # None means the family's convention: biases in gpt2, none in llama.
    bias: bool | None = None
    tie_embeddings: bool = True
    dropout: float = 0.0
    attention: Literal["sdpa", "math"] = "sdpa"

    def resolved(self) -> ModelConfig:
        """A copy with every family-dependent default made explicit, validated."""
        cfg = dataclasses.replace(self)
        if cfg.n_kv_head is None:
            cfg.n_kv_head = cfg.n_head
        if cfg.bias is None:
            cfg.bias = cfg.family == "gpt2"
        if cfg.ffn_hidden is None:
            if cfg.family == "gpt2":
                cfg.ffn_hidden = 4 * cfg.d_model
            else:
                m = cfg.ffn_multiple_of
                _require_positive("model.ffn_multiple_of", m)  # before it divides
                cfg.ffn_hidden = m * -(-(8 * cfg.d_model // 3) // m)
        cfg.validate()
        return cfg

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def validate(self) -> None:
        for key in ("vocab_size", "n_layer", "d_model", "n_head", "context_length", "ffn_multiple_of"):
            _require_positive(f"model.{key}", getattr(self, key))
        for key in ("n_kv_head", "ffn_hidden"):
            if getattr(self, key) is not None:
                _require_positive(f"model.{key}", getattr(self, key))
        if self.d_model % self.n_head:
            raise BurnoutError(
                f"model.n_head: {self.n_head} heads do not divide d_model={self.d_model}; "
                "choose n_head so that d_model / n_head is a whole number"
            )
        if self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise BurnoutError(
                f"model.n_kv_head: {self.n_kv_head} key/value heads do not divide n_head={self.n_head}; "
                "choose a divisor of n_head"
            )
        if self.family == "llama" and self.head_dim % 2:
            raise BurnoutError(
                f"model.n_head: RoPE needs an even head dimension, but d_model/n_head = {self.head_dim}"
            )
        if self.family == "gpt2" and self.n_kv_head not in (None, self.n_head):
            raise BurnoutError("model.n_kv_head: the gpt2 family uses plain multi-head attention; remove n_kv_head")
        if not 0.0 <= self.dropout < 1.0:
            raise BurnoutError(f"model.dropout: {self.dropout} is outside [0, 1)")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise BurnoutError("model.rope_theta and model.norm_eps must be positive")


@dataclass
class SourceConfig:
    name: str
    # stdlib_docs / stdlib_code: the embedded default corpus, built from this Python installation.
    # text / jsonl / parquet: local files (a path, folder or glob; .gz, .bz2 and .zst are decompressed).
    # hf: a Hugging Face dataset streamed by name (`dataset`, `subset`, `split`; `data_files` for
    #     the file-based builders such as "json" or "parquet").
    kind: Literal["stdlib_docs", "stdlib_code", "text", "jsonl", "parquet", "hf"]
    weight: float = 1.0
    path: str | None = None
    text_field: str = "text"
    # text sources: one document per file, per blank-line separated block, per line, or per piece between
    # occurrences of `separator` (e.g. "<|endoftext|>", on one line), without the whitespace around it.
    split_by: Literal["file", "paragraph", "line", "separator"] = "file"
    separator: str | None = None
    # When `path` does not exist: download it from `url` (checked against `sha256` when given).
    url: str | None = None
    sha256: str | None = None
    dataset: str | None = None
    subset: str | None = None
    split: str = "train"
    data_files: str | None = None

    def validate(self, where: str) -> None:
        if self.weight < 0:
            raise BurnoutError(f"{where}.weight: {self.weight} is negative; weights must be >= 0")
        if self.kind in ("text", "jsonl", "parquet") and not self.path:
            raise BurnoutError(f"{where}.path: a '{self.kind}' source needs a path to its files")
        if self.kind == "hf" and not self.dataset:
            raise BurnoutError(f"{where}.dataset: an 'hf' source needs a dataset name (e.g. HuggingFaceFW/fineweb-edu)")
        if self.sha256 is not None and not (len(self.sha256) == 64 and set(self.sha256) <= set("0123456789abcdef")):
            raise BurnoutError(f"{where}.sha256: expected 64 lowercase hex digits")
        if (self.split_by == "separator") != (self.separator is not None):
            raise BurnoutError(f"{where}: split_by: separator and a separator string go together; set both "
                               "(e.g. separator: '<|endoftext|>') or neither")
        if self.separator is not None and (not self.separator.strip() or set("\r\n") & set(self.separator)):
            raise BurnoutError(f"{where}.separator: {self.separator!r} must hold something other than spaces, on "
                               "one line (blank lines between documents: split_by: paragraph)")


@dataclass
class DataConfig:
    sources: list[SourceConfig] = field(
        default_factory=lambda: [
            SourceConfig(name="docs", kind="stdlib_docs", weight=0.7),
            SourceConfig(name="code", kind="stdlib_code", weight=0.3),
        ]
    )
    # A folder already written by `burnout data prepare`; when set, `sources` are not read again.
    prepared_dir: str | None = None
    # Size of the character sample the tokenizer is trained on (each source gives weight/sum(weights)
    # of it); when max_tokens is unset, the token count of that sample is also the token budget.
    max_chars: int = 2_800_000
    # Token budget of the prepared data (train + val); each source gives weight/sum(weights) of it.
    max_tokens: int | None = None
    val_fraction: float = 0.05
    # documents: val a fair sample of the text by tokens (data/split.py): whole documents sampled within their
    # length class, each with val_fraction as its chance; one larger than its source's share of val is cut, its
    # last val_fraction of tokens to val.
    # contiguous: every document is cut in two, its first 1 - val_fraction of tokens to train and the
    # rest to val (nanoGPT's split of one file: with a char tokenizer, a 90/10 split by characters).
    split: Literal["documents", "contiguous"] = "documents"
    seed: int = 1337
    # Tokens per shard file; the last shard of a split holds the remainder.
    shard_tokens: int = 100_000_000
    # Cleaning: none (text as is), lenient (NFC, control characters removed), balanced (lenient plus
    # whitespace tidied and documents that are mostly non-text dropped), strict_ascii (balanced, then
    # accents folded and other non-ASCII characters removed).
    clean: Literal["none", "lenient", "balanced", "strict_ascii"] = "none"
    # Documents shorter than this after cleaning are dropped.
    min_chars: int = 0
    # Drop exact duplicate documents (after cleaning), across all sources.
    dedup: bool = False
    # Regular expressions counted per document (with examples in meta); matching documents are removed
    # when drop_junk is true.
    junk_patterns: list[str] = field(default_factory=list)
    drop_junk: bool = False

    def validate(self) -> None:
        if not self.sources:
            raise BurnoutError("data.sources: the list is empty; name at least one source")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise BurnoutError(f"data.sources: source names must be unique, got {names}")
        for i, source in enumerate(self.sources):
            source.validate(f"data.sources[{i}]")
        if sum(s.weight for s in self.sources) <= 0:
            raise BurnoutError("data.sources: the weights sum to zero; give at least one source a positive weight")
        _check_seed("data.seed", self.seed)
        _require_positive("data.max_chars", self.max_chars)
        if self.max_tokens is not None:
            _require_positive("data.max_tokens", self.max_tokens)
        _require_positive("data.shard_tokens", self.shard_tokens)
        if self.min_chars < 0:
            raise BurnoutError(f"data.min_chars: {self.min_chars} is negative")
        if not 0.0 < self.val_fraction < 0.5:
            raise BurnoutError(f"data.val_fraction: {self.val_fraction} is outside (0, 0.5)")
        import re

        for i, pattern in enumerate(self.junk_patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise BurnoutError(f"data.junk_patterns[{i}]: {pattern!r} is not a valid regular expression "
                                   f"({exc})") from None


@dataclass
class TokenizerConfig:
    # bpe / char: trained on the data. gpt2: GPT-2's byte-level BPE read from vocab_path + merges_path.
    kind: Literal["bpe", "char", "gpt2"] = "bpe"
    vocab_size: int = 4096
    min_frequency: int = 2
    special_tokens: list[str] = field(default_factory=lambda: [EOT_TOKEN])
    vocab_path: str | None = None
    merges_path: str | None = None
    # chatml (CHATML): a chat model's tokenizer, holding <|im_start|>/<|im_end|>; the one statement that a
    # checkpoint is a chat model. Set by the fine-tune that made it; None for a base model.
    chat_template: Literal["chatml"] | None = None

    def validate(self) -> None:
        _require_positive("tokenizer.vocab_size", self.vocab_size)
        _require_positive("tokenizer.min_frequency", self.min_frequency)
        if EOT_TOKEN not in self.special_tokens:
            raise BurnoutError("tokenizer.special_tokens: must include '<|endoftext|>' (the document separator)")
        if self.kind == "gpt2":
            for key in ("vocab_path", "merges_path"):
                if not getattr(self, key):
                    raise BurnoutError(f"tokenizer.{key}: the gpt2 tokenizer needs {key} "
                                       f"(GPT-2's vocab.json / merges.txt)")


@dataclass
class PhaseConfig:
    """One leg of a run: training stops at `steps` (counted from the run's start) with a summary."""
    name: str
    steps: int
    # Dollars (or the hardware price's units) this phase may cost; compared with the actual spend.
    budget: float | None = None


class TrainSection:
    """A section of train (train.optim, train.checkpoint, ...). Its fields' names are unique across train, so each
    is also named train.KEY, its short name: on the command line (train.lr=3e-4), in messages and in the flat
    train section of configs written before the sections (regroup_train), as TrainConfig's attribute too."""


@dataclass
class OptimConfig(TrainSection):
    """train.optim: the optimizer, its learning-rate schedule and what a step does with a bad gradient."""
    # adamw: AdamW for every weight. muon: Muon (momentum, then each update orthogonalized) for the
    # blocks' attention and MLP matrices, with AdamW at lr for embeddings, head, norms and biases
    # (modded-nanogpt's split); the schedule scales muon_lr as it scales lr, weight_decay applies to both.
    # adamw8bit: torchao's AdamW8bit, AdamW with both moments quantized to 8 bits in blocks of 256 values
    # (about 2 bytes per parameter of state instead of 8; needs torchao; not under fsdp).
    optimizer: Literal["adamw", "muon", "adamw8bit"] = "adamw"
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    # cosine / linear: decay from the end of warmup to the last step; wsd: flat, then a linear decay
    # over the last decay_fraction of the steps (warmup-stable-decay).
    schedule: Literal["cosine", "linear", "wsd"] = "cosine"
    decay_fraction: float = 0.2
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # Non-finite losses in a row tolerated (each such step is skipped) before the run stops.
    max_bad_steps: int = 5

    def validate(self) -> None:
        if self.lr <= 0:
            raise BurnoutError(f"train.lr: {self.lr} must be positive")
        if self.muon_lr <= 0:
            raise BurnoutError(f"train.muon_lr: {self.muon_lr} must be positive")
        if not 0 <= self.muon_momentum < 1:
            raise BurnoutError(f"train.muon_momentum: {self.muon_momentum} is outside [0, 1)")
        if not 0 <= self.min_lr <= self.lr:
            raise BurnoutError(f"train.min_lr: {self.min_lr} must lie in [0, train.lr={self.lr}]")
        if self.warmup_steps < 0:
            raise BurnoutError(f"train.warmup_steps: {self.warmup_steps} is negative")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise BurnoutError("train.weight_decay and train.grad_clip must be >= 0")
        if not 0 < self.decay_fraction <= 1:
            raise BurnoutError(f"train.decay_fraction: {self.decay_fraction} is outside (0, 1]")
        _require_positive("train.max_bad_steps", self.max_bad_steps)


@dataclass
class EvalConfig(TrainSection):
    """train.eval: how often and on how much the run is evaluated, and the sample it writes each time."""
    eval_interval: int = 200
    eval_batches: int = 20
    # Benchmarks scored at each evaluation, named as `burnout eval --tasks` names them (hellaswag, arc_easy,
    # lambada, icl:FILE.yaml), each on its first eval_task_items items (of each category), logged as
    # eval/TASK/METRIC; their files under eval_data_root (default: $BURNOUT_EVAL_DATA, else shared/data).
    eval_tasks: list[str] = field(default_factory=list)
    eval_task_items: int = 500
    eval_data_root: str | None = None
    # What each evaluation samples sample_tokens of (0: no sample). "" (the default): the opening words of lines of the
    # run's own val split, drawn with its seed (a pretraining run's; a fine-tune samples none), all recorded in
    # RUN/sample_prompts.json, which `generate`'s suggestion, compare, the report and the playground read.
    sample_prompt: str = ""
    sample_tokens: int = 64

    def validate(self) -> None:
        for key in ("eval_interval", "eval_batches", "eval_task_items"):
            _require_positive(f"train.{key}", getattr(self, key))
        if "val" in self.eval_tasks:
            raise BurnoutError("train.eval_tasks: val is measured at every evaluation already (val_loss); list "
                               "benchmarks only, e.g. [hellaswag]")
        if self.sample_tokens < 0:
            raise BurnoutError(f"train.sample_tokens: {self.sample_tokens} is negative")


@dataclass
class CheckpointConfig(TrainSection):
    """train.checkpoint: when checkpoints are written, which are kept, and where they are copied."""
    ckpt_interval: int = 500
    # Also a checkpoint once this many minutes of wall time have passed since the last one (None or 0: by steps only),
    # so a slow step costs at most that much work when the machine vanishes.
    ckpt_minutes: float | None = None
    keep_last: int = 2
    # Steps whose checkpoints are kept forever (phase ends are kept too).
    milestones: list[int] = field(default_factory=list)
    # Keep the checkpoint of the lowest val loss too, whatever keep_last prunes; every checkpoint is then
    # evaluated at its own step.
    keep_best: bool = False
    # A folder (mounted drive, network volume) that receives a copy of each kept checkpoint in the background.
    mirror_dir: str | None = None

    def validate(self) -> None:
        for key in ("ckpt_interval", "keep_last"):
            _require_positive(f"train.{key}", getattr(self, key))
        if self.ckpt_minutes is not None and self.ckpt_minutes < 0:
            raise BurnoutError(f"train.ckpt_minutes: {self.ckpt_minutes} is negative; give minutes, or 0 for none")
        for i, step in enumerate(self.milestones):
            _require_positive(f"train.milestones[{i}]", step)


@dataclass
class BudgetConfig(TrainSection):
    """train.budget: a time or dollar budget for the run, and what its hardware is and costs (train/budget.py)."""
    # A time budget for the run's commands, start-up included (its elapsed_s, over all its sessions): a plan, not a
    # cut-off. A new run measures a step (unless step_seconds is given), plans the steps that fit in what its start-up
    # left, warms up over at most a tenth of them, and ends its LR schedule at the budget even when the steps slow
    # down (docs/USAGE.md).
    max_minutes: float | None = None
    # The seconds per step a time budget plans with; measured at a new run's start when not given, then kept in
    # config.yaml so that a resume keeps the plan.
    step_seconds: float | None = None
    # The seconds a new run's command spent before the plan (data preparation, a fine-tune's probe, the step
    # measurement), which the budget also covers: its steps are planned from what is left. Measured at a new run's
    # start, then kept in config.yaml so that a resume keeps the plan (each session's own start-up counts in elapsed_s).
    startup_seconds: float | None = None
    # A budget in dollars: the time budget it buys at the run's price (price_per_hour, else hardware.yaml's for its
    # GPU) on all its devices, set as max_minutes at each session's start; refused where no price is known (a CPU).
    max_dollars: float | None = None
    # Hardware for MFU and cost: a name from burnout/configs/hardware.yaml, or auto (detected GPU, else cpu).
    hardware: str = "auto"
    # Price per device-hour; None means the hardware table's price.
    price_per_hour: float | None = None

    def validate(self) -> None:
        for key in ("max_minutes", "step_seconds", "max_dollars", "price_per_hour"):
            if getattr(self, key) is not None:
                _require_positive(f"train.{key}", getattr(self, key))
        if self.startup_seconds is not None and self.startup_seconds < 0:
            raise BurnoutError(f"train.startup_seconds: {self.startup_seconds} is negative; it is the seconds a run's "
                               "start-up took (0 or more), measured when not given")


# train.tracker: a dashboard a run's records also stream to (burnout/train/trackers.py).
Tracker = Literal["tensorboard", "wandb", "trackio"]
TRACKERS: tuple[str, ...] = typing.get_args(Tracker)
# train.log's switches before train.tracker, which every config.yaml saved then holds (false): a true one is that
# tracker (regroup_train).
_TRACKER_SWITCHES = ("tensorboard", "wandb")


@dataclass
class LogConfig(TrainSection):
    """train.log: how often a step is logged, and the tracker that also receives the records metrics.jsonl holds."""
    log_interval: int = 10
    # None: metrics.jsonl alone. tensorboard, wandb (offline) or trackio (local): each record streamed to it too,
    # into RUN/tracker/ (needs its library: pip install 'gpuburnout[track]').
    tracker: Tracker | None = None

    def validate(self) -> None:
        _require_positive("train.log_interval", self.log_interval)


@dataclass
class PerfConfig(TrainSection):
    """train.perf: how a step runs on its devices (kernels, compilation, memory, parallelism): switches for speed
    and memory that leave the model, the data and the schedule as they are."""
    # fp8's scaling (torchao calls it a recipe, hence the key's name): tensorwise, one scale per tensor (the
    # fastest); rowwise, one per row of each operand (finer, so closer to bf16's loss); rowwise_with_gw_hp, rowwise
    # with the weight gradient's GEMM kept in bf16 (its inputs have the widest range).
    fp8_recipe: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] = "tensorwise"
    compile: bool = False
    # Deterministic kernels (torch.use_deterministic_algorithms): a resumed GPU run equals the uninterrupted
    # one bitwise, at some cost in speed. CPU runs are deterministic without it.
    deterministic: bool = False
    # Recompute each block's activations in backward: less memory, about a third more compute.
    activation_checkpointing: bool = False
    # On CUDA, refuse to start a run whose predicted peak memory (as `burnout plan` predicts it) exceeds the
    # GPU's; false starts it anyway, e.g. when the prediction's margins are too cautious for a tight fit.
    memory_check: bool = True
    # Under torchrun: ddp replicates the model; fsdp shards weights, grads and optimizer state (FSDP2).
    distributed: Literal["ddp", "fsdp"] = "ddp"
    # Under fsdp: keep each rank's shards of the weights, gradients and optimizer state in CPU memory
    # (FSDP2's CPUOffloadPolicy); the optimizer steps on the CPU and each block's weights cross to the GPU
    # in every forward and backward, so a step is slower.
    cpu_offload: bool = False

    def validate(self) -> None:
        if self.cpu_offload and self.distributed != "fsdp":
            raise BurnoutError("train.cpu_offload: offloads FSDP's shards to CPU memory, and this run uses "
                               f"train.distributed={self.distributed}; add train.distributed=fsdp (under torchrun) "
                               "or drop train.cpu_offload")


@dataclass
class TrainConfig:
    """The train section: the run's shape and length here (what nearly every run sets), the rest in sections by
    concern. A section's field is also read and set as train.KEY (TrainSection), as on the command line."""
    seed: int = 1337
    device: str = "auto"
    # fp16 uses a gradient scaler; bf16 and fp16 are autocast (weights and optimizer stay fp32). fp8 (GPUs from
    # Ada/Hopper on, with torchao): the blocks' linear layers in fp8 (train.perf.fp8_recipe), the rest under bf16
    # autocast.
    precision: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = "auto"
    batch_size: int = 16
    grad_accum: int = 1
    # None means the model's context length.
    seq_len: int | None = None
    max_steps: int = 1000
    # Further stop conditions; the earliest of steps, tokens and epochs (passes over train.bin) wins,
    # and the LR schedule spans it.
    max_tokens: int | None = None
    max_epochs: float | None = None
    # Named legs of the run, cumulative step targets; training stops at each one's end.
    phases: list[PhaseConfig] = field(default_factory=list)
    # Continued pretraining: a new run's weights at step 0 are this checkpoint's (a checkpoints/step_N folder, or a
    # run folder: its newest good one); its model and tokenizer are the parent's, its schedule and data its own.
    init_from: str | None = None
    # fresh: a new optimizer state (the default: the parent's moments are its own data's gradient statistics, see
    # docs/USAGE.md); carry: the parent checkpoint's optimizer moments, where it holds them.
    init_optimizer: Literal["fresh", "carry"] = "fresh"
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    log: LogConfig = field(default_factory=LogConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)

    def __getattr__(self, name: str) -> Any:
        """A section's field by its short name (tc.lr is tc.optim.lr); only names not found otherwise come here."""
        section = TRAIN_SECTION_OF.get(name)
        if section is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(getattr(self, section), name)

    def __setattr__(self, name: str, value: Any) -> None:
        section = TRAIN_SECTION_OF.get(name)
        object.__setattr__(getattr(self, section) if section else self, name, value)

    def validate(self) -> None:
        _check_seed("train.seed", self.seed)
        for key in ("batch_size", "grad_accum", "max_steps"):
            _require_positive(f"train.{key}", getattr(self, key))
        if self.seq_len is not None:
            _require_positive("train.seq_len", self.seq_len)
        for key in ("max_tokens", "max_epochs"):
            if getattr(self, key) is not None:
                _require_positive(f"train.{key}", getattr(self, key))
        for name in TRAIN_SECTIONS:
            getattr(self, name).validate()
        self._check_across_sections()
        self._check_phases()
        if self.init_optimizer == "carry" and not self.init_from:
            raise BurnoutError("train.init_optimizer: carry takes the optimizer state of the checkpoint a run starts "
                               "from; give train.init_from (--init-from RUN) too, or drop it")

    def _check_across_sections(self) -> None:
        """What FSDP cannot do with the optimizer or the evaluation this run asks for."""
        if self.perf.distributed != "fsdp":
            return
        if self.optim.optimizer == "muon":
            # torch.optim.Muon on FSDP's shards orthogonalizes each shard, not the matrix: wrong updates.
            raise BurnoutError("train.optimizer: muon orthogonalizes whole matrices, which FSDP shards; "
                               "use train.distributed=ddp or train.optimizer=adamw")
        if self.optim.optimizer == "adamw8bit":
            # FSDP's resume sends each rank its shards of the state, and torchao's 8-bit tensors have no broadcast.
            raise BurnoutError("train.optimizer: adamw8bit's quantized state cannot be restored into FSDP's shards, "
                               "so its run could not resume; use train.distributed=ddp or train.optimizer=adamw")
        if self.eval.eval_tasks:
            # Scoring runs the model's blocks outside its forward, where FSDP gathers nothing.
            raise BurnoutError("train.eval_tasks: not supported under train.distributed=fsdp; use ddp, or score "
                               "the checkpoints afterwards with burnout eval RUN --all-checkpoints")

    def _check_phases(self) -> None:
        previous = 0
        for i, phase in enumerate(self.phases):
            if phase.steps <= previous:
                raise BurnoutError(f"train.phases[{i}].steps: {phase.steps} must exceed the previous phase's "
                                   f"{previous}; phase steps are cumulative targets")
            if phase.budget is not None and phase.budget < 0:
                raise BurnoutError(f"train.phases[{i}].budget: {phase.budget} is negative")
            previous = phase.steps
        if self.phases and self.phases[-1].steps > self.max_steps:
            raise BurnoutError(f"train.max_steps: {self.max_steps} ends before the last phase "
                               f"('{self.phases[-1].name}', {self.phases[-1].steps}); raise train.max_steps")
        if len({p.name for p in self.phases}) != len(self.phases):
            raise BurnoutError("train.phases: phase names must be unique")


# train's sections (its field's name → the section's class), and the section each of their fields is in (the field's
# short name → the section's name).
TRAIN_SECTIONS = {name: tp for name, tp in typing.get_type_hints(TrainConfig).items()
                  if isinstance(tp, type) and issubclass(tp, TrainSection)}
TRAIN_SECTION_OF = {f.name: name for name, cls in TRAIN_SECTIONS.items() for f in dataclasses.fields(cls)}


@dataclass
class AdapterConfig:
    """The LoRA adapters of a fine-tune (sft.lora, dpo.lora); the same keys as burnout.models.lora.LoRAConfig,
    which validates them where the model is built (config sits below models, so it cannot import it)."""
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    # Layer names or groups: attn, mlp, qkv, proj, fc, gate, up, down, attn.qkv, ... (see models/lora.py).
    targets: list[str] = field(default_factory=lambda: ["attn", "mlp"])


@dataclass
class FineTuneSource:
    """What a fine-tune starts from and reads: the fields the sft and dpo sections share."""
    # The base model (DPO: the starting policy and reference): a run folder (its latest checkpoint) or a
    # checkpoint folder.
    base: str = ""
    # The examples: a local .json/.jsonl/.parquet file, folder or glob, or "hf:NAME" (streamed).
    source: str = ""
    # messages, sharegpt, alpaca, qa, oasst, pairs, or auto (detected from the first record's keys).
    layout: str = "auto"
    split: str = "train"
    subset: str | None = None
    data_files: str | None = None
    # Read at most this many examples (None: all).
    max_examples: int | None = None
    # An example longer than seq_len + 1 tokens: truncate (keep its start) or drop.
    overflow: Literal["truncate", "drop"] = "truncate"
    val_fraction: float = 0.05
    # Batches as wide as their longest row (rounded up to 64) instead of seq_len.
    pad_to_longest: bool = False
    # None: full fine-tuning; a mapping: LoRA adapters, base frozen.
    lora: AdapterConfig | None = None

    def _check_source(self, section: str, base_hint: str, source_hint: str) -> None:
        if not self.base:
            raise BurnoutError(f"{section}.base: {base_hint}")
        if not self.source:
            raise BurnoutError(f"{section}.source: {source_hint}")
        if not 0.0 <= self.val_fraction < 0.5:
            raise BurnoutError(f"{section}.val_fraction: {self.val_fraction} is outside [0, 0.5)")
        if self.max_examples is not None:
            _require_positive(f"{section}.max_examples", self.max_examples)


@dataclass
class SFTConfig(FineTuneSource):
    """Supervised fine-tuning: a run with this section set starts from `base` and trains on conversations
    (burnout/finetune/); what it makes is a chat model (tokenizer.chat_template)."""
    # assistant: loss on the assistant turns only; all: on every token but the template's role headers.
    train_on: Literal["assistant", "all"] = "assistant"
    # Chat tokens the fine-tune added to the base tokenizer (filled in by the run; recorded for its readers).
    added_tokens: list[str] = field(default_factory=list)
    # Conversations packed into full rows (best fit), each attending only to itself with its positions from 0,
    # instead of one right-padded conversation per row; the loss per assistant token is the same, and on Alpaca
    # it trains 2.2x (CPU) to 3.4x (H100) the assistant tokens per second (docs/FINETUNING.md).
    packing: bool = True

    def validate(self) -> None:
        self._check_source("sft", "name the base model (a run folder or checkpoint), e.g. sft.base=runs/base",
                           "name the conversations (a .json/.jsonl/.parquet path or hf:NAME)")


@dataclass
class DPOConfig(FineTuneSource):
    """Preference tuning (DPO): a run with this section set starts from `base` (a chat model) and trains on
    preference pairs (burnout/finetune/). With `lora` the reference is the same model with its adapters switched
    off; without, a frozen copy."""
    # β of the loss: how far the policy may move from the reference (0.1 is usual).
    beta: float = 0.1
    # Warn once when the loss is still within 0.005 of ln 2 after this many steps.
    stall_steps: int = 100
    # Pairs packed whole into full rows of 2 × seq_len (best fit), each sequence attending only to itself with its
    # positions from 0, instead of one right-padded sequence per row; the loss per pair is the same. Off by default:
    # on a CPU its wider rows' attention ate most of the gain (docs/FINETUNING.md).
    packing: bool = False

    def validate(self) -> None:
        self._check_source("dpo", "name the starting model (a chat run folder or checkpoint), e.g. dpo.base=runs/sft",
                           "name the preference pairs (a .json/.jsonl/.parquet path or hf:NAME)")
        if not self.beta > 0:
            raise BurnoutError(f"dpo.beta: {self.beta} must be positive (the usual value is 0.1)")
        _require_positive("dpo.stall_steps", self.stall_steps)


@dataclass
class RLConfig(FineTuneSource):
    """Reinforcement learning with verifiable rewards (GRPO): a run with this section set starts from `base` (a chat
    model) and learns from its own sampled answers to the questions of `source`, scored by `reward`
    (burnout/finetune/rl.py). With `lora` the KL reference is the same model with its adapters switched off."""
    # gsm8k: the answer's final `#### n` equals the reference's; exact: the answer equals the reference (outer
    # spaces aside); regex:PATTERN: PATTERN's first match (its group 1 if any) the same in both; module:function:
    # a function of yours, function(prompt, answer, reference) -> float.
    reward: str = "gsm8k"
    # Answers sampled per question; each is scored against its group's mean.
    group_size: int = 8
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: int | None = None
    # Weight of the KL penalty to the starting policy (0: none, and no reference forward).
    kl_coef: float = 0.0
    # Before training, the base answers this many train questions (group_size times each, as the first steps
    # sample them): a run in which no group's rewards differ has nothing to learn and is refused. 0: no check.
    probe_questions: int = 8

    def validate(self) -> None:
        self._check_source("rl", "name the starting model (a chat run folder or checkpoint), e.g. rl.base=runs/sft",
                           "name the questions and answers (a .json/.jsonl/.parquet path or hf:NAME)")
        if self.group_size < 2:
            raise BurnoutError(f"rl.group_size: {self.group_size} answers per question leave nothing to compare "
                               "(each answer is scored against its group's mean); use 2 or more, e.g. 8")
        _require_positive("rl.max_new_tokens", self.max_new_tokens)
        if not self.temperature > 0:
            raise BurnoutError(f"rl.temperature: {self.temperature} must be positive (at 0 every answer of a group "
                               "is the same, so none can be better than the others); the usual value is 1.0")
        if self.top_k is not None:
            _require_positive("rl.top_k", self.top_k)
        if self.kl_coef < 0:
            raise BurnoutError(f"rl.kl_coef: {self.kl_coef} is negative; use 0 (no penalty) or more, e.g. 0.05")
        if self.probe_questions < 0:
            raise BurnoutError(f"rl.probe_questions: {self.probe_questions} is negative; use 0 (no check before "
                               "training) or more, e.g. 8")
        if not self.reward:
            raise BurnoutError("rl.reward: name a reward: gsm8k, exact, regex:PATTERN or module:function")


@dataclass
class PredictionConfig:
    """prediction: the final val loss `burnout plan --write-config` predicted for this run, with its interval and where
    it came from; the run folder's config.yaml keeps it, and `burnout report` sets the loss achieved beside it."""
    val_loss: float
    low: float
    high: float
    level: float  # the interval's coverage, e.g. 0.9
    source: str  # "ladder", or the published fit's label
    params: int  # N and D the prediction is for
    tokens: int
    ladder: str | None = None  # the ladder.json it came from, when a ladder

    def validate(self) -> None:
        if not 0 < self.low <= self.val_loss <= self.high:
            raise BurnoutError(f"prediction: val_loss {self.val_loss} must lie in its interval [low {self.low}, high "
                               f"{self.high}], all positive; `burnout plan --write-config` writes this section")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # Set: a supervised fine-tune of sft.base.
    sft: SFTConfig | None = None
    # Set: DPO from dpo.base on preference pairs.
    dpo: DPOConfig | None = None
    # Set: reinforcement learning (GRPO) from rl.base on questions with checkable answers.
    rl: RLConfig | None = None
    # Set: the loss `burnout plan` predicted for this run (`burnout report` compares the final val loss with it).
    prediction: PredictionConfig | None = None

    @property
    def fine_tune(self) -> FineTuneSource | None:
        """The section that says how this run fine-tunes, or None for pretraining."""
        if self.rl is not None:
            return self.rl
        return self.dpo if self.dpo is not None else self.sft

    @property
    def adapters(self) -> tuple[str, AdapterConfig] | None:
        """(its config key, e.g. "sft.lora"; the config) of the LoRA adapters this run's model holds, or None."""
        for key, section in (("rl", self.rl), ("dpo", self.dpo), ("sft", self.sft)):
            if section is not None and section.lora is not None:
                return f"{key}.lora", section.lora
        return None

    def validate(self) -> None:
        self.model = self.model.resolved()
        self.data.validate()
        self.tokenizer.validate()
        self.train.validate()
        if self.sft is not None:
            self.sft.validate()
            if self.tokenizer.chat_template is None:
                # Fine-tuning on conversations makes a chat model; configs saved before tokenizer.chat_template
                # existed said so by their sft section alone.
                self.tokenizer.chat_template = CHATML
        if self.dpo is not None:
            self.dpo.validate()
        if self.rl is not None:
            self.rl.validate()
        if self.prediction is not None:
            self.prediction.validate()
        if self.train.init_from and self.fine_tune is not None:
            raise BurnoutError("train.init_from: a fine-tune starts from its base (sft.base / dpo.base / rl.base); "
                               "drop train.init_from")
        seq_len = self.train.seq_len or self.model.context_length
        if seq_len > self.model.context_length:
            raise BurnoutError(
                f"train.seq_len: {seq_len} exceeds model.context_length={self.model.context_length}; "
                "lower train.seq_len or raise model.context_length"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------
# Loading


def model_preset_names() -> list[str]:
    return sorted(p.stem for p in MODEL_PRESET_DIR.glob("*.yaml"))


# The largest whole number a config value may be: int64's (torch and NumPy hold sizes and indices in it).
LARGEST_WHOLE_NUMBER = 2**63 - 1


def load_model_preset(name: str, overrides: dict[str, Any] | None = None) -> ModelConfig:
    raw = {**_model_preset_raw(name, "model preset"), **(overrides or {})}
    return from_dict(ModelConfig, raw, "model").resolved()


def _model_preset_raw(name: str, where: str) -> dict[str, Any]:
    path = MODEL_PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise BurnoutError(f"{where}: unknown preset '{name}'; choose one of: {', '.join(model_preset_names())}")
    return read_yaml(path)


def load_run_config(source: str | Path | dict, overrides: list[str] = (),
                    on_note: Callable[[str], None] | None = None) -> RunConfig:
    """Build a validated RunConfig from a YAML file (or a dict) plus `dotted.key=value` overrides.

    `source` may also be the name of a file in burnout/configs/ without its extension (e.g. "quickstart"). A train
    key of `source` in the flat layout before train's sections (train.lr) is read into its section (train.optim.lr)
    before the overrides apply, and `on_note` is told so, once per key; an override's short name (train.lr=3e-4) is
    no old key: messages and hints name settings so.
    """
    if isinstance(source, dict):
        raw = copy.deepcopy(source)  # overrides edit nested sections in place
    else:
        raw = read_yaml(resolve_config_path(source))
    moved = regroup_train(raw.get("train"), "config.train")
    if on_note is not None:
        named = "" if isinstance(source, dict) else f"{source}: "
        for key in moved:
            on_note(f"note: {named}train.{key} is now train.{TRAIN_SECTION_OF[key]}.{key}; the old key still works")
    for item in overrides:
        apply_override(raw, item)
    model_raw = raw.get("model", {})
    if isinstance(model_raw, str):
        model_raw = {"preset": model_raw}
    if isinstance(model_raw, dict) and "preset" in model_raw:
        overrides_of_preset = {k: v for k, v in model_raw.items() if k != "preset"}
        raw["model"] = {**_model_preset_raw(model_raw["preset"], "model.preset"), **overrides_of_preset}
    cfg = from_dict(RunConfig, raw, "config")
    cfg.validate()
    return cfg


def saved_config_text(cfg: RunConfig, run_dir: str | Path) -> str:
    """The config.yaml burnout writes into the run folder `run_dir` (RUN/config.yaml, and each checkpoint's): `cfg`
    as YAML, its data.prepared_dir relative to the run folder where the data live inside it (RUN/data), so that a
    copy of the folder trains, resumes and evaluates on its own copy of them (read_saved_config)."""
    raw = cfg.to_dict()
    prepared = raw["data"].get("prepared_dir")
    if prepared:
        data_dir, run_dir = Path(prepared).resolve(), Path(run_dir).resolve()
        if data_dir.is_relative_to(run_dir):
            raw["data"]["prepared_dir"] = str(data_dir.relative_to(run_dir))
    return yaml.safe_dump(raw, sort_keys=False)


def read_saved_config(path: str | Path) -> dict[str, Any]:
    """A config.yaml that burnout wrote into a run folder (RUN/config.yaml) or a checkpoint (RUN/checkpoints/step_N/
    config.yaml, or a checkpoint folder standing alone), as a raw dict whose relative data.prepared_dir
    (saved_config_text) is made a path from the run folder: the data inside the folder the file is in."""
    path = Path(path)
    raw = read_yaml(path)
    regroup_train(raw.get("train"), f"{path}: train")  # a run saved before train's sections
    folder = path.parent
    run_dir = folder.parent.parent if folder.parent.name == CHECKPOINT_DIR else folder
    data = raw.get("data")
    prepared = data.get("prepared_dir") if isinstance(data, dict) else None
    if isinstance(prepared, str) and prepared and not Path(prepared).is_absolute():
        data["prepared_dir"] = str((run_dir / prepared).absolute())
    return raw


def load_saved_config(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """load_run_config of a config.yaml burnout wrote into a run folder or a checkpoint (read_saved_config)."""
    return load_run_config(read_saved_config(path), overrides)


def with_budget(overrides: list[str], minutes: float | None = None, dollars: float | None = None) -> list[str]:
    """A training command's --minutes or --dollars as the overrides they stand for, last so that they win: --minutes
    is train.max_minutes, and ends a dollar budget the run had; --dollars is train.max_dollars."""
    if minutes is not None and dollars is not None:
        raise BurnoutError("--minutes and --dollars: give one budget (dollars buy minutes at the price per hour)")
    if minutes is not None:
        return [*overrides, f"train.max_minutes={minutes!r}", "train.max_dollars=null"]
    return [*overrides, f"train.max_dollars={dollars!r}"] if dollars is not None else list(overrides)


def regroup_train(train: Any, where: str) -> list[str]:
    """Move the keys of a raw train section `train` given by their short name (train.lr: the flat layout of configs
    written before train's sections) into their sections (train.optim.lr), in place, over a value the section gives;
    the keys moved, in the order written. `where` names the section in an error."""
    if not isinstance(train, dict):
        return []
    _tracker_from_switches(train, where)
    moved = [key for key in train if key in TRAIN_SECTION_OF]
    for key in moved:
        name = TRAIN_SECTION_OF[key]
        section = train.setdefault(name, {})
        if not isinstance(section, dict):
            raise BurnoutError(f"{where}.{name}: expected a mapping, got {_describe(section)}")
        section[key] = train.pop(key)
    return moved


def _tracker_from_switches(train: dict, where: str) -> None:
    """Read train.log's switches of configs saved before train.tracker (tensorboard, wandb: booleans, flat or in
    train.log) as train.tracker, in place: a run saved then resumes and is read as it was."""
    on = []
    for section in (train, train.get("log")):
        if isinstance(section, dict):
            on += [key for key in _TRACKER_SWITCHES if isinstance(section.get(key), bool) and section.pop(key)]
    if len(on) > 1:
        raise BurnoutError(f"{where}: {' and '.join(on)} are both on; a run streams to one tracker: give "
                           f"train.tracker={on[0]} (or {on[1]}) instead")
    log = train.setdefault("log", {}) if on else None
    if isinstance(log, dict):
        if log.get("tracker", on[0]) != on[0]:
            raise BurnoutError(f"{where}: {on[0]}: true and tracker: {log['tracker']} name two trackers; a run streams "
                               f"to one: keep train.tracker alone")
        log["tracker"] = on[0]


def setting_name(dotted: str) -> str:
    """The name a setting goes by in messages, hints and resumes.jsonl, as overrides give it: a field of a section of
    train by its short name (train.optim.lr → train.lr), any other by its path."""
    parts = dotted.split(".")
    if len(parts) > 2 and parts[0] == "train" and parts[1] in TRAIN_SECTIONS:
        return ".".join(["train", *parts[2:]])
    return dotted


def settings(cfg: RunConfig) -> dict[str, Any]:
    """Every setting of `cfg` by its name (setting_name) → its value: what a resume records as changed."""
    flat: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[setting_name(f"{prefix}{key}")] = value

    walk(cfg.to_dict(), "")
    return flat


def resolve_config_path(source: str | Path) -> Path:
    path = Path(source)
    if path.is_file():
        return path
    builtin = CONFIG_DIR / f"{source}.yaml"
    if builtin.is_file():
        return builtin
    raise BurnoutError(
        f"config file '{source}' not found; give a path to a YAML file or a name from {CONFIG_DIR}"
    )


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise BurnoutError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BurnoutError(f"cannot read config {path}: {exc}") from None
    except ValueError as exc:  # a value YAML recognises but cannot build: 2024-13-45, an int of 5,000 digits
        why = "a whole number of thousands of digits" if "integer string conversion" in str(exc) else first_line(exc)
        raise BurnoutError(f"{path}: YAML cannot read one of its values ({why}); quote it to keep it text, or fix it"
                           ) from None
    except RecursionError:
        raise BurnoutError(f"{path}: its values are nested too deeply for YAML to read; a config is a few levels "
                           "deep") from None
    if data is None:  # nothing in it but blanks and comments: read as {}, every section would be the defaults
        raise BurnoutError(f"{path} is empty (no YAML in it, or only comments); write its sections into it (a run "
                           "config: model, data, train; a data mix: data, tokenizer) or give another file")
    if not isinstance(data, dict):
        raise BurnoutError(f"{path}: expected a mapping of sections at the top level, got {type(data).__name__}")
    return data


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `dotted.key=value` override to a raw config dict, in place."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise BurnoutError(f"override '{item}' is not of the form section.key=value (e.g. train.lr=3e-4)")
    parts = key.strip().lstrip("-").split(".")
    if parts[0] == "train" and len(parts) > 1 and parts[1] in TRAIN_SECTION_OF:  # train.lr: train.optim.lr
        parts.insert(1, TRAIN_SECTION_OF[parts[1]])
    if parts == ["model", "preset"]:  # another preset is another model: no field of the section before carries over
        raw["model"] = {}
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if isinstance(child, str) and part == "model":
            child = {"preset": child}
        if child is None:
            child = {}
        if not isinstance(child, dict):
            raise BurnoutError(f"override '{item}': '{part}' is not a section")
        node[part] = child
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(value)
    except (yaml.YAMLError, ValueError, RecursionError):  # ValueError: 2024-13-45, an int of 5,000 digits
        node[parts[-1]] = value


def from_dict(cls: type, raw: Any, where: str) -> Any:
    """Build dataclass `cls` from a plain dict, checking every key and type."""
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, dict):
        raise BurnoutError(f"{where}: expected a mapping, got {_describe(raw)}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    if cls is TrainConfig:  # short names (a whole train section given on the command line) into their sections
        raw = dict(raw)
        regroup_train(raw, where)
        check_keys(raw, known, where, also=set(TRAIN_SECTION_OF))
    else:
        check_keys(raw, known, where)
    # A section of train names its fields by their short names, as messages and overrides do (TrainSection).
    named = where.rpartition(".")[0] if issubclass(cls, TrainSection) else where
    kwargs = {name: _coerce(hints[name], value, f"{named}.{name}") for name, value in raw.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise BurnoutError(f"{where}: {exc}") from None


def check_keys(raw: dict, known: set[str], where: str, also: set[str] = frozenset()) -> None:
    """Refuse the first key of `raw` (in the order written) that is not in `known`, naming the closest known one or
    all of them (and of `also`: other names that reach a setting from here). A key YAML read as something other than
    text (on/yes/no as a boolean, 4 as a number, ~ as null, a date) is named as YAML read it, with how to keep it
    text."""
    unknown = [key for key in raw if key not in known]
    if not unknown:
        return
    key = unknown[0]
    name = json.dumps(key) if isinstance(key, (bool, type(None))) else str(key)
    import difflib

    names = known | also
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(names))}"
    note = "" if isinstance(key, str) else f" ({_read_as(key)}; quote a key to keep it text)"
    raise BurnoutError(f"{where}.{name}: unknown key{note}; {hint}")


def _read_as(key: Any) -> str:
    """What YAML made of a key that is not text, in words."""
    if key is None:
        return "YAML reads an unquoted ~ or null, or an empty key, as null"
    if isinstance(key, bool):
        return ("YAML reads an unquoted on, yes or true as the boolean true" if key else
                "YAML reads an unquoted off, no or false as the boolean false")
    kind = {"int": "number", "float": "number", "datetime": "date and time"}.get(type(key).__name__,
                                                                                 type(key).__name__)
    return f"YAML reads it as a {kind}, not a name"


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _coerce(non_none[0], value, where)
    if origin is Literal:
        if value not in args:
            raise BurnoutError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise BurnoutError(f"{where}: expected a list, got {_describe(value)}")
        return [_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        number = _whole_number(value)
        if number is not None:
            if abs(number) > LARGEST_WHOLE_NUMBER:  # torch and NumPy would refuse it only once work had begun
                if where.endswith(".seed"):  # a seed's own, narrower range says more
                    _check_seed(where, number)
                shown = f"{value!r}" if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
                raise BurnoutError(f"{where}: {shown} is beyond the largest whole number a setting may hold "
                                   f"({LARGEST_WHOLE_NUMBER:,}, 2^63 - 1: what a tensor's size or index holds); "
                                   "give a smaller one")
            return number
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            # YAML reads .nan and .inf as floats, and every comparison with NaN is false: no range check
            # further on would catch it.
            if not math.isfinite(number):
                raise BurnoutError(f"{where}: {value!r} is not a finite number")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise BurnoutError(f"{where}: expected {tp.__name__}, got {_describe(value)}")


def _whole_number(value: Any) -> int | None:
    """`value` as the whole number it spells, or None: an int, a float with no fraction, or text a number is
    written as (YAML 1.1 reads 1e20 and 1.0e20, without a sign in the exponent, as text), read exactly."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            number = decimal.Decimal(value.strip())
            if not number.is_finite():
                return None
            if number.adjusted() >= 19:  # beyond 2^63, and not built: 1e999999999 would have a billion digits
                return LARGEST_WHOLE_NUMBER + 1
            return int(number) if number == number.to_integral_value() else None
        except decimal.DecimalException:
            return None
    return None


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _check_seed(where: str, value: int) -> None:
    """A seed NumPy takes, refused when the config loads rather than after the data are prepared."""
    try:
        checked_number(where, value, integer=True, low=0, high=SEED_MAX)
    except BurnoutError as exc:
        raise BurnoutError(f"{exc}; any number in that range will do (-1 does not mean a random seed: a run is "
                           "reproduced from its config)") from None


def _require_positive(where: str, value: int | float) -> None:
    if value <= 0:
        raise BurnoutError(f"{where}: {value} must be positive")
