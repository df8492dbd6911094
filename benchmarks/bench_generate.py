"""Decoding speed: our KV-cached greedy loop against transformers' `generate` on the same exported weights.

    python -m benchmarks.bench_generate [--preset llama-tiny] [--prompt-tokens 32] [--new-tokens 128]
                                        [--batch 1] [--device auto] [--repeats 3]

Builds the preset with random weights, exports it with save_hf, loads the folder with
AutoModelForCausalLM (SDPA attention), then times greedy decoding of the same prompt for the same number
of new tokens in both (best of --repeats, after a warm-up) and prints tokens/s and the ratio. The first
continuation of each is compared token for token.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from benchmarks import results
from burnout.config import load_model_preset
from burnout.core.device import resolve_device
from burnout.generate.sampling import generate_batch
from burnout.models import Transformer
from burnout.models.hf import save_hf


def best_seconds(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up: kernels, allocator, caches
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-tiny")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = results.load()
    import transformers

    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    cfg = load_model_preset(args.preset)
    torch.manual_seed(0)
    ours = Transformer(cfg).to(device=device, dtype=dtype).eval()
    with tempfile.TemporaryDirectory() as folder:
        save_hf(ours, folder)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
    theirs = theirs.to(device).eval()
    prompt = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_tokens),
                           generator=torch.Generator().manual_seed(1))
    n = args.new_tokens

    def run_ours():
        return generate_batch(ours, prompt.tolist(), n, temperature=0)

    @torch.no_grad()
    def run_theirs():
        return theirs.generate(prompt.to(device), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                               pad_token_id=0, eos_token_id=None)

    ours_s = best_seconds(run_ours, args.repeats, device)
    theirs_s = best_seconds(run_theirs, args.repeats, device)
    same = run_ours()[0] == run_theirs()[0, args.prompt_tokens:].tolist()
    tokens = args.batch * n
    print(f"{args.preset} ({sum(p.numel() for p in ours.parameters()):,} params) on {device}, {args.dtype}, "
          f"batch {args.batch}, prompt {args.prompt_tokens}, {n} new tokens, greedy; transformers "
          f"{transformers.__version__}, torch {torch.__version__}")
    print(f"  burnout generate_batch      {tokens / ours_s:10.1f} tokens/s  ({ours_s * 1000:.1f} ms)")
    print(f"  transformers generate       {tokens / theirs_s:10.1f} tokens/s  ({theirs_s * 1000:.1f} ms)")
    print(f"  ratio ours / transformers   {theirs_s / ours_s:10.2f}x    same greedy tokens: {same}")
    if (args.preset, args.prompt_tokens, args.new_tokens, args.batch, args.dtype) == ("llama-tiny", 32, 128, 1,
                                                                                       "float32") and same:
        results.record("data.kv_decoding_ratio", theirs_s / ours_s, load_before=load_before,
                       note=f"best of {args.repeats} each, on {device}")


if __name__ == "__main__":
    main()
