"""`burnout export` of a chat checkpoint: transformers' apply_chat_template on the folder gives exactly our prompt
ids, and transformers' generate stops at <|im_end|>. The model is the rigged bigram of `chat_checkpoint`,
which answers "Paris." + <|im_end|> and would start the answer again after it."""

import json

import pytest
import torch

from burnout.core.chat_template import CHAT_TEMPLATE, IM_END, IM_START, encode_prompt
from burnout.core.model_files import export_hf, load_model
from burnout.errors import BurnoutError
from burnout.generate.chat import chat_replies
from burnout.models.hf import save_hf

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "  And Italy?\n"}],
    [{"role": "user", "content": "ünïcödé 中文 😀 <b>tags</b>\n\n  indented"}],
]


@pytest.fixture(scope="module")
def exported(chat_checkpoint, tmp_path_factory):
    return export_hf(chat_checkpoint.run_dir, tmp_path_factory.mktemp("export") / "hf")


def test_tokenizer_config_carries_the_template_and_apply_chat_template_gives_our_ids(exported, chat_checkpoint):
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE and config["eos_token"] == IM_END
    _, tokenizer, _ = load_model(chat_checkpoint.run_dir)
    hf = transformers.AutoTokenizer.from_pretrained(str(exported))
    assert hf.eos_token == IM_END and {IM_START, IM_END} <= set(hf.all_special_tokens)
    for messages in CONVERSATIONS:
        ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert ids == encode_prompt(tokenizer, messages)
    # The answer decodes without the turn's end when special tokens are skipped.
    assert hf.decode([*chat_checkpoint.answer_ids, hf.eos_token_id], skip_special_tokens=True) == "Paris."


def test_transformers_generate_stops_at_im_end(exported, chat_checkpoint):
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(exported))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(exported))
    end = hf_tok.convert_tokens_to_ids(IM_END)
    assert model.generation_config.eos_token_id[0] == end
    prompt = hf_tok.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                             pad_token_id=hf_tok.convert_tokens_to_ids("<|endoftext|>"))
    new = out[0, len(prompt):].tolist()
    # Without <|im_end|> among the eos ids it would go on: "Paris." <|im_end|> "Paris." … for 12 tokens.
    assert new == [*chat_checkpoint.answer_ids, end]
    # Our sampler answers the same.
    ours, tokenizer, _ = load_model(chat_checkpoint.run_dir)
    assert chat_replies(ours, tokenizer, [CONVERSATIONS[0][0]["content"]], 12, temperature=0.0) == [
        hf_tok.decode(new, skip_special_tokens=True)]


def test_a_base_export_has_no_template_and_a_chat_export_needs_the_tokens(chat_checkpoint, tmp_path):
    model, _, ckpt = load_model(chat_checkpoint.run_dir)
    base = save_hf(model, tmp_path / "base", tokenizer_path=ckpt.path)
    assert "chat_template" not in json.loads((base / "tokenizer_config.json").read_text())
    assert not isinstance(json.loads((base / "generation_config.json").read_text()).get("eos_token_id"), list)

    plain = tmp_path / "plain.json"
    tok = json.loads((ckpt.path / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != IM_END]
    plain.write_text(json.dumps(tok))
    with pytest.raises(BurnoutError, match=r"has no <\|im_end\|> token") as excinfo:
        save_hf(model, tmp_path / "bad", tokenizer_path=plain, chat_template=CHAT_TEMPLATE,
                chat_tokens=(IM_START, IM_END))
    assert "\n" not in str(excinfo.value)


def test_a_lora_chat_checkpoint_exports_merged_weights(chat_checkpoint, tmp_path):
    from burnout.config import load_run_config
    from burnout.core.checkpoint import save_checkpoint
    from burnout.models.lora import LoRAConfig, apply_lora

    model, _, ckpt = load_model(chat_checkpoint.run_dir)
    raw = ckpt.config.to_dict()
    raw["sft"]["lora"] = {"r": 2, "alpha": 4.0, "targets": ["attn", "mlp"]}
    cfg = load_run_config(raw)
    apply_lora(model, LoRAConfig(r=2, alpha=4.0, targets=("attn", "mlp")))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.5)
    save_checkpoint(tmp_path / "lora", cfg, model, {"step": 1, "tokens": 1}, {"step": 1, "tokens": 1},
                    ckpt.path / "tokenizer.json", keep_last=1)
    out = export_hf(tmp_path / "lora", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    x = torch.tensor([[1, 5, 9, 200, 17]])
    with torch.no_grad():
        ours = model(x)
        theirs = hf(x).logits
    assert (ours - load_model(chat_checkpoint.run_dir)[0](x)).abs().max() > 1e-2  # the adapters change the model
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
