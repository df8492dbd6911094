"""The `burnout` command: argument parsing only; every subcommand calls an importable function."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from burnout.errors import BurnoutError


def _overrides(values: list[str], unknown: list[str]) -> list[str]:
    """`key=value` positionals plus `--key value` / `--key=value` flags, as `key=value` strings."""
    result = list(values)
    i = 0
    while i < len(unknown):
        flag = unknown[i]
        if not flag.startswith("--") or flag == "--":
            raise BurnoutError(f"unexpected argument '{flag}'; overrides look like train.lr=3e-4 or --train.lr 3e-4")
        if "=" in flag:
            result.append(flag[2:])
            i += 1
        elif i + 1 < len(unknown):
            result.append(f"{flag[2:]}={unknown[i + 1]}")
            i += 2
        else:
            raise BurnoutError(f"option '{flag}' needs a value")
    return result


def cmd_quickstart(args, overrides):
    from burnout.quickstart import quickstart

    quickstart(Path(args.out), minutes=args.minutes, overrides=overrides)


def cmd_model_info(args, overrides):
    from burnout.config import apply_override, load_model_preset
    from burnout.models.info import format_model_info, model_info

    raw: dict = {}
    for item in overrides:
        apply_override(raw, item.removeprefix("model."))
    cfg = load_model_preset(args.preset, raw)
    info = model_info(cfg, batch_size=args.batch_size, seq_len=args.seq_len, precision=args.precision)
    print(json.dumps(info, indent=2) if args.json else format_model_info(args.preset, info))


def cmd_model_list(args, overrides):
    from burnout.config import load_model_preset, model_preset_names
    from burnout.models.info import model_info

    for name in model_preset_names():
        info = model_info(load_model_preset(name))
        print(f"{name:<18} {info['family']:<6} {info['params_total']:>15,} params")


def cmd_data_prepare(args, overrides):
    from burnout.config import load_run_config
    from burnout.data.prepare import prepare_data

    cfg = load_run_config(args.config, overrides)
    meta = prepare_data(cfg.data, cfg.tokenizer, Path(args.out), progress=True)
    splits = meta["splits"]
    print(f"prepared {splits['train']['tokens']:,} train and {splits['val']['tokens']:,} val tokens "
          f"(vocab {meta['vocab_size']:,}) in {args.out}")


def cmd_train(args, overrides):
    from burnout.config import load_run_config
    from burnout.train.run import resume_training, start_training

    if args.resume:
        if args.config or args.out or args.data:
            raise BurnoutError("--resume RUN takes no CONFIG, --out or --data: the run folder holds them")
        result = resume_training(Path(args.resume), overrides)
    else:
        if not args.config or not args.out:
            raise BurnoutError("train needs a CONFIG and --out RUN_DIR (or --resume RUN_DIR)")
        cfg = load_run_config(args.config, overrides)
        result = start_training(cfg, Path(args.out), data_dir=Path(args.data) if args.data else None)
    print(f"done: step {result.step}, {result.tokens:,} tokens, train loss {result.train_loss:.4f}, "
          f"val loss {result.val_loss:.4f}, {result.tokens_per_s:,.0f} tokens/s; checkpoint {result.checkpoint}")


def cmd_generate(args, overrides):
    from burnout.data.tokenizer import load_tokenizer
    from burnout.generate.sampling import stream_tokens
    from burnout.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(args.checkpoint)
    tokenizer = load_tokenizer(ckpt.path / "tokenizer.json")
    prompt_ids = tokenizer.encode(args.prompt).ids
    sys.stdout.write(args.prompt)
    new_ids: list[int] = []
    printed = ""
    for token in stream_tokens(ckpt.model, prompt_ids, args.max_new_tokens, temperature=args.temperature,
                               top_k=args.top_k, seed=args.seed, stop_id=tokenizer.token_to_id("<|endoftext|>")):
        new_ids.append(token)
        # Decode the whole continuation each time: a byte-level token can be half a character.
        text = tokenizer.decode(new_ids)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
    sys.stdout.write(tokenizer.decode(new_ids)[len(printed):] + "\n")


def cmd_export(args, overrides):
    from burnout.models.hf import save_hf
    from burnout.data.tokenizer import load_tokenizer
    from burnout.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(args.checkpoint)
    tokenizer_path = ckpt.path / "tokenizer.json"
    eos = load_tokenizer(tokenizer_path).token_to_id("<|endoftext|>")
    save_hf(ckpt.model, Path(args.to), tokenizer_path=tokenizer_path, eos_token_id=eos)
    print(f"wrote a Hugging Face model folder to {args.to} (load it with AutoModelForCausalLM.from_pretrained)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="burnout",
        description="GPUburnout: train language models from scratch — data, tokenizer, model, training, use.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("quickstart", help="offline demo: stdlib corpus → BPE → small LLaMA trained on CPU → samples",
                       description="Prepare the embedded corpus, train a small LLaMA-style model for about N "
                                   "minutes, then print validation loss, samples and where everything is.")
    p.add_argument("--out", default="runs/quickstart", help="folder for data, run and checkpoints")
    p.add_argument("--minutes", type=float, default=3.0, help="training time budget (default 3)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. train.batch_size=8")
    p.set_defaults(func=cmd_quickstart)

    p = sub.add_parser("model", help="inspect model presets: parameters, FLOPs, memory",
                       description="Inspect model presets.")
    model_sub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    q = model_sub.add_parser("info", help="parameters, FLOPs per token and memory of a preset",
                             description="Parameters, FLOPs per token and memory of a preset (built on the meta "
                                         "device: costs no memory). Extra KEY=VALUE arguments change model fields.")
    q.add_argument("preset")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.add_argument("--batch-size", type=int, default=1)
    q.add_argument("--seq-len", type=int, default=None, help="default: the model's context length")
    q.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    q.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    q.set_defaults(func=cmd_model_info)
    q = model_sub.add_parser("list", help="every preset with its family and size", description="List presets.")
    q.set_defaults(func=cmd_model_list)

    p = sub.add_parser("data", help="prepare token data from a recipe", description="Data stage commands.")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    q = data_sub.add_parser("prepare", help="mix sources, train the tokenizer, write train/val token files",
                            description="Mix the config's data sources, train its tokenizer and write "
                                        "train.bin / val.bin / tokenizer.json / meta.json into --out.")
    q.add_argument("config", help="run config YAML (its data and tokenizer sections are used)")
    q.add_argument("--out", required=True)
    q.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    q.set_defaults(func=cmd_data_prepare)

    p = sub.add_parser("train", help="train a model from a YAML config (or resume a run)",
                       description="Train from a run config. Data comes from --data, data.prepared_dir, or is "
                                   "prepared into RUN/data from the config's sources.")
    p.add_argument("config", nargs="?", help="run config YAML or a built-in name (e.g. quickstart)")
    p.add_argument("--out", help="run folder to create")
    p.add_argument("--resume", metavar="RUN", help="continue the run in this folder from its latest checkpoint")
    p.add_argument("--data", help="prepared data folder (from `burnout data prepare`)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("generate", help="continue a prompt with a trained checkpoint",
                       description="Sample a continuation from a checkpoint (a run folder means its latest).")
    p.add_argument("checkpoint")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 means greedy")
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face model folder",
                       description="Write safetensors + config.json + tokenizer files that transformers' "
                                   "AutoModelForCausalLM and AutoTokenizer load offline.")
    p.add_argument("checkpoint")
    p.add_argument("--to", required=True, help="output folder")
    p.set_defaults(func=cmd_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    try:
        overrides = _overrides(getattr(args, "overrides", []), unknown)
        args.func(args, overrides)
    except BurnoutError as exc:
        print(f"burnout: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("burnout: interrupted", file=sys.stderr)
        return 130
    return 0
