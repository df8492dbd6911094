"""GGUF export: a checkpoint as one .gguf file that llama.cpp, and the tools built on it (Ollama, LM Studio), load.

Written with the `gguf` package that llama.cpp publishes (the writer and quantizers its own convert_hf_to_gguf.py
uses), so the file is what llama.cpp expects; tests/core/test_gguf_export.py runs it in llama.cpp itself
(llama-cpp-python). Our weights under llama.cpp's names: `gguf_tensors`; the tokenizer: `gguf_vocabulary`; the
types, the model card's keys and what an existing file may be replaced by: docs/USAGE.md ("llama.cpp and Ollama").
"""

from __future__ import annotations

import json
import shutil
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from burnout.base.files import EOT_TOKEN, write_atomic_with
from burnout.base.text import format_bytes, install_extra
from burnout.config import ModelConfig
from burnout.core.chat_template import CHAT_TEMPLATE, chat_token_ids, is_chat_model
from burnout.core.checkpoint import resolve_checkpoint
from burnout.core.model_files import export_source, load_model
from burnout.errors import BurnoutError, StorageError
from burnout.models import Transformer
from burnout.models.lora import lora_layers, merge_lora

GGUF_TYPES = ("f16", "q8_0", "q4_0")
# The checkpoint a file was written from (the run's name, the checkpoint's and its weights' sha256, no path of the
# machine): an existing --to is replaced only when it is an export of the same checkpoint, or of another with
# `overwrite`.
SOURCE_KEY = "burnout.source"


def _gguf():
    """The `gguf` package, or one line saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise BurnoutError(f"a GGUF export needs the gguf package; {install_extra('gguf')}") from None
    return gguf


@dataclass
class Vocabulary:
    """What llama.cpp's `gpt2` tokenizer model reads of a tokenizer, in GGUF's terms."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    special: dict[str, int] = field(default_factory=dict)  # "bos", "eos", "eot" → id
    chat_template: str | None = None


def export_gguf(checkpoint: str | Path, out_file: str | Path, gguf_type: str = "f16",
                overwrite: bool = False, about: dict | None = None) -> Path:
    """Write a checkpoint (a run folder: its newest) as the GGUF file `out_file`, its matrices in `gguf_type`;
    `about`, the fields of the gguf package's Metadata (general.name, .description, .dataset.N.*, ...), else the
    run's name alone.

    LoRA adapters are folded into the weights first. `out_file` is new or a GGUF export of this checkpoint (of
    another: with `overwrite`), never anything else, and not inside the checkpoint it reads. The file is written
    under a temporary name and renamed: a write cut short (a full disk) leaves nothing of it, and an earlier file
    at `out_file` as it was.
    """
    if gguf_type not in GGUF_TYPES:
        raise BurnoutError(f"--gguf-type {gguf_type}: not a type burnout writes; use one of {', '.join(GGUF_TYPES)} "
                           "(f16 keeps the weights as trained, q8_0 and q4_0 quantize them)")
    gguf = _gguf()
    path = resolve_checkpoint(checkpoint)
    source = export_source(path)
    out_file = Path(out_file)
    _check_output_file(out_file, source, path, overwrite)
    model, tokenizer, ckpt = load_model(path)
    if lora_layers(model):
        merge_lora(model)
    vocabulary = gguf_vocabulary(tokenizer, model.cfg.vocab_size, is_chat_model(ckpt.config), str(path))
    qtype = gguf.GGMLQuantizationType[gguf_type.upper()]
    tensors = [(name, *_encoded(gguf, name, array, qtype)) for name, array in gguf_tensors(model)]
    size = _file_bytes(tensors, vocabulary)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out_file.parent).free
    if free < size:
        raise StorageError(f"--to {out_file}: the GGUF file takes about {format_bytes(size)} and its disk has "
                           f"{format_bytes(free)} free; free some space or write it to another disk")

    def write(tmp: Path) -> None:
        writer = gguf.GGUFWriter(str(tmp), model.cfg.family)
        try:
            writer.add_string(SOURCE_KEY, source)
            gguf.Metadata(**(about or {"name": _run_name(path)})).set_gguf_meta_model(writer)
            writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{gguf_type.upper()}"])
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            _add_hyperparameters(writer, model.cfg)
            _add_vocabulary(writer, vocabulary)
            for name, data, tensor_type in tensors:
                writer.add_tensor(name, data, raw_dtype=tensor_type)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
        finally:
            with suppress(OSError):  # a write cut short left the file open: closed, so that its space is freed
                writer.close()

    earlier = out_file.exists()
    try:
        write_atomic_with(out_file, write)
    except OSError as exc:  # a full disk, a quota, a file-size limit: the file named, nothing of it left
        # numpy's tofile says a short write as "N requested and M written", without an errno.
        reason = exc.strerror or "a write was cut short: the disk is full, or a quota or file-size limit was reached"
        raise StorageError(f"writing the GGUF file {out_file} failed ({reason}); nothing of it was kept"
                           + (f" and the earlier {out_file.name} is as it was" if earlier else "")
                           + f": check that its folder is writable and its disk has {format_bytes(size)} free, then "
                           "export again") from None
    return out_file


def _file_bytes(tensors: list[tuple[str, np.ndarray, object]], vocabulary: Vocabulary) -> int:
    """About the bytes of the GGUF file: its tensors' data, its vocabulary's strings, and 1 MiB for the rest."""
    strings = sum(len(s.encode()) + 8 for s in (*vocabulary.tokens, *vocabulary.merges))
    return sum(data.nbytes for _, data, _ in tensors) + strings + (1 << 20)


def _check_output_file(out_file: Path, source: str, checkpoint: Path, overwrite: bool) -> None:
    """Refuse, in one line, a --to that is a folder, inside the checkpoint, or a file that is not a GGUF export of
    this checkpoint (of another: unless `overwrite`). Writes nothing."""
    if out_file.resolve().is_relative_to(checkpoint.resolve()):
        raise BurnoutError(f"--to {out_file} is inside the checkpoint {checkpoint}, which this command reads; "
                           "write the .gguf file somewhere else")
    if out_file.is_dir():
        raise BurnoutError(f"--to {out_file} is a folder; a GGUF export is one file: give a new FILE.gguf")
    if not out_file.exists():
        return
    recorded = _recorded_source(out_file)
    if recorded is None:
        raise BurnoutError(f"--to {out_file} exists and is not a GGUF export of burnout's; choose a new file name "
                           "(burnout replaces only its own exports)")
    if recorded != source and not overwrite:
        raise BurnoutError(f"--to {out_file} holds a GGUF export of {recorded}, not of {source}; pass --overwrite to "
                           "replace it, or choose another file")


def _recorded_source(gguf_file: Path) -> str | None:
    """The checkpoint a GGUF file of ours was exported from; None for any other file."""
    gguf = _gguf()
    try:
        found = gguf.GGUFReader(gguf_file).get_field(SOURCE_KEY)
        return found.contents() if found is not None else None
    except Exception:  # the reader raises ValueError, IndexError, ... for whatever is not a whole GGUF file
        return None


def _run_name(checkpoint: Path) -> str:
    """The run folder's name (a checkpoint's folder is RUN/checkpoints/step_N), or the checkpoint's own."""
    return checkpoint.parent.parent.name if checkpoint.parent.name == "checkpoints" else checkpoint.name


# ----------------------------------------------------------------------------------------------
# Tensors


def gguf_tensors(model: Transformer) -> list[tuple[str, np.ndarray]]:
    """Our weights under llama.cpp's names and layouts, as float32 arrays (ours: burnout/models/hf.py; theirs,
    llama.cpp's `llama` and `gpt2` architectures), per block i:

        tok_emb, pos_emb (gpt2)          token_embd, position_embd
        blocks.i.norm_attn, norm_mlp     blk.i.attn_norm, blk.i.ffn_norm
        blocks.i.attn.qkv                gpt2: blk.i.attn_qkv (fused, as ours)   llama: blk.i.attn_{q,k,v} (split)
        blocks.i.attn.proj               blk.i.attn_output
        blocks.i.mlp.fc, mlp.proj        blk.i.ffn_up, blk.i.ffn_down
        blocks.i.mlp.gate, up, down      blk.i.ffn_gate, blk.i.ffn_up, blk.i.ffn_down
        norm, lm_head                    output_norm, output (left out when tied: llama.cpp then uses token_embd)

    A GGML matrix's rows are its first numpy axis, so our (out, in) Linear weights go in as they are. llama.cpp's
    `gpt2` requires every bias: a bias=False model's are zeros.
    """
    tensor_kinds = _gguf().MODEL_TENSOR
    cfg = model.cfg
    ours = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    out: list[tuple[str, np.ndarray]] = []

    def put(kind, our_name: str, block: int | None = None, parts=("weight", "bias")) -> None:
        for part in parts:
            tensor = ours.get(f"{our_name}.{part}")
            if tensor is None and part == "bias" and cfg.family == "gpt2":
                tensor = torch.zeros(ours[f"{our_name}.weight"].shape[0])  # llama.cpp's gpt2 needs every bias
            if tensor is not None:
                out.append((_tensor_name(kind, part, block), tensor.contiguous().numpy()))

    put(tensor_kinds.TOKEN_EMBD, "tok_emb", parts=("weight",))
    if cfg.family == "gpt2":
        put(tensor_kinds.POS_EMBD, "pos_emb", parts=("weight",))
    for i in range(cfg.n_layer):
        block = f"blocks.{i}"
        put(tensor_kinds.ATTN_NORM, f"{block}.norm_attn", i)
        if cfg.family == "gpt2":
            put(tensor_kinds.ATTN_QKV, f"{block}.attn.qkv", i)
        else:
            out += _split_qkv(cfg, ours, i)
        put(tensor_kinds.ATTN_OUT, f"{block}.attn.proj", i)
        put(tensor_kinds.FFN_NORM, f"{block}.norm_mlp", i)
        if cfg.family == "gpt2":
            put(tensor_kinds.FFN_UP, f"{block}.mlp.fc", i)
            put(tensor_kinds.FFN_DOWN, f"{block}.mlp.proj", i)
        else:
            put(tensor_kinds.FFN_GATE, f"{block}.mlp.gate", i)
            put(tensor_kinds.FFN_UP, f"{block}.mlp.up", i)
            put(tensor_kinds.FFN_DOWN, f"{block}.mlp.down", i)
    put(tensor_kinds.OUTPUT_NORM, "norm")
    if not cfg.tie_embeddings:
        put(tensor_kinds.OUTPUT, "lm_head", parts=("weight",))
    return out


def _tensor_name(kind, part: str, block: int | None) -> str:
    return f"{_gguf().TENSOR_NAMES[kind].format(bid=block)}.{part}"


def _split_qkv(cfg: ModelConfig, ours: dict[str, torch.Tensor], i: int) -> list[tuple[str, np.ndarray]]:
    """Block i's fused qkv as llama.cpp's attn_q, attn_k, attn_v, q and k rows in adjacent-pair RoPE order: our
    RoPE rotates halves (HF's layout), the `llama` architecture's adjacent pairs, so q and k rows (and biases) are
    permuted as convert_hf_to_gguf.py permutes HF's."""
    tensor_kinds = _gguf().MODEL_TENSOR
    H, K, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    out = []
    for part in ("weight", "bias"):
        fused = ours.get(f"blocks.{i}.attn.qkv.{part}")
        if fused is None:
            continue
        q, k, v = fused.split([H * D, K * D, K * D])
        for kind, tensor in ((tensor_kinds.ATTN_Q, _pairs_adjacent(q, H)), (tensor_kinds.ATTN_K, _pairs_adjacent(k, K)),
                             (tensor_kinds.ATTN_V, v)):
            out.append((_tensor_name(kind, part, i), tensor.contiguous().numpy()))
    return out


def _pairs_adjacent(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Each head's rows reordered from rotate-half pairs (j, j + D/2) to adjacent pairs (2j, 2j + 1)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _encoded(gguf, name: str, array: np.ndarray, qtype) -> tuple[np.ndarray, object]:
    """(the bytes or values the file holds for tensor `name`, their GGML type): vectors and the position embedding in
    f32, as convert_hf_to_gguf.py keeps them, matrices in `qtype`; a matrix whose rows do not fill whole blocks of
    `qtype` (32 values for q8_0 and q4_0) refused in one line."""
    if array.ndim == 1 or name.startswith(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.POS_EMBD]):
        return array.astype(np.float32), gguf.GGMLQuantizationType.F32
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if array.shape[-1] % block:
        raise BurnoutError(f"--gguf-type {qtype.name.lower()}: tensor {name} has rows of {array.shape[-1]} values, "
                           f"not a multiple of {qtype.name.lower()}'s blocks of {block}; export with --gguf-type f16")
    return gguf.quants.quantize(array, qtype), qtype


# ----------------------------------------------------------------------------------------------
# Hyperparameters and tokenizer


def _add_hyperparameters(writer, cfg: ModelConfig) -> None:
    """What llama.cpp's `llama` / `gpt2` architecture reads of the model's shape (transformer.py computes it)."""
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.ffn_hidden)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_kv_head)
    writer.add_vocab_size(cfg.vocab_size)
    if cfg.family == "gpt2":
        writer.add_layer_norm_eps(cfg.norm_eps)
        return
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)


def gguf_vocabulary(tokenizer: Tokenizer, vocab_size: int, chat: bool, where: str) -> Vocabulary:
    """`tokenizer` as llama.cpp's `gpt2` tokenizer model, padded to the model's `vocab_size`; a chat model's with
    the ChatML template and <|im_end|> as EOS and end of turn, so that llama.cpp's chat stops there. Anything but
    byte-level BPE refused in one line naming `where`.

    Our byte-level BPE is llama.cpp's `gpt2` tokenizer model with the `gpt-2` pre-tokenizer (GPT-2's split regex,
    which HF's ByteLevel pre-tokenizer uses): tokens in id order, merges, special tokens as control tokens, ids the
    tokenizer lacks (a vocabulary padded past it) as unused; no BOS is added."""
    gguf = _gguf()
    spec = json.loads(tokenizer.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") == "WordLevel":
        raise BurnoutError(f"{where}: a character-level tokenizer has no GGUF form (llama.cpp reads BPE, "
                           "SentencePiece and WordPiece vocabularies); export a byte-level BPE model, or this one "
                           "as a Hugging Face folder (--to FOLDER)")
    unlike_gpt2 = [f"a {model.get('type')} model" if model.get("type") != "BPE" else "",
                   f"the {pre.get('type')} pre-tokenizer" if pre.get("type") != "ByteLevel" else
                   "a space put before the text" if pre.get("add_prefix_space") else
                   "no GPT-2 split regex" if not pre.get("use_regex", True) else "",
                   "a normalizer" if spec.get("normalizer") is not None else ""]
    if any(unlike_gpt2):
        raise BurnoutError(f"{where}: its tokenizer has {', '.join(filter(None, unlike_gpt2))}, unlike GPT-2-style "
                           "byte-level BPE, the one tokenizer a GGUF export of burnout's holds; export it as a "
                           "Hugging Face folder (--to FOLDER)")
    added = tokenizer.get_added_tokens_decoder()
    by_id = {i: token for token, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL if i not in added else
                         gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    vocabulary = Vocabulary(tokens, [int(t) for t in types], merges)
    end_of_text = tokenizer.token_to_id(EOT_TOKEN)
    if end_of_text is not None:
        vocabulary.special = {"bos": end_of_text, "eos": end_of_text}
    if chat:
        end_of_turn = chat_token_ids(tokenizer)[1]  # one line when the chat model's tokenizer lacks it
        vocabulary.special.update(eos=end_of_turn, eot=end_of_turn)
        vocabulary.chat_template = CHAT_TEMPLATE
    return vocabulary


def _add_vocabulary(writer, vocabulary: Vocabulary) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocabulary.tokens)
    writer.add_token_types(vocabulary.token_types)
    writer.add_token_merges(vocabulary.merges)
    writer.add_add_bos_token(False)  # our models are trained and prompted without one
    writer.add_add_eos_token(False)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id, "eot": writer.add_eot_token_id}
    for role, token_id in vocabulary.special.items():
        adders[role](token_id)
    if vocabulary.chat_template is not None:
        writer.add_chat_template(vocabulary.chat_template)
