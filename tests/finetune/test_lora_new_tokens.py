"""A LoRA fine-tune on a base without the chat tokens trains their rows (burnout/models/lora.py, "Token rows"):
frozen at the mean embedding, <|im_end|> could never be the model's greedy choice, so a LoRA chat model would
never stop. Here: the added rows train and every other row keeps the base's bits (AdamW, fused, with their
gradient zeroed and no decay), the trainable count is adapters + k × d, the rows travel in RUN/adapter/, in a
merge and in a PEFT export, and a DPO run (whose base already had the tokens) trains none.

A tiny llama pretrained for 6 steps, then 8 LoRA SFT steps, on the CPU.
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from burnout.base.files import TOKENIZER_FILE
from burnout.base.text import format_bytes
from burnout.cli import main
from burnout.config import (
    AdapterConfig,
    DPOConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
    load_run_config,
    load_saved_config,
)
from burnout.core.chat_template import IM_END, IM_START
from burnout.core.checkpoint import list_checkpoints, load_checkpoint
from burnout.errors import BurnoutError
from burnout.finetune.adapters import lora_token_rows
from burnout.finetune.recipes import load_base
from burnout.models.hf import save_hf
from burnout.models.lora import (
    LoRAConfig,
    apply_lora,
    load_adapter,
    lora_state_dict,
    save_peft_adapter,
    token_rows,
    trainable_counts,
)
from burnout.models.transformer import Transformer
from burnout.runs import recipe_for, start_training
from burnout.train.optim import make_optimizer

CPU = torch.device("cpu")
NEW = [512, 513]  # <|im_start|>, <|im_end|> after the 512-token BPE
SFT_TRAIN = {"device": "cpu", "precision": "fp32", "batch_size": 4, "seq_len": 64, "max_steps": 8, "lr": 3e-3,
             "min_lr": 3e-4, "warmup_steps": 2, "log_interval": 2, "eval_interval": 4, "eval_batches": 2,
             "ckpt_interval": 4, "keep_last": 5, "weight_decay": 0.1}


def _quiet(line):
    pass


def build_model(cfg, device):
    """The model a run of `cfg` trains, as its recipe builds it."""
    return recipe_for(cfg).build_model(cfg, device)


@pytest.fixture(scope="module")
def base_run(tiny_run_config, tiny_bpe_data, tmp_path_factory) -> Path:
    """A tiny pretrained llama (512-token BPE, no chat tokens, tied embeddings), 6 steps."""
    run = tmp_path_factory.mktemp("lora_rows") / "base"
    start_training(tiny_run_config(max_steps=6), run, data_dir=tiny_bpe_data, on_event=_quiet, progress=False)
    return run


@pytest.fixture(scope="module")
def conversations(tmp_path_factory) -> Path:
    """40 short chats in the messages layout."""
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    lines = [json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus {i % 7}?"},
                                      {"role": "assistant", "content": f"It is {i + i % 7}."}]}) for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _sft_config(base: Path, data: Path, **train):
    raw = {"train": {**SFT_TRAIN, **train},
           "sft": {"base": str(base), "source": str(data), "val_fraction": 0.1,
                   "lora": {"r": 4, "alpha": 8, "targets": ["attn", "mlp"]}}}
    return load_run_config(raw)


@pytest.fixture(scope="module")
def lora_run(base_run, conversations, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("lora_rows") / "lora"
    events: list[str] = []
    start_training(_sft_config(base_run, conversations), run, on_event=events.append, progress=False)
    (run / "events.txt").write_text("\n".join(events))
    return run


@pytest.fixture(scope="module")
def grown_base(base_run):
    """The base as the fine-tune starts from it: vocabulary grown, the new rows at the mean embedding."""
    model, _, added, _ = load_base(base_run)
    assert added == [IM_START, IM_END]
    return model.eval()


def _chat_tokens(length: int = 24) -> torch.Tensor:
    x = torch.randint(0, 512, (2, length), generator=torch.Generator().manual_seed(0))
    x[:, ::4], x[:, 2::6] = NEW[0], NEW[1]
    return x


# ----------------------------------------------------------------------------------------------
# The run


def test_the_added_rows_train_and_every_other_weight_keeps_the_bases_bits(lora_run, grown_base):
    cfg = load_saved_config(lora_run / "config.yaml")
    assert cfg.sft.added_tokens == [IM_START, IM_END] and cfg.model.tie_embeddings
    assert lora_token_rows(cfg) == NEW
    final = load_checkpoint(lora_run).model
    got, base = final.tok_emb.weight.detach(), grown_base.tok_emb.weight.detach()
    assert torch.equal(got[:512], base[:512])  # bitwise, under weight decay 0.1 for the adapters' group
    assert (got[NEW] - base[NEW]).abs().amax(dim=1).min() > 1e-3  # both rows moved off the mean
    trained = {k: v for k, v in final.state_dict().items() if not k.endswith((".lora_A", ".lora_B"))}
    for key, value in grown_base.state_dict().items():
        if key not in ("tok_emb.weight", "lm_head.weight"):
            assert torch.equal(trained[key], value), key


def test_im_end_gains_where_the_answers_end(lora_run, grown_base):
    """The point of it: at the tokens that end an answer, <|im_end|> is likelier than with its row frozen at
    the mean embedding (the same adapters, the row put back)."""
    from burnout.finetune.tokenized import SFTBatches

    model = load_checkpoint(lora_run).model.eval()
    x, y = SFTBatches(lora_run / "data", "train", 8, 64, 0).get_batch(0)
    ends = y == NEW[1]
    assert ends.any()
    with torch.no_grad():
        trained = torch.log_softmax(model(x), dim=-1)[ends][:, NEW[1]]
        model.tok_emb.weight[NEW] = grown_base.tok_emb.weight[NEW]
        frozen = torch.log_softmax(model(x), dim=-1)[ends][:, NEW[1]]
    assert (trained - frozen).mean() > 0.3, (trained.mean(), frozen.mean())  # 0.8 nats after 8 steps


def test_trainable_parameters_are_the_adapters_and_k_rows(lora_run):
    cfg = load_saved_config(lora_run / "config.yaml")
    model = build_model(cfg, CPU)
    adapters = sum(v.numel() for v in lora_state_dict(model).values())
    counts = trainable_counts(model)
    d, vocab = cfg.model.d_model, cfg.model.vocab_size
    assert token_rows(model) == tuple(NEW)
    assert counts.trainable == adapters + len(NEW) * d
    assert counts.optimized == adapters + vocab * d  # AdamW's state covers the whole (tied) matrix
    line = next(e for e in (lora_run / "events.txt").read_text().splitlines() if e.startswith("trainable parameters"))
    assert line.startswith(f"trainable parameters: {counts.trainable:,} of {counts.total:,}")
    assert "the embedding rows of 2 added tokens among them" in line and "for full fine-tuning" in line
    # 8 bytes (AdamW's two fp32 moments) for every parameter of the matrix, frozen rows included
    assert f"optimizer state {format_bytes(8 * counts.optimized)} (the whole embedding matrix's included" in line
    assert line.endswith(f"for full fine-tuning ({counts.optimized / counts.total:.2%})")


def test_the_adapter_folder_carries_the_rows_and_reproduces_the_run(base_run, lora_run, grown_base):
    config = json.loads((lora_run / "adapter" / "adapter_config.json").read_text())
    assert config["token_rows"] == NEW
    run_model = load_checkpoint(lora_run).model.eval()
    loaded = load_adapter(load_base(base_run)[0], lora_run / "adapter").eval()
    x = _chat_tokens()
    with torch.no_grad():
        assert torch.equal(loaded(x), run_model(x))
        assert (grown_base(x) - run_model(x)).abs().max() > 1e-3


def test_a_merge_keeps_the_trained_rows(lora_run, tmp_path):
    assert main(["lora", "merge", str(lora_run), "--out", str(tmp_path / "merged")]) == 0
    merged = load_checkpoint(tmp_path / "merged").model.eval()
    run_model = load_checkpoint(lora_run).model.eval()
    assert torch.equal(merged.tok_emb.weight, run_model.tok_emb.weight)
    x = _chat_tokens()
    with torch.no_grad():
        torch.testing.assert_close(merged(x), run_model(x), rtol=1e-4, atol=1e-5)


def test_a_peft_export_of_the_run_gives_its_logits_in_peft(base_run, lora_run, grown_base, tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    save_hf(grown_base, tmp_path / "base")  # the grown base, rows at the mean
    model = load_adapter(load_base(base_run)[0], lora_run / "adapter").eval()
    save_peft_adapter(model, tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["trainable_token_indices"] == NEW
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32,
                                                           attn_implementation="eager")
    theirs = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    x = _chat_tokens()
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=x).logits, model(x), rtol=0, atol=1e-4)


def test_the_run_adapter_is_written_from_a_checkpoint_alone(lora_run, tmp_path):
    """save_run_adapter finds the rows from the checkpoint's config and tokenizer, not the run's data folder."""
    from burnout.finetune.adapters import save_run_adapter

    ckpt = list_checkpoints(lora_run)[-1]
    assert (ckpt / TOKENIZER_FILE).is_file()
    out = save_run_adapter(tmp_path, ckpt)
    assert json.loads((out / "adapter_config.json").read_text())["token_rows"] == NEW


# ----------------------------------------------------------------------------------------------
# Which runs train rows


def test_dpo_and_full_fine_tunes_train_no_rows(lora_run):
    cfg = load_saved_config(lora_run / "config.yaml")
    # A DPO run of an earlier version kept its base's sft section, added_tokens included: its base already has them.
    dpo = dataclasses.replace(cfg, dpo=DPOConfig(base="b", source="s", lora=AdapterConfig(r=4, alpha=8)))
    assert lora_token_rows(dpo) == []
    model = build_model(dpo, CPU)
    assert token_rows(model) == () and not model.tok_emb.weight.requires_grad
    full = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, lora=None))
    assert lora_token_rows(full) == [] and build_model(full, CPU).tok_emb.weight.requires_grad


def test_rows_refuse_fsdp_and_a_missing_tokenizer(lora_run, tmp_path):
    cfg = load_saved_config(lora_run / "config.yaml")
    perf = dataclasses.replace(cfg.train.perf, distributed="fsdp")
    fsdp = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, perf=perf))
    with pytest.raises(BurnoutError, match=r"^train\.distributed: a LoRA fine-tune that added tokens"):
        build_model(fsdp, CPU)
    moved = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, prepared_dir=str(tmp_path)))
    with pytest.raises(BurnoutError, match=r"tokenizer file .* does not exist"):
        build_model(moved, CPU)


# ----------------------------------------------------------------------------------------------
# The optimizer: frozen rows stay bitwise


TINY = {"tied": ModelConfig(family="llama", vocab_size=96, n_layer=2, d_model=32, n_head=4, n_kv_head=2,
                            ffn_hidden=64, context_length=32, tie_embeddings=True),
        "untied": ModelConfig(family="gpt2", vocab_size=96, n_layer=2, d_model=32, n_head=4, context_length=32,
                              tie_embeddings=False)}


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("tie", ["tied", "untied"])
def test_adamw_moves_the_trained_rows_alone_with_weight_decay_on(tie, optimizer):
    torch.manual_seed(0)
    rows = [3, 94, 95]
    model = apply_lora(Transformer(TINY[tie]), LoRAConfig(r=2, alpha=4), row_ids=rows).train()
    matrices = {id(p): p for p in (model.tok_emb.weight, model.lm_head.weight)}
    before = {key: p.detach().clone() for key, p in matrices.items()}
    tc = TrainConfig(optim=OptimConfig(lr=1e-2, weight_decay=0.5, optimizer=optimizer))
    opt = make_optimizer(model, tc)
    adamw = opt.optimizers[-1]
    assert all(group["weight_decay"] == 0.0 for group in adamw.param_groups
               if any(id(p) in matrices for p in group["params"]))
    assert all(id(p) not in matrices for o in opt.optimizers[:-1] for g in o.param_groups for p in g["params"])
    assert adamw.defaults["fused"]  # the kernel the runs use
    for step in range(4):
        x = torch.randint(0, 96, (4, 17), generator=torch.Generator().manual_seed(step))
        x[:, ::3], x[:, 1::5], x[:, 2::7] = 95, 3, 94  # every trained row an input, so its gradient is not 0
        model(x[:, :-1], targets=x[:, 1:]).backward()
        opt.step()
        opt.zero_grad()
    others = [i for i in range(96) if i not in rows]
    for key, p in matrices.items():
        assert torch.equal(p.detach()[others], before[key][others])
        assert (p.detach()[rows] - before[key][rows]).abs().amax(dim=1).min() > 0
