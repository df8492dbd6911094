"""burnout/core/gguf_export.py: `burnout export RUN --to FILE.gguf` writes a file that llama.cpp itself runs as we do.

llama.cpp's own Python bindings (llama-cpp-python) load each exported file: an f16 file's logits are ours within 2e-3
and its greedy continuations ours token for token, both families, and a LoRA fine-tune's with its adapters merged; a
q8_0 file's next-token argmax agrees with ours on >= 95% of the positions of held-out text and its perplexity is
within 1% of ours (q4_0: 90% and 2%); llama.cpp tokenizes text, and renders and tokenizes a chat (its Jinja template,
and its own C++ ChatML), to our ids; a chat export answers through llama.cpp's chat completion and stops at
<|im_end|>. The file is replaced only when it is an export of the same checkpoint, or of another with --overwrite.
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from burnout.cli import main
from burnout.core.checkpoint import list_checkpoints
from burnout.core.model_files import load_model

PROMPTS = ["The ", "def main(", "import os\nimport sys\n", "In Python, a list is", "    return "]
TEXTS = ["Hello world", "  two  spaces and\ttabs\n\n\nnewlines  ", "it's we'll they're I'M", "x = 3.14159 * 2**10",
         "naïve café — 東京 🙂", "def f(a, b):\n    return a+b  # sum", "   leading and trailing   "]
HELD_OUT_WINDOWS = 8  # windows of the val split, of the model's context length each
# llama.cpp computes an f16 file's matrix products with f16 weights and activations, we in fp32: its logits differ
# from ours by ~5e-4 (tiny_run, logits' std ~1.1). Rotating q and k in the wrong RoPE layout moves them by ~7e-3.
F16_LOGIT_TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def llama_cpp():
    pytest.importorskip("gguf")
    return pytest.importorskip("llama_cpp")


GPT2_RUNS = {"gpt2": [],  # the family's conventions: biases, and the head tied to the embedding
             # llama.cpp's gpt2 gets zero biases, and the head as its own output tensor
             "gpt2 without biases": ["model.bias=false", "model.tie_embeddings=false"]}


@pytest.fixture(scope="module")
def gpt2_runs(tiny_run_config, tiny_bpe_data, tmp_path_factory):
    """tiny_run's gpt2 twins (GPT2_RUNS), each trained when first asked for."""
    from burnout.runs import start_training

    made = {}

    def run(name):
        if name not in made:
            # Trained until its next-token choices are clear (a median top-2 gap of ~0.3 nats; at 24 steps it was
            # ~0.03, below q4_0's rounding of the logits, so the argmax test measured ties, not the export).
            cfg = tiny_run_config(["model.family=gpt2", "model.n_kv_head=4", *GPT2_RUNS[name]], max_steps=96,
                                  grad_accum=2)
            made[name] = tmp_path_factory.mktemp("gpt2_run") / "run"
            start_training(cfg, made[name], data_dir=tiny_bpe_data, on_event=lambda line: None, progress=False)
        return made[name]
    return run


@pytest.fixture(params=["llama", *GPT2_RUNS])
def trained_run(request, tiny_run, gpt2_runs):
    """A trained run of each family: tiny_run (a llama with grouped-query attention and tied embeddings) and the gpt2
    runs of GPT2_RUNS."""
    return tiny_run.run_dir if request.param == "llama" else gpt2_runs(request.param)


def export(run, folder, gguf_type: str):
    out = folder / f"model-{gguf_type}.gguf"
    assert main(["export", str(run), "--to", str(out), "--gguf-type", gguf_type]) == 0
    return out


def in_llama_cpp(llama_cpp, path, context: int, logits_all: bool = False):
    return llama_cpp.Llama(model_path=str(path), n_ctx=context, n_threads=2, logits_all=logits_all, verbose=False)


@pytest.fixture(scope="module")
def lora_chat_run(tiny_run, fine_tune_data, tmp_path_factory):
    """chat_run's fine-tune with rank-4 LoRA adapters on attention and MLP instead of every weight."""
    from burnout.config import load_run_config
    from burnout.runs import start_training

    run = tmp_path_factory.mktemp("lora_chat_run") / "run"
    train = {"device": "cpu", "precision": "fp32", "batch_size": 4, "seq_len": 64, "max_steps": 6, "lr": 1e-2,
             "warmup_steps": 2, "eval_interval": 6, "ckpt_interval": 6}
    cfg = load_run_config({"sft": {"base": str(tiny_run.run_dir), "source": str(fine_tune_data.chats),
                                   "lora": {"r": 4, "alpha": 8}}, "train": train})
    start_training(cfg, run, on_event=lambda line: None, progress=False)
    return run


@pytest.mark.slow
def test_f16_logits_are_ours_and_greedy_continuations_equal_ours_token_for_token(llama_cpp, trained_run,
                                                                                  tiny_bpe_data, tmp_path):
    assert_runs_as_ours(llama_cpp, trained_run, export(trained_run, tmp_path, "f16"), tiny_bpe_data)


@pytest.mark.slow
def test_a_lora_fine_tune_exports_with_its_adapters_merged(llama_cpp, lora_chat_run, tiny_bpe_data, tmp_path):
    from burnout.models.lora import lora_layers

    assert lora_layers(load_model(lora_chat_run)[0])  # ours runs with its adapters beside the base weights
    assert_runs_as_ours(llama_cpp, lora_chat_run, export(lora_chat_run, tmp_path, "f16"), tiny_bpe_data)


def assert_runs_as_ours(llama_cpp, run, gguf_file, data) -> None:
    """llama.cpp's logits over held-out text are ours within F16_LOGIT_TOLERANCE, and its greedy continuation of each
    prompt, up to the context's end, is ours token for token."""
    from burnout.generate.sampling import stream_tokens

    model, tokenizer, _ = load_model(run)
    context = model.cfg.context_length
    llm = in_llama_cpp(llama_cpp, gguf_file, context, logits_all=True)
    windows = held_out_windows(data, context)
    ours, theirs = our_logits(model, windows), llama_cpp_logits(llm, windows)
    largest = (theirs - ours).abs().max().item()
    print(f"{run}: f16 logits within {largest:.2e} of ours over {windows.size} positions")
    assert largest <= F16_LOGIT_TOLERANCE
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt).ids
        steps = context - len(ids)
        ours = list(stream_tokens(model, ids, steps, temperature=0.0))
        theirs = []
        for token in llm.generate(ids, temp=0.0, reset=True):
            theirs.append(token)
            if len(theirs) == steps:
                break
        assert theirs == ours, prompt


@pytest.mark.slow
@pytest.mark.parametrize("gguf_type, agreement, perplexity_margin", [("q8_0", 0.95, 0.01), ("q4_0", 0.90, 0.02)])
def test_quantized_next_token_argmax_and_perplexity_agree_with_ours(llama_cpp, trained_run, tiny_bpe_data, tmp_path,
                                                                    gguf_type, agreement, perplexity_margin):
    model, _, _ = load_model(trained_run)
    context = model.cfg.context_length
    windows = held_out_windows(tiny_bpe_data, context)
    llm = in_llama_cpp(llama_cpp, export(trained_run, tmp_path, gguf_type), context, logits_all=True)
    ours, theirs = our_logits(model, windows), llama_cpp_logits(llm, windows)

    agreed = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    targets = torch.from_numpy(windows[:, 1:]).reshape(-1)

    def perplexity(logits):
        return math.exp(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), targets))

    ratio = perplexity(theirs) / perplexity(ours)
    print(f"{model.cfg.family} {gguf_type}: argmax agreement {agreed:.4f} over {windows.size} positions, "
          f"perplexity ratio {ratio:.4f}")
    assert agreed >= agreement
    assert abs(ratio - 1) <= perplexity_margin


def held_out_windows(data, context: int) -> np.ndarray:
    """HELD_OUT_WINDOWS rows of `context` tokens from the start of the val split, which training never saw."""
    from burnout.data.shards import read_tokens

    val = read_tokens(data, "val").astype(np.int64)
    return val[: HELD_OUT_WINDOWS * context].reshape(HELD_OUT_WINDOWS, context)


def our_logits(model, windows: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.from_numpy(windows)).float()


def llama_cpp_logits(llm, windows: np.ndarray) -> torch.Tensor:
    rows = []
    for window in windows:
        llm.reset()
        llm.eval(window.tolist())
        rows.append(np.array(llm.scores[: len(window)], dtype=np.float32))
    return torch.from_numpy(np.stack(rows))


@pytest.fixture(scope="module")
def gpt2_bpe_checkpoint(chatml_gpt2, tmp_path_factory):
    """An untrained one-layer llama over GPT-2's own BPE (50,000 merges) with the chat tokens: a tokenizer to export."""
    from burnout.config import load_run_config
    from burnout.core.checkpoint import save_checkpoint
    from burnout.models import Transformer

    root = tmp_path_factory.mktemp("gpt2_bpe")
    chatml_gpt2.save(str(root / "tokenizer.json"))
    cfg = load_run_config({"model": {"family": "llama", "vocab_size": chatml_gpt2.get_vocab_size(), "n_layer": 1,
                                     "d_model": 64, "n_head": 4, "context_length": 64, "ffn_multiple_of": 32}})
    save_checkpoint(root / "run", cfg, Transformer(cfg.model), {"step": 0, "tokens": 0}, {"step": 0, "tokens": 0},
                    root / "tokenizer.json", keep_last=1)
    return root / "run"


@pytest.mark.parametrize("which", ["tiny_run's BPE", "GPT-2's BPE"])
def test_llama_cpp_tokenizes_and_detokenizes_text_as_we_do(llama_cpp, which, tiny_run, gpt2_bpe_checkpoint,
                                                           shared_data, tmp_path):
    run = tiny_run.run_dir if which == "tiny_run's BPE" else gpt2_bpe_checkpoint
    _, tokenizer, _ = load_model(run)
    vocab = llama_cpp.Llama(model_path=str(export(run, tmp_path, "f16")), vocab_only=True, verbose=False)
    wiki = (shared_data / "wikitext2" / "wiki.test.raw").read_text(encoding="utf-8")[:20_000]
    for text in [*TEXTS, wiki]:
        ids = tokenizer.encode(text).ids
        assert vocab.tokenize(text.encode(), add_bos=False, special=False) == ids, text[:100]
        assert vocab.detokenize(ids) == text.encode(), text[:100]
    # Special tokens as one control token each, parsed where asked to.
    stories = (shared_data / "tinystories" / "tinystories_sample.txt").read_text(encoding="utf-8")
    for text in ("one<|endoftext|>two", stories):
        assert vocab.tokenize(text.encode(), add_bos=False, special=True) == tokenizer.encode(text).ids


def test_chat_export_answers_through_llama_cpp_chat_completion_and_stops_at_im_end(llama_cpp, chat_checkpoint,
                                                                                    tmp_path):
    from burnout.core.chat_template import chat_token_ids

    model, tokenizer, _ = load_model(chat_checkpoint.run_dir)
    llm = in_llama_cpp(llama_cpp, export(chat_checkpoint.run_dir, tmp_path, "f16"), model.cfg.context_length)
    reply = llm.create_chat_completion(messages=[{"role": "user", "content": "What is the capital of France?"}],
                                       max_tokens=20, temperature=0.0)
    # The rig answers again after <|im_end|>: only stopping there ends the reply at the answer, before max_tokens.
    assert reply["choices"][0]["message"]["content"] == chat_checkpoint.answer
    assert reply["choices"][0]["finish_reason"] == "stop"
    # llama.cpp also ends a turn at any token it knows by the name <|im_end|>; Ollama and others read the EOS id.
    assert llm.token_eos() == chat_token_ids(tokenizer)[1]


def test_llama_cpp_renders_and_tokenizes_a_conversation_as_we_do(llama_cpp, chat_run, tmp_path):
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from burnout.core.chat_template import encode_prompt

    _, tokenizer, _ = load_model(chat_run)
    llm = llama_cpp.Llama(model_path=str(export(chat_run, tmp_path, "f16")), vocab_only=True, verbose=False)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital 3?"},
                {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "  And  4?\n"}]
    formatter = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], eos_token="<|im_end|>",
                                    bos_token="<|endoftext|>")
    prompt = formatter(messages=messages).prompt
    assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == encode_prompt(tokenizer, messages)
    # What llama-cli and llama-server build without --jinja: the built-in template llama.cpp recognizes in the file's.
    # Ours trims each message's content, llama.cpp's ChatML does not: the same for content without surrounding space.
    trimmed = [{**m, "content": m["content"].strip()} for m in messages]
    native = native_chat_prompt(llama_cpp, llm, trimmed)
    assert llm.tokenize(native.encode(), add_bos=False, special=True) == encode_prompt(tokenizer, messages)


def native_chat_prompt(llama_cpp, llm, messages: list[dict]) -> str:
    template = llama_cpp.llama_model_chat_template(llm.model, None)
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *(llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages))
    buffer = ctypes.create_string_buffer(4096)
    length = llama_cpp.llama_chat_apply_template(template, chat, len(messages), True, buffer, len(buffer))
    assert 0 < length <= len(buffer), length
    return buffer.raw[:length].decode()


def test_gguf_export_rewrites_its_own_and_replaces_another_checkpoints_only_with_overwrite(sampled_runs, tmp_path,
                                                                                          capsys, export_label):
    pytest.importorskip("gguf")
    first, last = list_checkpoints(sampled_runs[0])[0], list_checkpoints(sampled_runs[0])[-1]
    out = tmp_path / "model.gguf"
    assert main(["export", str(first), "--to", str(out)]) == 0
    assert main(["export", str(first), "--to", str(out)]) == 0  # the same checkpoint's export: written again
    written = out.read_bytes()
    capsys.readouterr()

    assert main(["export", str(sampled_runs[0]), "--to", str(out)]) == 2  # the run's latest: another checkpoint
    assert capsys.readouterr().err == (f"burnout: error: --to {out} holds a GGUF export of {export_label(first)}, not "
                                       f"of {export_label(last)}; pass --overwrite to replace it, or choose another "
                                       "file\n")
    assert out.read_bytes() == written

    assert main(["export", str(sampled_runs[0]), "--to", str(out), "--overwrite"]) == 0
    assert out.read_bytes() != written
    assert main(["export", str(last), "--to", str(out)]) == 0  # now the file is that checkpoint's export
    assert main(["export", str(first), "--to", str(out)]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "model.md"]  # and its card; no temporary file


def test_without_the_gguf_package_the_export_says_how_to_install_it(sampled_runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError, as where it is not installed
    assert main(["export", str(sampled_runs[0]), "--to", str(tmp_path / "model.gguf")]) == 2
    assert capsys.readouterr().err == ("burnout: error: a GGUF export needs the gguf package; pip install "
                                       "'gpuburnout[gguf]' (from a clone: pip install -e '.[gguf]')\n")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["M.GGUF", "model.Gguf"])
def test_a_gguf_suffix_in_any_case_writes_a_gguf_file_beside_the_users_files(sampled_runs, tmp_path, name, capsys):
    """A GGUF file however its suffix is written; a FILE.md of the user's where its card would go is kept."""
    gguf = pytest.importorskip("gguf")
    out, mine = tmp_path / name, tmp_path / f"{Path(name).stem}.md"
    mine.write_text("my notes\n")
    assert main(["export", str(sampled_runs[0]), "--to", str(out)]) == 0
    assert out.is_file()
    assert gguf.GGUFReader(out).get_field("general.architecture").contents() == "llama"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, mine.name])
    assert mine.read_text() == "my notes\n" and f"keeping the {mine.name} there" in capsys.readouterr().out


@pytest.mark.parametrize("to, said", [
    ("model.gguf/", "ends in .gguf (a GGUF file) and in / (a folder)"),
    ("model.safetensors", "names a .safetensors file, but an export is a Hugging Face folder"),
    ("weights.BIN", "names a .bin file, but an export is a Hugging Face folder")])
def test_a_to_that_could_be_a_file_or_a_folder_is_said_and_nothing_is_written(sampled_runs, tmp_path, capsys, to,
                                                                              said):
    assert main(["export", str(sampled_runs[0]), "--to", str(tmp_path) + os.sep + to]) == 2
    err = capsys.readouterr().err
    assert err.startswith("burnout: error: --to ") and said in err and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())


def _file_size_limit(limit: int):
    def apply():  # files may not grow past `limit`: a write fails with EFBIG, as with ENOSPC on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return apply


@pytest.mark.slow
def test_a_gguf_write_cut_short_names_the_file_and_leaves_nothing_of_it(sampled_runs, tmp_path):
    """The write fails part way (a file-size limit, as a full disk): one line naming the file, exit code 74, no partial
    or temporary file left, the earlier export at --to and the user's own file beside it byte for byte as they were."""
    pytest.importorskip("gguf")
    out, mine = tmp_path / "model.gguf", tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    checkpoint = list_checkpoints(sampled_runs[0])[-1]
    assert main(["export", str(checkpoint), "--to", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert len(before[out.name]) > 128 * 1024
    command = [sys.executable, "-m", "burnout", "export", str(checkpoint), "--to", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit(64 * 1024))
    assert proc.returncode == 74, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert lines[0].startswith(f"burnout: error: writing the GGUF file {out} failed ("), lines[0]
    assert "); nothing of it was kept and the earlier model.gguf is as it was: check that" in lines[0], lines[0]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_disk_without_room_for_the_gguf_file_is_said_before_writing(sampled_runs, tmp_path, monkeypatch, capsys):
    import shutil
    from collections import namedtuple

    pytest.importorskip("gguf")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 50_000, 50_000))
    out = tmp_path / "model.gguf"
    assert main(["export", str(sampled_runs[0]), "--to", str(out)]) == 74
    err = capsys.readouterr().err
    assert err.startswith(f"burnout: error: --to {out}: the GGUF file takes about ") and err.count("\n") == 1, err
    assert "and its disk has 50.0 kB free" in err
    assert not list(tmp_path.iterdir())
