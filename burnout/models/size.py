"""Sizes checked before work: what a model of a config takes, from the config's arithmetic alone, and the one
refusal, before anything is built, of a shape, batch or count that no machine, or not this one, can hold.

Counted in Python's integers: no module is built, nothing overflows, and a model of any size costs the same. The
parameter count is the module tree's (tests/models/test_size.py holds the formula to it for both families). Two
checks share one message (what, the figures, what to change):

- addressable: no tensor, and not the weights together, past the 2^63 bytes a 64-bit machine can address (torch's
  sizes are int64 too), checked wherever a shape reaches torch, even on the meta device or fake tensors;
- refuse_unless_fits: what a command is about to build or write, part by part, against what the machine has (its
  memory, as `machine_memory` reads it, a GPU's, a disk's free space), before the first byte of it is allocated.

A training step's activations are bounded below by `activations_floor`: every block keeps at least its input for
its backward (the norm's input, or the checkpointed block's input), and that input is the residual stream, fp32
under autocast too. A refusal on that floor is never wrong; what passes it may still not fit, which `burnout plan`
and train's CUDA check (train/plan.py) predict in full.
"""

from __future__ import annotations

from pathlib import Path

from burnout.base.machine import available_memory
from burnout.base.text import format_bytes, format_count
from burnout.config import ModelConfig
from burnout.errors import BurnoutError

ADDRESSABLE_BYTES = 2**63
FP32 = 4


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters of the model of `cfg` (a tied matrix once), as its modules count them."""
    cfg = cfg.resolved()
    return _outside_blocks(cfg) + cfg.n_layer * _per_block(cfg)


def _per_block(cfg: ModelConfig) -> int:
    d, f, bias, gpt2 = cfg.d_model, cfg.ffn_hidden, int(cfg.bias), cfg.family == "gpt2"
    qkv = (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim
    norm = d * (1 + bias) if gpt2 else d  # LayerNorm's weight and bias; RMSNorm's weight
    attention = (d + bias) * qkv + (cfg.n_head * cfg.head_dim + bias) * d
    mlp = 2 * d * f + bias * (f + d) if gpt2 else 3 * d * f + bias * (2 * f + d)
    return 2 * norm + attention + mlp


def _outside_blocks(cfg: ModelConfig) -> int:
    d, gpt2 = cfg.d_model, cfg.family == "gpt2"
    embeddings = cfg.vocab_size * d + (cfg.context_length * d if gpt2 else 0)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return embeddings + head + (d * (1 + int(cfg.bias)) if gpt2 else d)


def weights_bytes(cfg: ModelConfig) -> int:
    """fp32 weights, and the buffers built with them (a llama's RoPE table: cos and sin per position)."""
    cfg = cfg.resolved()
    rope = 2 * cfg.context_length * cfg.head_dim if cfg.family == "llama" else 0
    return FP32 * (parameter_count(cfg) + rope)


def activations_floor(cfg: ModelConfig, batch_size: int, seq_len: int) -> int:
    """The least a training step's activations take, whatever the precision, compiling or checkpointing: every
    block's fp32 input kept for its backward (see the module docstring)."""
    return cfg.n_layer * batch_size * seq_len * cfg.d_model * FP32


def addressable(cfg: ModelConfig, batch_size: int | None = None, seq_len: int | None = None,
                batch_key: str = "train.batch_size", seq_key: str = "train.seq_len") -> None:
    """Refuse a shape no machine can hold: a tensor of it, or its weights together, past 2^63 bytes. With a batch
    (of sequences of `seq_len`, default the context), also a step's activations: a row of hidden states and the
    attention scores per head."""
    cfg = cfg.resolved()
    if seq_len is None:  # the context's length: the model's setting is what to change
        seq_len, seq_key = cfg.context_length, "model.context_length"
    d, f, tokens = cfg.d_model, cfg.ffn_hidden, (batch_size or 0) * seq_len
    widest = max(f, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim)
    shapes = [  # (the setting to lower, its value, what grows with it, values)
        ("model.vocab_size", cfg.vocab_size, f"the token embedding (vocab_size × d_model {d:,})", cfg.vocab_size * d),
        ("model.d_model", d, f"a block's widest matrix (d_model × {widest:,})", d * widest),
        ("model.ffn_hidden", f, f"the MLP's matrix (ffn_hidden × d_model {d:,})", f * d),
        ("model.context_length", cfg.context_length, f"the position table (context_length × {max(d, cfg.head_dim):,})",
         cfg.context_length * max(d, cfg.head_dim)),
        ("model.n_layer", cfg.n_layer, "the weights together", parameter_count(cfg)),
    ]
    if batch_size is not None:
        shapes += [
            (batch_key, batch_size, f"a step's hidden states ({batch_key} × {seq_len:,} tokens × {widest:,})",
             tokens * widest),
            (seq_key, seq_len, f"a step's attention scores ({batch_size:,} × {cfg.n_head} heads × {seq_key}²)",
             batch_size * cfg.n_head * seq_len * seq_len)]
    for key, value, what, values in shapes:
        if values * FP32 >= ADDRESSABLE_BYTES:
            raise BurnoutError(f"{key} {value:,}: {what} would hold {values:.3g} values, {values * FP32:.3g} bytes in "
                               f"fp32, past the 2^63 ({ADDRESSABLE_BYTES:.3g}) bytes a 64-bit machine can address; "
                               f"give a smaller {key}")


def check_sequence(cfg: ModelConfig, batch_size: int, seq_len: int | None, batch_key: str, seq_key: str) -> None:
    """A micro-batch a command was given for `cfg`'s model: its sequences no longer than the model's context, and
    addressable (see `addressable`), the flags that set them named."""
    if seq_len is not None and seq_len > cfg.context_length:
        raise BurnoutError(f"{seq_key} {seq_len:,}: longer than the model's context_length {cfg.context_length:,}; "
                           f"give {seq_key} {cfg.context_length:,} or less, or raise model.context_length")
    addressable(cfg, batch_size, seq_len, batch_key, seq_key)


def machine_memory() -> tuple[int, str] | None:
    """(bytes, in words) of memory this process can still take: the least of what the kernel can hand out without
    swapping (available_memory: MemAvailable, its cgroup's limit) and what its own address-space limit (ulimit
    -v) leaves; None where none of them is known."""
    known = []
    if (available := available_memory()) is not None:
        known.append((available, f"this machine has {format_bytes(available)} of memory available"))
    try:
        import resource
    except ImportError:  # not a Unix
        return min(known) if known else None
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:
        left = max(0, limit - _address_space_used())
        known.append((left, f"this process's address-space limit (ulimit -v) leaves {format_bytes(left)}"))
    return min(known) if known else None


def _address_space_used(status: Path = Path("/proc/self/status")) -> int:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def describe(cfg: ModelConfig) -> str:
    """'1.2B parameters: n_layer 100,000, d_model 256, vocab_size 4,096': a model as a refusal names it."""
    cfg = cfg.resolved()
    return (f"{format_count(parameter_count(cfg))} parameters: n_layer {cfg.n_layer:,}, d_model {cfg.d_model:,}, "
            f"vocab_size {cfg.vocab_size:,}")


def refuse_unless_fits(subject: str, parts: list[tuple[str, int]], room: tuple[int, str] | None, fix: str) -> None:
    """The one refusal of what does not fit: `subject` (what the user asked for) needs the sum of `parts` ((what,
    bytes)), and `room` ((bytes, the sentence saying what has them)) is less; `fix` says what to change. No room
    known: nothing is refused."""
    need = sum(n for _, n in parts)
    if room is None or need <= room[0]:
        return
    split = (f" ({'; '.join(f'{what} {format_bytes(n)}' for what, n in parts)})" if len(parts) > 1
             else f" for its {parts[0][0]}")
    raise BurnoutError(f"{subject} needs {format_bytes(need)}{split} and {room[1]}; {fix}")


def check_weights_fit(cfg: ModelConfig, subject: str, fix: str = "choose a smaller model") -> None:
    """Before a model of `cfg` is built in this process's memory: its fp32 weights against what is left of it (and
    its shape against what any machine can address, said of `subject`)."""
    try:
        addressable(cfg)
    except BurnoutError as exc:
        raise BurnoutError(f"{subject}: {exc}") from None
    refuse_unless_fits(f"{subject}, {describe(cfg)},", [("fp32 weights", weights_bytes(cfg))], machine_memory(), fix)


def free_disk(folder: Path) -> tuple[int, str]:
    """(bytes, in words) free on the disk that holds `folder`, or would hold it (its nearest existing parent)."""
    import shutil

    folder = Path(folder).absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    return free, f"the disk of {folder} has {format_bytes(free)} free"
