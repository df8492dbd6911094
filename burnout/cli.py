"""The `burnout` command: argument parsing only; every subcommand calls an importable function.

Layout: one unit per subcommand. `@command("export", help=..., description=...)` registers a setup
function that declares the subcommand's arguments on its parser and returns the handler,
`run(args, overrides)`, written right below them, which calls the command's public function with the
parsed options; nested subcommands register under their group (`group("model", ...)`, then
`@command("model", "info", ...)`); `sft`, `dpo` and `rl` are one unit, a row each of FINE_TUNE_COMMANDS.
`build_parser()` turns the registry into argparse subparsers in the order the units appear in this file, and
`main()` runs the chosen handler, turning errors into one `burnout: error:` line and an exit code, and anything else
(a bug) into one `burnout: internal error:` line naming the file its trace is saved in. Handlers import lazily, so
`--help` never imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from burnout.base.files import user_cache_dir
from burnout.base.machine import retain_freed_memory, spare_busy_cores
from burnout.base.text import first_line, plural
from burnout.base.values import SEED_MAX, checked_number
from burnout.errors import BurnoutError

# A handler gets the parsed arguments and the `key=value` overrides; it returns an exit code or None (0).
Handler = Callable[[argparse.Namespace, list[str]], "int | None"]
Setup = Callable[[argparse.ArgumentParser], Handler]

# (path, help and description, setup): a setup of None marks a group whose actions follow.
_UNITS: list[tuple[tuple[str, ...], dict[str, str], Setup | None]] = []
# The paths of the subcommands that train or run a model.
_COMPUTING: set[tuple[str, ...]] = set()


def group(name: str, *, help: str, description: str) -> None:
    """Register a command that holds actions (`burnout NAME ACTION`); register them after it."""
    _UNITS.append(((name,), {"help": help, "description": description}, None))


def command(*path: str, help: str, description: str, computes: bool = False) -> Callable[[Setup], Setup]:
    """Register a subcommand (`"train"`, or `"model", "info"` under a group): the decorated function adds
    the subcommand's arguments to the parser it is given and returns the handler. `computes`: it trains or runs a
    model, so `main` sets how torch's CPU threads wait before torch loads (spare_busy_cores)."""
    def register(setup: Setup) -> Setup:
        _UNITS.append((path, {"help": help, "description": description}, setup))
        if computes:
            _COMPUTING.add(path)
        return setup
    return register


def number(integer: bool = False, **bounds) -> Callable[[str], int | float]:
    """An argparse type for a numeric flag: finite and within `bounds` (checked_number's), or argparse's error."""
    def parse(text: str) -> int | float:
        try:
            return checked_number("", text, integer=integer, **bounds)
        except BurnoutError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.integer, parse.bounds = integer, bounds  # what tests/test_input_properties.py holds every flag to
    return parse


counting, natural = number(integer=True, low=1), number(integer=True, low=0)  # 1, 2, ... and 0, 1, ...
seed = number(integer=True, low=0, high=SEED_MAX)
positive, non_negative, fraction = number(low=0, low_open=True), number(low=0), number(low=0, low_open=True, high=1)


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors (a bad flag value, a missing argument) raised as BurnoutError, so that `main` says them in
    one line like every other error, with the command's --help named instead of argparse's usage block."""

    def error(self, message: str):
        raise BurnoutError(f"{message} (see '{self.prog} --help')")


def _overrides(values: list[str], unknown: list[str], accepts_overrides: bool = True) -> list[str]:
    """`key=value` positionals plus `--key value` / `--key=value` flags, as `key=value` strings.

    argparse leaves `key=value` positionals that follow an option (`train CFG --out D train.lr=1`) among
    the unknown arguments, so bare `key=value` items there are overrides too. A command that takes no
    overrides rejects every unknown argument instead of silently ignoring it.
    """
    if unknown and not accepts_overrides:
        raise BurnoutError(f"unexpected argument '{unknown[0]}'; see --help for this command's options")
    result = list(values)
    i = 0
    while i < len(unknown):
        flag = unknown[i]
        if not flag.startswith("-") and "=" in flag:
            result.append(flag)
            i += 1
            continue
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


@command("quickstart", help="offline demo: stdlib corpus → BPE → small LLaMA trained on CPU → samples",
         description="Prepare the embedded corpus, train a small LLaMA-style model for about N "
                     "minutes, then print validation loss, samples and where everything is.",
         computes=True)
def cmd_quickstart(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("--out", default="runs/quickstart", help="folder for data, run and checkpoints")
    p.add_argument("--minutes", type=positive, default=3.0,
                   help="time budget: most of it trains, the rest validates and samples (default 3)")
    _tracker_option(p)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. train.batch_size=8")

    def run(args, overrides):
        from burnout.quickstart import quickstart

        quickstart(Path(args.out), minutes=args.minutes, overrides=_with_tracker(overrides, args.tracker))
    return run


@command("speedrun", help="the whole journey in one command: plan, data, pretrain, SFT, RL, eval, export, card",
         description="Plan the budget (--minutes N of this machine, or --dollars X on --gpu G) over the stages and "
                     "write DIR/plan.json before anything is spent; prepare the data (the offline corpus, or --data "
                     "TEXT|RECIPE) and audit it; pretrain the planner's compute-optimal model; SFT on --chat-data; "
                     "RL on --rl-data when the budget allows; evaluate; export a Hugging Face folder and a GGUF file; "
                     "write the report card DIR/report.md and .html. Each stage is a run folder in DIR; killed, the "
                     "same command continues.",
         computes=True)
def cmd_speedrun(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("--out", required=True, metavar="DIR", help="the speedrun's folder (new, or this speedrun's own)")
    p.add_argument("--minutes", type=positive, help="the budget in minutes of this machine")
    p.add_argument("--dollars", type=positive, help="the budget in dollars of --gpu's time")
    p.add_argument("--gpu", help="with --dollars: a burnout/configs/hardware.yaml entry, e.g. h100")
    p.add_argument("--data", metavar="TEXT_OR_MIX", help="your text or a data mix instead of the offline corpus")
    p.add_argument("--chat-data", metavar="FILE", help="conversations for SFT (without: no chat model)")
    p.add_argument("--rl-data", metavar="FILE", help="checkable questions and answers for RL (GSM8K's layout)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="data.* and tokenizer.* settings of the data")

    def run(args, overrides):
        from burnout.speedrun import speedrun

        speedrun(args.out, minutes=args.minutes, dollars=args.dollars, gpu=args.gpu, data=args.data,
                 chat_data=args.chat_data, rl_data=args.rl_data, overrides=overrides)
    return run


group("model", help="inspect model presets: parameters, FLOPs, memory", description="Inspect model presets.")


@command("model", "info", help="parameters, FLOPs per token and memory of a preset",
         description="Parameters, FLOPs per token and the memory to train a preset: fp32 weights, "
                     "gradients and AdamW state, and one micro-batch's activations measured by tracing "
                     "the model on fake tensors (nothing is allocated). Extra KEY=VALUE arguments change "
                     "model fields; `burnout plan` gives a GPU's verdict.")
def cmd_model_info(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("preset")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--batch-size", type=counting, default=1)
    p.add_argument("--seq-len", type=counting, default=None, help="default: the model's context length")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")

    def run(args, overrides):
        from burnout.config import apply_override, load_model_preset

        raw: dict = {}
        for item in overrides:
            apply_override(raw, item.removeprefix("model."))
        cfg = load_model_preset(args.preset, raw)
        from burnout.models.size import check_sequence

        check_sequence(cfg, args.batch_size, args.seq_len, "--batch-size", "--seq-len")
        from burnout.models.info import format_model_info, model_info  # imports torch: after the cheap checks

        info = model_info(cfg, batch_size=args.batch_size, seq_len=args.seq_len, precision=args.precision,
                          measure_memory=True)
        print(json.dumps(info, indent=2) if args.json else format_model_info(args.preset, info))
    return run


@command("model", "list", help="every preset with its family and size", description="List presets.")
def cmd_model_list(p: argparse.ArgumentParser) -> Handler:
    def run(args, overrides):
        from burnout.config import load_model_preset, model_preset_names
        from burnout.models.info import model_info

        for name in model_preset_names():
            info = model_info(load_model_preset(name))
            print(f"{name:<18} {info['family']:<6} {info['params_total']:>15,} params")
    return run


group("data", help="prepare token shards from your text or a data mix; inspect them",
      description="Data stage commands.")


@command("data", "prepare", help="your text or a data mix's sources → tokenizer → token shards",
         description="Prepare token shards + manifest.json + tokenizer.json + meta.json in --out, from your "
                     "own text (a .txt/.jsonl/.parquet file, a folder of them or a quoted glob: one source, "
                     "cleaned lenient, 5% to val, --tokenizer's tokenizer) or from a data mix, whose sources "
                     "are mixed by token share (built-in mixes in burnout/configs/data/: default, "
                     "shakespeare, gpuburnout-1b; a run config's data and tokenizer sections work too). "
                     "A YAML file (.yaml/.yml, or a file opening with data:, tokenizer:, model: or train:) is "
                     "a data mix; any other file is text. An interrupted prepare resumes where it stopped.")
def cmd_data_prepare(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("source", metavar="TEXT_OR_MIX",
                   help="my.txt, folder/, '*.jsonl', file.parquet; or a data mix name or YAML path (or a run config)")
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace a finished data folder at --out")
    p.add_argument("--workers", type=counting, default=None,
                   help="encoding threads (default: one per core; 1: one thread)")
    p.add_argument("--tokenizer", metavar="SPEC",
                   help="your text's tokenizer: bpe (default, vocabulary sized to the corpus), bpe:8192, char, "
                        "gpt2 (GPT-2's files from shared/data/gpt2_tokenizer) or gpt2:FOLDER; or, for a data mix too, "
                        "an existing tokenizer used as it is: a tokenizer.json or a folder holding one (a data "
                        "folder, RUN/checkpoints/step_N: the tokenizer of a run you will continue with --init-from)")
    p.add_argument("--text-field", help="the field of .jsonl/.parquet records holding the text (default: text)")
    p.add_argument("--split-by", choices=["file", "paragraph", "line"],
                   help="your text's documents (default: split at lines holding only <|endoftext|> when there are "
                        "some, else paragraph when blank lines separate them, else line)")
    p.add_argument("--separator", metavar="STRING",
                   help="your text's documents end at each STRING (on one line), e.g. '<|endoftext|>' or '* * *'")
    p.add_argument("--drop", action="append", default=[], metavar="REGEX",
                   help="drop documents matching REGEX (repeatable); counted per pattern and source in meta.json")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. data.max_tokens=1000000")

    def run(args, overrides):
        stray = next((item for item in overrides if "=" not in item and Path(item).exists()), None)
        if stray is not None:
            raise BurnoutError(f"several inputs given ('{args.source}', '{stray}', ...); the shell expanded a glob: "
                               "quote it ('*.jsonl') or give the folder")
        from burnout.data.mix import given_tokenizer, load_prepare_sections

        given = given_tokenizer(args.tokenizer)
        data_cfg, tok_cfg = load_prepare_sections(args.source, overrides, tokenizer=None if given else args.tokenizer,
                                                  text_field=args.text_field, split_by=args.split_by,
                                                  separator=args.separator, drop=args.drop)
        from burnout.data.prepare import prepare_data

        meta = prepare_data(data_cfg, tok_cfg, Path(args.out), tokenizer_path=given, progress=True,
                            overwrite=args.overwrite, workers=args.workers)
        splits = meta["splits"]
        dropped = meta.get("cleaning", {}).get("junk", {}).get("dropped_documents", 0)
        print(f"prepared {splits['train']['tokens']:,} train and {splits['val']['tokens']:,} val tokens "
              f"(vocab {meta['vocab_size']:,}) in {args.out}"
              + (f"; dropped {plural(dropped, 'document')}" * bool(args.drop)))
        from burnout.base.text import needs_package, next_steps

        data = shlex.quote(args.out)
        train = f"burnout train --data {data} --model llama-tiny --out {shlex.quote(f'runs/{Path(args.out).name}')}"
        print("\n".join(next_steps([("train", f"{train}   (other models: burnout model list)"),
                                     ("inspect", f"burnout data inspect {data}"),
                                     ("audit", needs_package(f"burnout data audit {data}", "datasketch", "data"))])))
    return run


@command("data", "inspect", help="stats of a prepared folder and a decoded sample",
         description="Print the token counts, shards, source shares and cleaning report of "
                     "a prepared folder, and decode a sample of it.")
def cmd_data_inspect(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("data_dir")
    p.add_argument("--sample-tokens", type=natural, default=200)
    p.add_argument("--split", choices=["train", "val"], default="train")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--verify", action="store_true", help="re-hash every shard against the manifest")

    def run(args, overrides):
        from burnout.data.inspect import inspect_data

        inspect_data(Path(args.data_dir), sample_tokens=args.sample_tokens, split=args.split, seed=args.seed,
                     verify=args.verify)
    return run


@command("data", "trace", help="where a string (or a run's samples) occurs in prepared data, per source",
         description="Find every occurrence of TEXT in DATA's token shards (as given and with a leading "
                     "space): counts per variant, split and source, and each hit's document, source, shard, "
                     "offset and a decoded snippet. --from-samples RUN instead traces the rare word n-grams "
                     "of a run's generated samples and finds each sample's longest span copied verbatim "
                     "from the train split (written to RUN/trace.json): burnout data trace --from-samples RUN DATA.")
def cmd_data_trace(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("text", nargs="?", metavar="TEXT", help="the string to look for")
    p.add_argument("data_dir", nargs="?", metavar="DATA", help="a prepared data folder")
    p.add_argument("--from-samples", metavar="RUN", help="trace a run's generated samples instead of TEXT")
    p.add_argument("--limit", type=natural, default=20, help="hits (or table rows) to list (default 20)")
    p.add_argument("--context", type=natural, default=16, help="tokens of the document shown on each side of a hit")
    p.add_argument("--split", choices=["train", "val", "all"], default="all", help="splits to search (default all)")
    p.add_argument("--n", type=counting, default=3, help="--from-samples: words per n-gram (default 3)")
    p.add_argument("--rare", type=counting, default=5, help="--from-samples: list n-grams seen at most this often")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    def run(args, overrides):
        import json

        from burnout.forensics import trace

        if args.from_samples:
            if args.data_dir is None:  # argparse fills positionals from the left: `--from-samples RUN DATA` sets TEXT
                args.text, args.data_dir = None, args.text
            if args.text is not None:
                raise BurnoutError("--from-samples RUN takes DATA only, not TEXT: "
                                   "burnout data trace --from-samples RUN DATA")
            if args.data_dir is None:
                raise BurnoutError("--from-samples RUN needs the DATA folder the run trained on")
            result = trace.trace_samples(Path(args.from_samples), Path(args.data_dir), n=args.n, rare=args.rare,
                                         split=args.split)
            lines = trace.format_samples(result, args.limit) + [f"wrote {Path(args.from_samples) / trace.TRACE_FILE}"]
        else:
            if args.text is None or args.data_dir is None:
                given = f"; '{args.text}' alone is one of them" if args.text is not None else ""
                raise BurnoutError(f"data trace needs TEXT and DATA (or --from-samples RUN DATA){given}: burnout "
                                   "data trace 'the string' DATA, DATA a folder burnout data prepare wrote")
            result = trace.trace_text(Path(args.data_dir), args.text, limit=args.limit, context=args.context,
                                      split=args.split)
            lines = trace.format_trace(result)
        print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else "\n".join(lines))
    return run


@command("data", "audit", help="find suspicious strings, repetition, duplicates and junk in a corpus",
         description="Audit a data mix's sources (or a run config's, or one .jsonl/.txt/.parquet file), a prepared "
                     "data folder, or conversations (--sft) without being told what to look for: strings rare "
                     "in a source but dense where they occur (template placeholders, code and log artifacts) "
                     "ranked by a score, lines and paragraphs repeated across documents, exact and near-duplicate "
                     "documents (MinHash LSH), data.junk_patterns hits and length/character outliers, per source. "
                     "Prints a summary and writes audit.json and audit.html to --out.")
def cmd_data_audit(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("target", metavar="SOURCE_OR_DATA",
                   help="data mix name or YAML, run config, data file, prepared data folder, or (--sft) conversations")
    p.add_argument("--out", help="folder for audit.json and audit.html (default: DATA/audit, else ./audit)")
    p.add_argument("--overwrite", action="store_true", help="replace an audit of another target at --out")
    p.add_argument("--sft", action="store_true", help="SOURCE_OR_DATA is conversations: audit each role's messages")
    p.add_argument("--layout", default="auto", help="conversation layout with --sft (default: auto)")
    p.add_argument("--split", choices=["train", "val"], default="train", help="split of a prepared folder")
    p.add_argument("--chars-per-source", type=natural, default=None, metavar="N",
                   help="characters read per source (default: its share of data.max_chars; 0: all of it)")
    p.add_argument("--junk", action="append", default=[], metavar="REGEX",
                   help="count documents matching REGEX too (repeatable), besides data.junk_patterns")
    p.add_argument("--threshold", type=fraction, default=0.8, help="near-duplicate Jaccard threshold (default 0.8)")
    p.add_argument("--top", type=counting, default=25, help="rows per table in the report (default 25)")
    p.add_argument("--capacity", type=counting, default=300_000,
                   help="keys per counting table per source: bounds memory (default 300,000)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="data mix overrides, e.g. data.max_chars=5000000")

    def run(args, overrides):
        from burnout.forensics.audit import audit_out, audit_target, write_audit
        from burnout.forensics.audit_settings import AuditSettings
        from burnout.forensics.audit_summary import summary

        out = audit_out(args.target, args.out, args.sft, args.overwrite)  # refused before the audit runs
        settings = AuditSettings(near_dup_threshold=args.threshold, top=args.top, capacity=args.capacity)
        report = audit_target(args.target, sft=args.sft, layout=args.layout, split=args.split,
                              chars_per_source=args.chars_per_source, overrides=overrides, junk=args.junk,
                              settings=settings, progress=lambda line: print(line, file=sys.stderr))
        written = write_audit(report, out, args.overwrite)
        print(summary(report, written))
    return run


group("tokenizer", help="train a tokenizer from a data mix; encode and decode with one",
      description="Tokenizer commands.")


@command("tokenizer", "train", help="train a data mix's tokenizer on its sample and save tokenizer.json",
         description="Train the data mix's tokenizer (BPE or char) on its cleaned, weighted "
                     "sample, or build GPT-2's from its files, and save it.")
def cmd_tokenizer_train(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("mix", metavar="MIX", help="data mix name or YAML path (or a run config)")
    p.add_argument("--out", required=True, help="tokenizer.json path to write")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. tokenizer.vocab_size=8192")

    def run(args, overrides):
        from burnout.data.mix import load_data_sections

        data_cfg, tok_cfg = load_data_sections(args.mix, overrides)
        out = Path(args.out)
        if out.exists() and not args.overwrite:
            raise BurnoutError(f"{out} exists; choose another --out or pass --overwrite")
        from burnout.base.files import write_atomic
        from burnout.data.prepare import train_mix_tokenizer

        tok = train_mix_tokenizer(data_cfg, tok_cfg)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, tok.to_str(pretty=True))  # pretty: the same bytes tok.save() writes
        print(f"wrote a {tok_cfg.kind} tokenizer with {tok.get_vocab_size():,} tokens to {out}")
    return run


@command("tokenizer", "encode", help="text → token ids and tokens (JSON)", description="Encode text.")
def cmd_tokenizer_encode(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("tokenizer", help="tokenizer.json, or a folder holding one (data folder, checkpoint)")
    p.add_argument("text")

    def run(args, overrides):
        from burnout.data.tokenizer import encode_text, load_tokenizer

        tok = load_tokenizer(args.tokenizer)
        ids = encode_text(tok, args.text, "TEXT")
        print(json.dumps({"ids": ids, "tokens": [tok.id_to_token(i) for i in ids]}, ensure_ascii=False))
    return run


@command("tokenizer", "decode", help="token ids → text", description="Decode token ids.")
def cmd_tokenizer_decode(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("tokenizer", help="tokenizer.json, or a folder holding one (data folder, checkpoint)")
    p.add_argument("ids", help='ids separated by spaces or commas, e.g. "15496 995"')

    def run(args, overrides):
        try:
            ids = [int(i) for i in args.ids.replace(",", " ").split()]
        except ValueError as exc:
            raise BurnoutError(f"token ids must be whole numbers separated by spaces or commas ({exc})") from None
        from burnout.data.tokenizer import load_tokenizer

        tok = load_tokenizer(args.tokenizer)
        vocab = tok.get_vocab_size()
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise BurnoutError(f"token id {bad[0]} is outside this tokenizer's vocabulary (0..{vocab - 1})")
        print(tok.decode(ids, skip_special_tokens=False))
    return run


@command("train", help="train a model from a YAML config, or a preset on a data folder (or resume a run)",
         description="Train from a run config (data from --data, data.prepared_dir, or prepared into "
                     "RUN/data from the config's sources), or with no config: --data DIR --model PRESET "
                     "trains a preset of burnout/configs/models/ on a prepared folder, its vocabulary "
                     "the data's and the quickstart's train settings, changed by KEY=VALUE. --init-from RUN "
                     "starts from another run's weights (continued pretraining, docs/USAGE.md).",
         computes=True)
def cmd_train(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("config", nargs="?", help="run config YAML or a built-in name (e.g. quickstart)")
    p.add_argument("--out", help="run folder to create")
    p.add_argument("--resume", metavar="RUN", help="continue the run in this folder from its latest checkpoint")
    p.add_argument("--data", help="prepared data folder (from `burnout data prepare`)")
    p.add_argument("--model", metavar="PRESET",
                   help="with --data and no CONFIG: the preset to train (e.g. llama-tiny; see burnout model list)")
    p.add_argument("--auto-batch", action="store_true",
                   help="use the largest micro-batch that fits in memory, keeping tokens per step via grad_accum")
    p.add_argument("--resume-if-exists", action="store_true",
                   help="resume --out when it already holds a run, else start it: one command for every boot "
                        "of a spot machine")
    _budget_options(p)
    _tracker_option(p)
    p.add_argument("--init-from", metavar="RUN",
                   help="continued pretraining: start from this run's newest good checkpoint (or RUN/checkpoints/"
                        "step_N) with its model and tokenizer, a fresh optimizer (train.init_optimizer=carry keeps "
                        "its moments) and this run's schedule and data; without CONFIG, the parent's config")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings to change, e.g. train.max_steps=800 train.lr=3e-4 (a setting of train's sections "
                        "by its name alone: train.lr is train.optim.lr; docs/USAGE.md lists them)")

    def run(args, overrides):
        if (args.config and "=" in args.config and not Path(args.config).exists()
                and (args.resume or args.model or args.init_from)):
            # `train --resume RUN train.max_steps=800`: argparse hands the first override to CONFIG.
            overrides, args.config = [args.config, *overrides], None
        from burnout.runs import train

        return _stopped(train(args.config, args.out, args.resume, args.data, args.model, args.auto_batch,
                              args.resume_if_exists, _with_tracker(overrides, args.tracker), minutes=args.minutes,
                              init_from=args.init_from, dollars=args.dollars))
    return run


def _stopped(result) -> int:
    """Print how the run stopped and what to do next with it (rank 0 speaks for a torchrun), and give its exit code:
    a signal-stopped run exits as an interrupted process would, so scripts and schedulers can tell."""
    if os.environ.get("RANK", "0") == "0":
        from burnout.base.files import RUN_CONFIG_FILE
        from burnout.base.text import next_steps
        from burnout.config import load_run_config
        from burnout.core.chat_template import is_chat_model
        from burnout.runs import trained_run_steps

        cfg = load_run_config(result.run_dir / RUN_CONFIG_FILE)
        steps = trained_run_steps(result.run_dir, is_chat_model(cfg), stop_reason=result.stop_reason)
        print("\n".join([result.summary(), *next_steps(steps)]))
    return 130 if result.stop_reason == "signal" else 0


def _budget_options(p: argparse.ArgumentParser) -> None:
    """--minutes and --dollars: the budgets every training command plans its steps to."""
    p.add_argument("--minutes", type=positive, metavar="N",
                   help="time budget: plan the steps that fit in N minutes, the LR schedule ending there")
    p.add_argument("--dollars", type=positive, metavar="D",
                   help="dollar budget: the minutes D dollars buy at the GPU's price per hour, planned as --minutes")


def _tracker_option(p: argparse.ArgumentParser) -> None:
    """--tracker: the dashboard a training command also streams its records to (train.tracker)."""
    from burnout.config import TRACKERS

    p.add_argument("--tracker", choices=[*TRACKERS, "none"], metavar="NAME",
                   help=f"also stream the records of metrics.jsonl to {', '.join(TRACKERS)} (W&B offline, trackio "
                        "local) in RUN/tracker/; none: metrics.jsonl alone (train.tracker)")


def _with_tracker(overrides: list[str], tracker: str | None) -> list[str]:
    """--tracker NAME as the override it stands for, last so that it wins."""
    if tracker is None:
        return overrides
    return [*overrides, f"train.tracker={'null' if tracker == 'none' else tracker}"]


@dataclasses.dataclass(frozen=True)
class FineTuneCommand:
    """What tells `burnout sft`, `dpo` and `rl` apart: a row of FINE_TUNE_COMMANDS; fine_tune_commands makes the
    rest alike."""
    name: str  # the command, its run config section and its function in burnout.finetune.commands
    help: str
    description: str
    base: tuple[str, str]  # BASE's metavar and help
    data: tuple[str, str]  # --data's metavar and help
    option: tuple[str, dict]  # the command's own option and its argparse keywords, handed to the function after lora
    option_first: bool = False  # listed before --config and --lora, else after them
    overrides_help: str | None = None


FINE_TUNE_COMMANDS = (
    FineTuneCommand(
        "sft", help="supervised fine-tuning of a checkpoint on conversations (full or --lora)",
        description="Fine-tune BASE (a run folder or checkpoint) on SOURCE's conversations: the chat tokens "
                    "added to its tokenizer (model grown), the data prepared into RUN/data, loss on the "
                    "assistant turns, then the usual training loop. Resume with `burnout train --resume RUN`.",
        base=("BASE_RUN_OR_CKPT", "the model to fine-tune"),
        data=("SOURCE", "conversations: a .json/.jsonl/.parquet file, folder or glob, or hf:NAME"),
        option=("--layout", {"help": "messages, sharegpt, alpaca, qa, oasst (default: auto)"})),
    FineTuneCommand(
        "dpo", help="preference tuning (DPO) of a chat checkpoint on chosen/rejected pairs (full or --lora)",
        description="Tune SFT_RUN_OR_CKPT (a chat model, e.g. from `burnout sft`) on PAIRS (prompt/chosen/"
                    "rejected) with DPO: the pairs prepared into RUN/data, the starting model the reference "
                    "(with --lora the same model with its adapters off), rewards, margin and accuracy in "
                    "metrics.jsonl. Resume with `burnout train --resume RUN`.",
        base=("SFT_RUN_OR_CKPT", "the chat model to tune (policy and reference)"),
        data=("PAIRS", "preference pairs: a .json/.jsonl/.parquet file, folder or glob, or hf:NAME"),
        option=("--beta", {"type": positive, "help": "DPO's β (default 0.1)"})),
    FineTuneCommand(
        "rl", help="reinforcement learning (GRPO) of a chat checkpoint on questions with checkable answers",
        description="Tune CHAT_RUN_OR_CKPT (a chat model, e.g. from `burnout sft`) on TASKS (question/answer "
                    "records; GSM8K's layout as it is) with GRPO: per question a group of answers sampled "
                    "(rl.group_size), scored by the reward, the policy moved toward those above their group's "
                    "mean. Mean reward, the share of groups with signal, KL and answer length in metrics.jsonl; "
                    "held-out pass@1 and pass@k as val_*. Resume with `burnout train --resume RUN`.",
        base=("CHAT_RUN_OR_CKPT", "the chat model to tune"),
        data=("TASKS", "questions and answers: a .json/.jsonl/.parquet file, folder or glob, or hf:NAME"),
        option=("--reward", {"metavar": "REWARD",
                             "help": "gsm8k (the final '#### n' matches; default), exact, regex:PATTERN, or "
                                     "module:function (your function(prompt, answer, reference) -> float)"}),
        option_first=True,
        overrides_help="e.g. rl.group_size=8 rl.max_new_tokens=128 rl.temperature=1.0 rl.kl_coef=0 train.lr=…"),
)


def fine_tune_commands(table: tuple[FineTuneCommand, ...] = FINE_TUNE_COMMANDS) -> None:
    """Register each fine-tuning command of `table`: `burnout NAME BASE --data DATA --out RUN [--config] [--lora]
    [its option] [--minutes] [--dollars] [--tracker] [KEY=VALUE ...]`, which calls burnout.finetune.commands.NAME
    with them."""
    for spec in table:
        command(spec.name, help=spec.help, description=spec.description, computes=True)(
            functools.partial(_fine_tune_setup, spec))


def _fine_tune_setup(spec: FineTuneCommand, p: argparse.ArgumentParser) -> Handler:
    p.add_argument("base", metavar=spec.base[0], help=spec.base[1])
    p.add_argument("--data", required=True, metavar=spec.data[0], help=spec.data[1])
    p.add_argument("--out", required=True, metavar="RUN", help="run folder to create")
    shared = [("--config", {"help": f"a run config YAML whose train (and {spec.name}) sections apply"}),
              ("--lora", {"action": "store_true",
                          "help": f"train LoRA adapters ({spec.name}.lora.r=… etc. to shape them)"})]
    for flag, keywords in [spec.option, *shared] if spec.option_first else [*shared, spec.option]:
        p.add_argument(flag, **keywords)
    _budget_options(p)
    _tracker_option(p)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=spec.overrides_help)
    own = spec.option[0].removeprefix("--")

    def run(args, overrides):
        from burnout.finetune import commands

        function = getattr(commands, spec.name)
        return _stopped(function(args.base, args.data, args.out, args.config, args.lora, getattr(args, own),
                                 _with_tracker(overrides, args.tracker), minutes=args.minutes, dollars=args.dollars))
    return run


fine_tune_commands()


group("lora", help="LoRA adapters of a fine-tuned run",
      description="Work with the adapters of a run trained with `burnout sft --lora`.")


@command("lora", "merge", help="fold a LoRA run's adapters into its base weights",
         description="Write RUN_OR_CKPT's weights with W + (alpha/r)·B·A folded in as a plain checkpoint "
                     "OUT/checkpoints/step_N that generate, chat, eval and export load.")
def cmd_lora_merge(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("source", metavar="RUN_OR_CKPT")
    p.add_argument("--out", required=True, metavar="RUN_MERGED", help="new run folder")

    def run(args, overrides):
        from burnout.finetune.adapters import merge_run

        print(f"merged the adapters: {merge_run(args.source, args.out)}")
    return run


@command("bench", help="training speed of a config: tokens/s, step split, MFU, memory; --ablate",
         description="Time training steps of a run config as `burnout train` runs them: tokens/s, "
                     "the step split into data / forward / backward / optimizer, MFU against a "
                     "matmul peak measured now on this device, and peak memory. --ablate runs "
                     "the optimization ladder (mmap + Python batching, fp32, eager, explicit "
                     "attention → preload → vectorized batching → compile → bf16 → SDPA).",
         computes=True)
def cmd_bench(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("config", help="run config YAML or a built-in name (e.g. shakespeare-fast)")
    p.add_argument("--steps", type=counting, default=10, help="timed steps (median reported; default 10)")
    p.add_argument("--warmup", type=natural, default=2, help="untimed steps first (default 2)")
    p.add_argument("--ablate", action="store_true", help="run the optimization ladder, one rung per change")
    p.add_argument("--skip", action="append", default=[], metavar="RUNG",
                   help="with --ablate: leave a rung out (preload, vectorize, compile, bf16, sdpa); repeatable")
    p.add_argument("--data", help="prepared data folder (default: data.prepared_dir, else prepared into "
                                  "runs/bench-data/ once)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")

    def run(args, overrides):
        from burnout.config import load_run_config

        cfg = load_run_config(args.config, overrides)
        from burnout.bench import ablate, bench, bench_data_dir, format_ablation, format_bench
        from burnout.core.device import resolve_device
        from burnout.train.plan import check_memory_floor

        check_memory_floor(cfg, resolve_device(cfg.train.device))  # before its data are prepared
        data_dir = bench_data_dir(cfg, args.data, on_event=(lambda line: None) if args.json else print)
        if args.ablate:
            result = ablate(cfg, data_dir, steps=args.steps, warmup=args.warmup, skip=tuple(args.skip),
                            on_rung=None if args.json else (lambda r: print(
                                f"  {r['rung']:<10} {r['tokens_per_s']:>10,.0f} tokens/s ({r['speedup_prev']:.2f}x)",
                                flush=True)))
            print(json.dumps(result, indent=2) if args.json else format_ablation(result))
        else:
            result = bench(cfg, data_dir, steps=args.steps, warmup=args.warmup)
            print(json.dumps(result, indent=2) if args.json else format_bench(result))
    return run


@command("plan", help="predicted hours, dollars and peak memory on a given GPU, or what a budget buys",
         description="With CONFIG: predict time and cost per phase from FLOPs per token, tokens per phase, the "
                     "GPU's peak and price (burnout/configs/hardware.yaml) and its MFU (measured, or assumed); and the "
                     "peak memory per GPU at the configured micro-batch (eager and compiled, with and "
                     "without activation checkpointing, DDP or FSDP over --gpus), whether it fits the "
                     "GPU's memory, the largest micro-batch that does and what would make it fit. "
                     "With a budget instead (--dollars X or --hours H on --gpu G, or --minutes N of this machine): "
                     "the compute-optimal shape and tokens, the predicted val loss with its interval (from --ladder, "
                     "else the published fits), hours, dollars, memory and the data it reads; --write-config FILE "
                     "writes the run config, with its prediction, for `burnout train FILE`.",
         computes=True)
def cmd_plan(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("config", nargs="?", metavar="CONFIG_PRESET_OR_RUN",
                   help="a run config (YAML or a built-in name, e.g. gpuburnout-1b), a model preset (e.g. llama-small, "
                        "with the train settings of `burnout train --model`) or a run folder")
    p.add_argument("--gpu", help="a burnout/configs/hardware.yaml entry or cpu (measured peak); default a100-80gb")
    p.add_argument("--mfu", type=fraction, default=None,
                   help="model FLOPs utilization (default: the one hardware.yaml records as measured on the GPU, "
                        "else an assumed 0.4)")
    p.add_argument("--price", type=non_negative, default=None, help="dollars per device-hour (default: the table's)")
    p.add_argument("--gpus", "--devices", type=counting, default=1,
                   help="devices training together (default 1); train.distributed picks DDP or FSDP")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None,
                   help="default: the config's, or bf16 on a GPU")
    p.add_argument("--dollars", type=positive, help="a budget in dollars on --gpu: what it buys")
    p.add_argument("--hours", type=positive, help="a budget in hours on --gpu: what it buys")
    p.add_argument("--minutes", type=positive, help="a budget in minutes of this machine (a step measured on the data)")
    p.add_argument("--ladder", metavar="LADDER", help="predict from this `burnout ladder` fit (default: the published "
                                                      "fits, not your data's); with CONFIG: its model's loss, and "
                                                      "what twice the tokens or the compute-optimal shape would buy")
    p.add_argument("--data", metavar="DIR", help="the prepared data the run reads (default: the ladder's)")
    p.add_argument("--write-config", metavar="FILE", help="write the planned run config, with its prediction, here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")

    def run(args, overrides):
        budgets = [f"--{b}" for b in ("dollars", "hours", "minutes") if getattr(args, b) is not None]
        if args.config is None:
            return _plan_budget(args, budgets, overrides)
        if budgets or args.data or args.write_config:
            raise BurnoutError(f"plan {args.config}: {(budgets + ['--data or --write-config'])[0]} plans a budget, not "
                               "a config; give CONFIG or a budget")
        from burnout.train.plan import format_plan, plan_config, plan_run

        cfg = plan_config(args.config, overrides)
        plan = plan_run(cfg, args.gpu or "a100-80gb", mfu=args.mfu, price_per_hour=args.price, devices=args.gpus,
                        precision=args.precision)
        lines = []
        if args.ladder:  # what the named model is predicted to reach, and what more would buy
            from burnout.train.optimal import named_model_lines, prediction_source

            lines = named_model_lines(cfg, plan, prediction_source(args.ladder, None))
        print(json.dumps({**plan, "ladder": lines} if lines else plan, indent=2) if args.json else
              "\n".join([format_plan(plan), *([""] + lines if lines else [])]))
    return run


def _plan_budget(args: argparse.Namespace, budgets: list[str], overrides: list[str]) -> None:
    """`burnout plan` with a budget: checked in one line before anything is measured, then planned and printed."""
    if len(budgets) != 1:
        raise BurnoutError("plan needs a CONFIG, or one budget: --dollars X or --hours H (on --gpu G), or --minutes N "
                           f"(this machine){'; got ' + ' and '.join(budgets) if budgets else ''}")
    if overrides or args.precision:
        raise BurnoutError(f"plan {budgets[0]}: {'--precision' if args.precision else overrides[0]} applies to a "
                           "CONFIG's plan; a budget's plan chooses the run's settings")
    if args.minutes is not None and (args.gpu or args.gpus != 1 or args.price is not None):
        raise BurnoutError("--minutes plans for this machine; drop --gpu, --devices and --price (or give --dollars "
                           "or --hours for a GPU)")
    from burnout.train.optimal import (
        budget_plan,
        check_config_path,
        format_budget_plan,
        prediction_source,
        write_config,
    )

    source = prediction_source(args.ladder, args.data)
    if args.write_config:
        check_config_path(args.write_config, source)
    say = (lambda line: None) if args.json else print
    plan = budget_plan(source, args.gpu or "a100-80gb", hours=args.hours, dollars=args.dollars,
                       minutes=args.minutes, devices=args.gpus, mfu=args.mfu, price=args.price, say=say)
    if args.json:
        print(json.dumps({"budget": plan["budget"], "flops": plan["flops"], "preset": plan["chosen"]["preset"],
                          "model": dataclasses.asdict(plan["cfg"].model), "params": plan["chosen"]["params"],
                          "tokens": plan["tokens"], "steps": plan["steps"], "prediction": plan["prediction"],
                          "plan": plan["planned"]}, indent=2))
    else:
        print(format_budget_plan(plan))
    if args.write_config:
        write_config(plan, args.write_config)
        if not args.json:
            print(f"wrote {args.write_config}: burnout train {shlex.quote(args.write_config)} --out RUN, then "
                  "burnout report RUN sets its final val loss beside the prediction")


@command("ladder", help="small models on your data and the scaling law fitted to them, for `burnout plan --ladder`",
         description="Train a ladder of small LLaMAs of one family (the depth dial) on a prepared folder, sizes and "
                     "token counts chosen for the budget (--minutes of this machine, or --dollars at --gpu's price), "
                     "each rung an ordinary run folder under LADDER/rungs; fit L(N, D) = E + A/N^alpha + B/D^beta "
                     "with bootstrap intervals and the fit's own error on its largest rungs; write LADDER/ladder.json "
                     "and LADDER/ladder.png. Run the same command again to continue a stopped ladder.",
         computes=True)
def cmd_ladder(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("data", metavar="DATA", help="a prepared data folder (`burnout data prepare`)")
    p.add_argument("--out", required=True, metavar="LADDER", help="the ladder's folder (new, or this ladder's own)")
    p.add_argument("--minutes", type=positive, help="the ladder's budget in minutes of this machine")
    p.add_argument("--dollars", type=positive, help="the ladder's budget in dollars, at --gpu's price per hour")
    p.add_argument("--gpu", help="with --dollars: the hardware.yaml entry whose price the dollars buy time at")
    p.add_argument("--price", type=positive, help="with --dollars: dollars per hour instead of the table's")
    p.add_argument("--seq-len", type=counting, default=256,
                   help="tokens per sequence of every rung, 8 sequences a step (default 256, the quickstart's); "
                        "shorter gives a small budget more steps")
    p.add_argument("--schedule", choices=("linear", "wsd"), default="linear",
                   help="linear (default): each rung a separate run decaying to its own end, as a planned run "
                        "trains; wsd: one warmup-stable run per size, each smaller token count a short decay branched "
                        "off it (two thirds of the compute)")

    def run(args, overrides):
        from burnout.train.ladder import PLOT_FILE, format_ladder, ladder_budget, run_ladder

        budget = ladder_budget(args.minutes, args.dollars, args.gpu, args.price, args.seq_len, args.schedule)
        ladder = run_ladder(args.data, args.out, budget)
        print(format_ladder(ladder))
        print(f"wrote {Path(args.out) / 'ladder.json'} and {Path(args.out) / PLOT_FILE}; next: burnout plan "
              f"--dollars X --gpu G --ladder {shlex.quote(args.out)} (or --minutes N)")
    return run


def sampling_flags(p: argparse.ArgumentParser, temperature: float, top_k: int, max_new_tokens: int) -> None:
    """Sampling flags shared by generate, chat and compare (read back by `_sampling`)."""
    p.add_argument("--max-new-tokens", type=counting, default=max_new_tokens)
    p.add_argument("--temperature", type=non_negative, default=temperature, help="0 means greedy")
    p.add_argument("--top-k", type=natural, default=top_k, help="0 turns top-k off")
    p.add_argument("--top-p", type=fraction, default=1.0, help="nucleus sampling; 1 turns it off")
    p.add_argument("--repetition-penalty", type=positive, default=1.0, help="1 means none (HF/CTRL style)")
    p.add_argument("--repetition-window", type=counting, default=64, help="recent tokens the penalty looks at")
    p.add_argument("--seed", type=seed, default=None)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")


def _sampling(args) -> dict:
    """Sampling flags shared by generate, chat and compare; 0 turns top-k off and 1 turns top-p off."""
    return {"temperature": args.temperature, "top_k": args.top_k or None,
            "top_p": args.top_p if args.top_p < 1 else None, "repetition_penalty": args.repetition_penalty,
            "repetition_window": args.repetition_window, "seed": args.seed}


@command("generate", help="continue a prompt (or a file of prompts) with a trained checkpoint",
         description="Sample a continuation from a checkpoint (a run folder means its latest). "
                     "--prompt streams to the terminal; --prompts-file decodes the prompts in "
                     "batches and prints JSON. --chat asks a chat model: each prompt is one user "
                     "message in the chat template, and the answer ends at <|im_end|>.",
         computes=True)
def cmd_generate(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("checkpoint")
    p.add_argument("--prompt")
    p.add_argument("--prompts-file", help="one prompt per line (\\n inside a line means a newline)")
    p.add_argument("--stop", action="append", default=[], help="stop sequence (repeatable); not printed")
    p.add_argument("--chat", action="store_true", help="answer each prompt as a user message (chat template)")
    p.add_argument("--system", help="with --chat: a system prompt before the message")
    sampling_flags(p, temperature=0.8, top_k=50, max_new_tokens=200)

    def run(args, overrides):
        if (args.prompt is None) == (args.prompts_file is None):
            raise BurnoutError("generate needs exactly one of --prompt TEXT or --prompts-file FILE")
        if args.system is not None and not args.chat:
            raise BurnoutError("--system goes with --chat (a system prompt is part of the chat template)")
        if args.chat and args.stop:
            raise BurnoutError("--stop applies to continuations; with --chat the answer ends at <|im_end|>")
        from burnout.core.device import resolve_device
        from burnout.core.model_files import load_model
        from burnout.generate.prompts import read_prompts
        from burnout.generate.sampling import generate_texts, shown, stream_text

        model, tokenizer, ckpt = load_model(args.checkpoint, resolve_device(args.device, "--device"))
        if args.chat:
            return _generate_chat(args, model, tokenizer, ckpt)
        if args.prompt is not None:
            pieces = stream_text(model, tokenizer, args.prompt, args.max_new_tokens, stop=args.stop, where="--prompt",
                                 **_sampling(args))
            sys.stdout.write(args.prompt)
            continued = False
            for piece in pieces:
                sys.stdout.write(piece)
                sys.stdout.flush()
                continued = continued or bool(piece)
            print(flush=True)
            if not continued:  # said on stderr: the text on stdout stays the model's
                print(shown("", args.stop), file=sys.stderr)
            return
        prompts = read_prompts(args.prompts_file)
        texts = generate_texts(model, tokenizer, prompts, args.max_new_tokens, stop=args.stop, **_sampling(args))
        print(json.dumps([{"prompt": p, "text": t} for p, t in zip(prompts, texts)], indent=2, ensure_ascii=False))
        for number, (prompt, text) in enumerate(zip(prompts, texts), start=1):
            if text == prompt:
                print(f"prompt {number}: {shown('', args.stop)}", file=sys.stderr)
    return run


def _generate_chat(args, model, tokenizer, ckpt) -> None:
    """`generate --chat`: the answer to --prompt streamed, or to each line of --prompts-file as JSON."""
    from burnout.core.chat_template import is_chat_model
    from burnout.generate.chat import chat_prompt, chat_replies, stream_reply
    from burnout.generate.prompts import read_prompts

    if not is_chat_model(ckpt.config):
        raise BurnoutError(f"--chat needs a chat model, and {ckpt.path} is a base model (its config has no "
                           "tokenizer.chat_template: it was never fine-tuned on conversations in the <|im_start|> "
                           f"template); make a chat model of it with `burnout sft {args.checkpoint} --data "
                           "CONVERSATIONS --out RUN`, or drop --chat to continue the text")
    head = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:
        messages = [*head, {"role": "user", "content": args.prompt}]
        ids, _ = chat_prompt(tokenizer, messages, model.cfg.context_length, args.max_new_tokens)
        for piece in stream_reply(model, tokenizer, ids, args.max_new_tokens, **_sampling(args)):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        return
    prompts = read_prompts(args.prompts_file)
    answers = chat_replies(model, tokenizer, prompts, args.max_new_tokens, system=args.system, **_sampling(args))
    print(json.dumps([{"prompt": p, "answer": a} for p, a in zip(prompts, answers)], indent=2, ensure_ascii=False))


@command("chat", help="talk to a chat checkpoint, or continue text with a base one, streaming",
         description="A chat checkpoint (from `burnout sft`) holds a conversation in its chat template: "
                     "each line is a message, the answer streams and ends at <|im_end|>, the oldest turns "
                     "are dropped when the context fills; /system TEXT sets the system prompt, /reset "
                     "forgets the conversation. A base checkpoint continues each line typed. /temp, "
                     "/topk, /topp, /rep, /len and /seed change the settings on the fly, /help lists them.",
         computes=True)
def cmd_chat(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("checkpoint")
    p.add_argument("--system", help="a chat checkpoint's system prompt to start with")
    sampling_flags(p, temperature=0.8, top_k=50, max_new_tokens=200)

    def run(args, overrides):
        from burnout.core.chat_template import is_chat_model
        from burnout.core.device import resolve_device
        from burnout.core.model_files import load_model
        from burnout.generate.chat import chat, chat_loop

        model, tokenizer, ckpt = load_model(args.checkpoint, resolve_device(args.device, "--device"))
        settings = {"max_new_tokens": args.max_new_tokens, **_sampling(args)}
        if is_chat_model(ckpt.config):
            chat_loop(model, tokenizer, settings, system=args.system)
        elif args.system is not None:
            raise BurnoutError(f"--system needs a chat checkpoint; {ckpt.path} is a base model (its config has no "
                               "tokenizer.chat_template), which continues text")
        else:
            chat(model, tokenizer, settings)
    return run


@command("eval", help="validation loss/perplexity/bits-per-byte, zero-shot benchmarks, ICL suites and CORE",
         description="Score a checkpoint (a run folder means its latest; --all-checkpoints every "
                     "one) on val, hellaswag, arc_easy and lambada, scored as lm-evaluation-harness "
                     "scores them; on an llm-foundry icl_tasks list (--tasks icl:FILE.yaml, e.g. DCLM's, "
                     "with its CORE score); or on task files of your own (--task). Results: "
                     "RUN/eval/step_N.json and RUN/eval/summary.md.",
         computes=True)
def cmd_eval(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("target", metavar="RUN_OR_CKPT")
    p.add_argument("--tasks", default=None,
                   help="comma-separated: val, hellaswag, arc_easy, lambada, icl:FILE.yaml (an llm-foundry icl_tasks "
                        "list), or all (default val,hellaswag,arc_easy,lambada; none when --task is given)")
    p.add_argument("--limit", type=counting, default=None, help="first N examples per task (N windows for val)")
    p.add_argument("--all-checkpoints", action="store_true", help="every checkpoint of the run")
    p.add_argument("--data-root", help="folder holding the task files (default $BURNOUT_EVAL_DATA or shared/data)")
    p.add_argument("--task-file", action="append", default=[], metavar="TASK=PATH",
                   help="a built-in task's data file (jsonl, or HellaSwag .txt/.txt.bz2), read with that task's "
                        "template, overriding --data-root")
    p.add_argument("--task", action="append", default=[], metavar="NAME=PATH",
                   help="an ICL task file of your own (multiple_choice {query,choices,gold}, schema "
                        "{context_options,continuation,gold}, language_modeling {context,continuation}), "
                        "scored as written with llm-foundry's prompt rules")
    p.add_argument("--type", help="--task's type: multiple_choice, schema or language_modeling "
                                  "(default: from its first record's fields)")
    p.add_argument("--shots", help="--task's few-shot counts, e.g. 5 or 0,5 (default 0)")
    p.add_argument("--continuation-delimiter", help="--task: between query and answer (default ' '; \\n is a newline)")
    p.add_argument("--example-delimiter", help="--task: between few-shot examples (default '\\n')")
    p.add_argument("--prelimiter", help="--task: before each query, e.g. 'Question: ' (default none)")
    p.add_argument("--data", help="prepared data folder for val (default: the one the run trained on)")
    p.add_argument("--batch-size", type=counting, default=16)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--harness", metavar="TASKS",
                   help="lm-evaluation-harness tasks instead of --tasks (comma-separated names, groups or globs: "
                        "mmlu,gsm8k,...), run through burnout's scorer and generator; RUN/eval/harness_step_N.json")
    p.add_argument("--harness-include", action="append", default=[], metavar="PATH",
                   help="a folder (or file) of custom lm-eval task YAMLs, e.g. over local data files offline")
    p.add_argument("--harness-fewshot", type=natural, default=None, metavar="N",
                   help="few-shot examples per --harness task (default: each task's own)")

    def run(args, overrides):
        if args.harness is not None:
            from burnout.eval.harness import run_harness

            run_harness(args.target, args.harness, include=args.harness_include, limit=args.limit,
                        num_fewshot=args.harness_fewshot, batch_size=args.batch_size, device=args.device,
                        all_checkpoints=args.all_checkpoints)
            return
        files = {}
        for item in args.task_file:
            task, sep, path = item.partition("=")
            if not sep:
                raise BurnoutError(f"--task-file '{item}' must look like TASK=PATH, "
                                   "e.g. hellaswag=data/hellaswag.jsonl")
            files[task] = path
        settings = {"task_type": args.type, "shots": args.shots, "continuation_delimiter": args.continuation_delimiter,
                    "example_delimiter": args.example_delimiter, "prelimiter": args.prelimiter}
        given = [f"--{k.replace('_', '-')}" for k, v in settings.items() if v is not None]
        if given and not args.task:
            raise BurnoutError(f"{given[0]} applies to --task NAME=PATH files; none was given")
        from burnout.eval.icl import one_off_task

        one_off = []
        for item in args.task:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise BurnoutError(f"--task '{item}' must look like NAME=PATH, e.g. mytask=data/mytask.jsonl")
            one_off.append(one_off_task(name, path, **settings))
        tasks = args.tasks if args.tasks is not None else ("" if one_off else "val,hellaswag,arc_easy,lambada")
        from burnout.base.files import METRICS_FILE
        from burnout.base.text import next_steps
        from burnout.core.checkpoint import run_dir_of
        from burnout.eval.evaluate import evaluate

        records = evaluate(args.target, tasks, all_checkpoints=args.all_checkpoints, limit=args.limit,
                           data_root=args.data_root, task_files=files, data_dir=args.data, batch_size=args.batch_size,
                           device=args.device, icl_tasks=one_off)
        run_dir = run_dir_of(Path(records[0]["checkpoint"]))
        if (run_dir / METRICS_FILE).is_file():  # a run's checkpoint, not one standing alone: its report shows these
            print("\n".join(next_steps([("report", f"burnout report {shlex.quote(str(run_dir))}   (these scores "
                                                    "beside the loss curves)")])))
    return run


@command("compare", help="the same prompts at each checkpoint of a run, as a table",
         description="Generate the same prompts with the same settings and seed at each checkpoint "
                     "(or those given) and write RUN/compare.md and RUN/compare.json.",
         computes=True)
def cmd_compare(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("run")
    p.add_argument("--checkpoints", nargs="+", metavar="STEP", help="steps (e.g. 500 1000) or step_* names")
    p.add_argument("--prompts", help="file with one prompt per line (default: a base model's run its own sample "
                                     "prompts, else a few built-in prompts)")
    p.add_argument("--suspicious", metavar="FILE",
                   help="strings that mark an answer degenerate: one per line, or `burnout data audit`'s audit.json")
    # Sampled with a fixed seed, as the blog compared its checkpoints: greedy decoding of a small model loops
    # ("the the the") and hides what changed; --temperature 0 asks for it.
    sampling_flags(p, temperature=0.8, top_k=50, max_new_tokens=60)
    p.set_defaults(seed=0)

    def run(args, overrides):
        from burnout.eval.compare import compare_checkpoints
        from burnout.eval.degeneration import read_suspicious
        from burnout.generate.prompts import read_prompts

        prompts = read_prompts(args.prompts) if args.prompts else None  # None: the run's sample prompts, or built-in
        suspicious = read_suspicious(args.suspicious) if args.suspicious else []
        table = compare_checkpoints(Path(args.run), checkpoints=args.checkpoints, prompts=prompts,
                                    max_new_tokens=args.max_new_tokens, device=args.device, suspicious=suspicious,
                                    **_sampling(args))
        print(table)
        print(f"saved to {Path(args.run) / 'compare.md'}")
    return run


@command("export", help="write a checkpoint as a Hugging Face model folder or a GGUF file",
         description="Write safetensors + config.json + tokenizer files that transformers' "
                     "AutoModelForCausalLM and AutoTokenizer load offline; a --to ending in .gguf writes one "
                     "GGUF file (--gguf-type) for llama.cpp and Ollama instead.")
def cmd_export(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("checkpoint")
    p.add_argument("--to", required=True, help="output folder, or a FILE.gguf for llama.cpp and Ollama")
    p.add_argument("--gguf-type", help="a .gguf --to's weights: f16 (the default), q8_0 or q4_0")
    p.add_argument("--overwrite", action="store_true", help="replace an export of another checkpoint at --to")

    def run(args, overrides):
        from burnout.core.model_files import export_hf
        from burnout.report.model_card import CARD_FILE, write_model_card

        if _export_is_gguf(args.to):
            return _export_gguf(args)
        if args.gguf_type is not None:
            raise BurnoutError(f"--gguf-type {args.gguf_type}: --to {args.to} is a folder (a Hugging Face export); "
                               "give a --to ending in .gguf for a GGUF file")
        export_hf(args.checkpoint, args.to, overwrite=args.overwrite)
        card = write_model_card(args.checkpoint, Path(args.to) / CARD_FILE, Path(args.to).resolve().name)
        about = "with its model card (README.md)" if card else "keeping the README.md there (not a card of ours)"
        print("\n".join([f"wrote a Hugging Face model folder to {args.to}, {about}",
                         *_after_export(args.checkpoint, args.to)]))
    return run


# Names of one file that a Hugging Face export (a folder) is not: said rather than made a folder of that name.
_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".ggml", ".onnx")


def _export_is_gguf(to: str) -> bool:
    """Whether --to names a GGUF file (FILE.gguf, in any case) rather than a Hugging Face folder; a --to that could be
    either (FILE.gguf/, or a file name of another format) refused in one line."""
    suffix = Path(to).suffix.lower()
    if suffix == ".gguf" and to.endswith(("/", os.sep)):
        raise BurnoutError(f"--to {to}: ends in .gguf (a GGUF file) and in / (a folder); drop the / for a GGUF file, "
                           "or give the Hugging Face folder a name without .gguf")
    if suffix in _FILE_SUFFIXES:
        raise BurnoutError(f"--to {to}: names a {suffix} file, but an export is a Hugging Face folder (config.json, "
                           "model.safetensors, tokenizer files) or a FILE.gguf; give a folder name, or a name ending "
                           "in .gguf for llama.cpp")
    return suffix == ".gguf"


def _export_gguf(args: argparse.Namespace) -> None:
    from burnout.base.text import next_steps
    from burnout.core.gguf_export import export_gguf
    from burnout.report.model_card import gguf_metadata, write_model_card

    gguf_type, to = args.gguf_type or "f16", Path(args.to)
    export_gguf(args.checkpoint, to, gguf_type, overwrite=args.overwrite, about=gguf_metadata(args.checkpoint, to.stem))
    card = write_model_card(args.checkpoint, to.with_suffix(".md"), to.stem, gguf_file=to.name)
    about = (f"with its model card beside it ({to.with_suffix('.md').name})" if card else
             f"keeping the {to.with_suffix('.md').name} there (not a card of ours)")
    print("\n".join([f"wrote a GGUF file ({gguf_type}) to {args.to}, {about}",
                     *next_steps([("llama.cpp", f"llama-cli -m {shlex.quote(args.to)}")])]))


def _after_export(checkpoint: str, to: str) -> list[str]:
    """The export's next step: the folder loaded by transformers' pipeline, asked to chat (a chat model) or to
    continue the run's sample prompt."""
    from burnout.base.files import RUN_CONFIG_FILE
    from burnout.base.text import needs_package, next_steps
    from burnout.config import load_run_config
    from burnout.core.chat_template import is_chat_model
    from burnout.core.checkpoint import resolve_checkpoint
    from burnout.generate.prompts import suggested_prompt

    cfg = load_run_config(resolve_checkpoint(checkpoint) / RUN_CONFIG_FILE)
    # Double quotes inside, so that the shell's single quotes around the code need no escapes.
    model = f'pipeline("text-generation", {json.dumps(str(to))})'
    if is_chat_model(cfg):
        use = (f'chat = {model}; print(chat([{{"role": "user", "content": "Name a color."}}], max_new_tokens=60)'
               '[0]["generated_text"][-1])')
    else:
        prompt = json.dumps(suggested_prompt(resolve_checkpoint(checkpoint)))
        use = f'print({model}({prompt}, max_new_tokens=40)[0]["generated_text"])'
    load = f"python -c {shlex.quote(f'from transformers import pipeline; {use}')}"
    return next_steps([("transformers", needs_package(load, "transformers", "hf"))])


@command("import", help="turn a Hugging Face GPT-2 or LLaMA folder into a checkpoint",
         description="Read config.json + safetensors + tokenizer.json of a GPT-2 or LLaMA model and "
                     "write OUT/checkpoints/step_0000000, usable by generate, chat and eval.")
def cmd_import(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("hf_dir", metavar="HF_DIR")
    p.add_argument("--to", required=True, help="new run folder")

    def run(args, overrides):
        from burnout.core.model_files import import_hf

        path = import_hf(Path(args.hf_dir), Path(args.to))
        print(f"imported {args.hf_dir} as checkpoint {path} (use it with burnout generate/eval/chat {args.to})")
    return run


@command("grow", help="grow a run's model deeper or wider into a new run, its outputs unchanged",
         description="Write NEW/checkpoints/step_0000000: RUN's newest checkpoint (or RUN/checkpoints/step_N) grown to "
                     "the shape KEY=VALUE give (model.n_layer, model.d_model, model.n_head, model.n_kv_head, "
                     "model.ffn_hidden), whose logits equal the original's: new blocks start as the identity, "
                     "wider layers copy each channel. Train it with `burnout train --init-from NEW`.")
def cmd_grow(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("source", metavar="RUN_OR_CKPT", help="the model to grow")
    p.add_argument("--out", required=True, metavar="NEW", help="new run folder for the grown model")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="the larger shape, e.g. model.n_layer=8")

    def run(args, overrides):
        from burnout.base.text import next_steps
        from burnout.core.model_files import grow_run

        written, record = grow_run(args.source, args.out, overrides, on_event=lambda line: print(line, flush=True))
        shape = ", ".join(f"{key} {before} → {record['after'][key]}" for key, before in record["before"].items()
                          if before != record["after"][key])
        new, trained = shlex.quote(str(args.out)), shlex.quote(f"{args.out}-trained")
        print("\n".join([f"grew {record['checkpoint']} (step {record['step']:,}) into {written}: {shape}; its "
                         "outputs are the original's", *next_steps([
                             ("train it", f"burnout train --init-from {new} --out {trained}"),
                             ("check it", f"burnout eval {new} --tasks val")])]))
    return run


@command("report", help="a run's report (HTML + Markdown, plots) or an overlay of several runs",
         description="Write RUN/report/report.html (self-contained) and report.md with plots, "
                     "tables, samples and anomalies from the run's own logs, and print a summary; a speedrun's "
                     "folder: its report card, DIR/report.md and .html. "
                     "Several runs: their loss curves overlaid, written to --out.")
def cmd_report(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--html", action="store_true", help="write the HTML page (default: both formats)")
    p.add_argument("--md", action="store_true", help="write the Markdown file (default: both formats)")
    p.add_argument("--out", help="output folder (default RUN/report; required for several runs)")
    p.add_argument("--overwrite", action="store_true", help="replace a report of other runs at --out")
    p.add_argument("--log-scale", action="store_true", help="log-log axes on the loss plots")

    def run(args, overrides):
        from burnout.report.card import is_speedrun, write_card
        from burnout.report.render import terminal_summary, write_report

        if len(args.runs) == 1 and is_speedrun(args.runs[0]):
            if args.html or args.md or args.out or args.log_scale:
                raise BurnoutError(f"report {args.runs[0]}: a speedrun's card is DIR/report.md and .html; drop "
                                   "--html, --md, --out and --log-scale (or report one of its runs, e.g. DIR/pretrain)")
            print("\n".join(f"wrote {path}" for path in write_card(args.runs[0])))
            return
        both = not (args.html or args.md)  # neither flag means both formats
        runs, written = write_report(args.runs, out=args.out, html_page=args.html or both,
                                     markdown=args.md or both, log_scale=args.log_scale, overwrite=args.overwrite)
        print(terminal_summary(runs, written))
    return run


@command("playground", help="a local web app to try checkpoints: streaming, side by side",
         description="Serve the checkpoints of the given runs (or single checkpoint folders) in a "
                     "Gradio app: dropdown, sampling sliders, streaming output, model info and a "
                     "side-by-side mode. Only those checkpoints can be chosen.",
         computes=True)
def cmd_playground(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("sources", nargs="+", metavar="RUN_OR_CKPT")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=number(integer=True, low=0, high=65535), default=7860)
    p.add_argument("--max-cache-mb", type=positive, default=2048, help="memory bound on loaded models' weights")
    p.add_argument("--concurrency", type=counting, default=2, help="generations running at once")
    p.add_argument("--queue-size", type=counting, default=32, help="requests that may wait; more are refused")

    def run(args, overrides):
        from burnout.playground.app import serve

        serve(args.sources, host=args.host, port=args.port, max_cache_mb=args.max_cache_mb,
              concurrency=args.concurrency, queue_size=args.queue_size)
    return run


@command("serve", help="an OpenAI-compatible API for a run's model: completions, chat, streaming",
         description="Serve a run's newest checkpoint (or a checkpoint folder) at /v1/models, /v1/completions and "
                     "/v1/chat/completions (chat models), for the openai client and the tools built on it.",
         computes=True)
def cmd_serve(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("run", metavar="RUN_OR_CKPT")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=number(integer=True, low=0, high=65535), default=8000, help="0: any free port")
    p.add_argument("--api-key", default=os.environ.get("BURNOUT_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $BURNOUT_API_KEY, else no key)")
    p.add_argument("--name", help="the model's name in the API (default: the run folder's name)")
    p.add_argument("--concurrency", type=counting, default=1, help="generations running at once")
    p.add_argument("--queue-size", type=number(integer=True, low=0), default=16,
                   help="requests that may wait; more are refused with 429")

    def run(args, overrides):
        from burnout.serve.openai_api import serve

        serve(args.run, host=args.host, port=args.port, api_key=args.api_key, concurrency=args.concurrency,
              queue_size=args.queue_size, name=args.name)
    return run


def build_parser() -> argparse.ArgumentParser:
    """The `burnout` parser: one subparser per registered unit, in the order they appear above."""
    parser = OneLineParser(
        prog="burnout",
        description="GPUburnout: train language models from scratch — data, tokenizer, model, training, use.",
    )
    subparsers = {(): parser.add_subparsers(dest="command", metavar="COMMAND", required=True)}
    for path, texts, setup in _UNITS:
        p = subparsers[path[:-1]].add_parser(path[-1], **texts)
        if setup is None:
            subparsers[path] = p.add_subparsers(dest=f"{path[-1]}_command", metavar="ACTION", required=True)
        else:
            p.set_defaults(func=setup(p), computes=path in _COMPUTING)
    return parser


# The exit code of an error that is burnout's and not the user's: as Python's for an uncaught exception.
INTERNAL_ERROR = 1


def main(argv: list[str] | None = None) -> int:
    retain_freed_memory()
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        overrides = _overrides(getattr(args, "overrides", []), unknown, accepts_overrides=hasattr(args, "overrides"))
        if args.computes:
            spare_busy_cores()
        code = args.func(args, overrides)
    except BurnoutError as exc:
        print(f"burnout: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("burnout: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a folder that cannot be written, a full disk: the environment, not a bug
        where = f" '{exc.filename}'" if exc.filename else ""
        print(f"burnout: error: cannot read or write{where}: {exc.strerror or exc}; check that the path exists, "
              "is writable and that its disk has free space", file=sys.stderr)
        from burnout.errors import StorageError

        return StorageError.exit_code
    except Exception as exc:  # burnout's own fault: one line for the user, the whole trace kept for a bug report
        what = type(exc).__name__ + (f": {first_line(exc)}" if str(exc).strip() else "")
        print(f"burnout: internal error: {what}; {_keep_trace(argv)}", file=sys.stderr)
        return INTERNAL_ERROR
    return code or 0


def _keep_trace(argv: list[str] | None) -> str:
    """Save the traceback being handled, with the command line, to a file in the user's cache folder; the words that
    say where it is (or, when no file can be written, that it is printed above: printed now, before the line)."""
    import time
    import traceback

    trace = traceback.format_exc()
    folder = user_cache_dir() / "errors"
    path = folder / f"internal-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # backslashreplace: an argument of bytes that are not UTF-8 (a lone surrogate to Python) is written, not fatal.
        path.write_text(f"burnout {shlex.join(sys.argv[1:] if argv is None else argv)}\n{trace}", encoding="utf-8",
                        errors="backslashreplace")
    except OSError as exc:
        sys.stderr.write(trace)
        return f"the full trace is above (it could not be saved in {folder}: {exc.strerror or exc}); please report it"
    return f"the full trace is in {path}; please report it"
