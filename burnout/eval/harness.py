"""`burnout eval RUN --harness TASKS`: any lm-evaluation-harness task, run by our own engine.

The checkpoint is handed to lm-eval as a model (`BurnoutLM`, an implementation of its `LM` API): lm-eval builds
the prompts, few-shot contexts, filters and metrics of any task (MMLU, TruthfulQA, GSM8K, IFEval, ... or a custom
YAML over local files), and we answer its requests with no export and no transformers model in memory, every
number what lm-eval's "hf" backend gives on the exported folder (tests/eval/test_harness.py). lm-eval is an
optional dependency; offline (HF_DATASETS_OFFLINE=1), its tasks read local files through custom YAMLs
(--harness-include).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from burnout.base.files import EOT_TOKEN, write_atomic
from burnout.base.text import first_line, install_extra
from burnout.core.chat_template import IM_END, is_chat_model
from burnout.core.checkpoint import run_dir_of
from burnout.core.device import resolve_device
from burnout.core.model_files import load_model
from burnout.data.tokenizer import unencodable, unencodable_error
from burnout.errors import BurnoutError
from burnout.eval.evaluate import checkpoints_to_evaluate
from burnout.eval.scoring import score_encoded
from burnout.generate.sampling import generate_batch
from burnout.models import Transformer

try:  # the optional lm-eval package; without it run_harness says how to install it
    from lm_eval.api.model import TemplateLM
except ImportError:
    TemplateLM = object

INSTALL_HINT = f"{install_extra('dev')}; or lm-eval alone: pip install lm-eval"
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HFLM.max_gen_toks, for tasks that set none
# Generation settings a task may give besides until / max_gen_toks (and their aliases) / do_sample / temperature.
SAMPLING_KWARGS = {"top_k", "top_p", "repetition_penalty"}


def require_lm_eval():
    """The lm_eval module, or one line saying how to install it."""
    try:
        import lm_eval
        import lm_eval.api.model  # noqa: F401
    except ImportError:
        raise BurnoutError(f"--harness needs lm-evaluation-harness, which is not installed; {INSTALL_HINT}") from None
    return lm_eval


# ----------------------------------------------------------------------------------------------
# Token-level scoring


def score_token_pairs(model: Transformer, encoded: Sequence[tuple[list[int], list[int]]], batch_size: int = 16,
                      progress: Callable[[int], None] | None = None) -> list[tuple[float, bool]]:
    """(log P(continuation | context), continuation is the greedy output) for each (context ids,
    continuation ids), as lm-eval's HF backend computes them from the same ids: the model reads
    (context + continuation)[-(window + 1):][:-1], which is what burnout.eval.scoring scores."""
    for i, (ctx_ids, _) in enumerate(encoded):
        if not ctx_ids:  # TemplateLM gives the prefix token for an empty context; an empty list is a bug upstream
            raise BurnoutError(f"request {i}: the context encodes to no tokens")
    count = None if progress is None else (lambda done: progress(len(done)))
    return [(s.loglikelihood, s.greedy) for s in score_encoded(model, list(encoded), batch_size, count)]


def _has_stop(text: str, stop: Sequence[str]) -> bool:
    return any(s and s in text for s in stop)


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """`text` before the first of the stop sequences, as lm-eval's postprocess_generated_text cuts it."""
    cuts = [i for s in stop if s and (i := text.find(s)) >= 0]
    return text[: min(cuts)] if cuts else text


# ----------------------------------------------------------------------------------------------
# The model lm-eval sees


class BurnoutLM(TemplateLM):
    """A checkpoint as an lm-eval model: lm_eval.api.model.LM's three request types on our model object (the
    `TemplateLM` kind, as lm-eval's Hugging Face backend is):

        loglikelihood          (context, continuation) → (log P, greedy?) through our batched scorer
                               (burnout.eval.scoring: requests sharing a context are one row, its choices masked
                               branches of it; the LM head only where a continuation token is predicted)
        loglikelihood_rolling  a document's log-likelihood over lm-eval's own rolling windows, same scorer
        generate_until         our KV-cache generator (burnout.generate.sampling), greedy unless the task samples
    """

    backend = "causal"

    def __init__(self, model: Transformer, tokenizer: Tokenizer, batch_size: int = 16, chat: bool = False,
                 max_gen_toks: int = DEFAULT_MAX_GEN_TOKS):
        super().__init__()
        self.model, self._tokenizer, self.batch_size = model, tokenizer, batch_size
        self._prefix = tokenizer.token_to_id(EOT_TOKEN)  # the exported folder's bos token
        # Where generation ends, as the exported folder's generation_config says: <|endoftext|>, and a chat
        # model's <|im_end|> first, which is then its tokenizer's eos token (HFLM's eot_token_id).
        ends = [tokenizer.token_to_id(IM_END), self._prefix] if chat else [self._prefix]
        if chat and ends[0] is None:
            raise BurnoutError(f"this chat model's tokenizer has no {IM_END} token, where its answers end")
        self.stop_ids = [i for i in ends if i is not None]
        self._max_gen_toks = max_gen_toks
        self._device = model.tok_emb.weight.device
        self.checkpoint = None  # from_checkpoint's: config, info

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: torch.device | str = "cpu", batch_size: int = 16) -> BurnoutLM:
        """A checkpoint folder (or a run folder's latest) as an lm-eval model; its info as `checkpoint`."""
        model, tokenizer, ckpt = load_model(path, device)
        lm = cls(model, tokenizer, batch_size=batch_size, chat=is_chat_model(ckpt.config))
        lm.checkpoint = ckpt
        return lm

    # lm-eval's TemplateLM interface
    @property
    def eot_token_id(self) -> int | None:
        return self.stop_ids[0] if self.stop_ids else None

    @property
    def prefix_token_id(self) -> int | None:
        return self._prefix

    @property
    def max_length(self) -> int:
        return self.model.cfg.context_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return "burnout"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self._encode([string], add_special_tokens is not False)[0]

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self._tokenizer.decode(list(tokens))

    def _encode(self, strings: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        try:
            return [e.ids for e in self._tokenizer.encode_batch(list(strings), add_special_tokens=add_special_tokens)]
        except Exception as exc:  # the Rust side raises a bare Exception (an unseen character), TypeError (a surrogate)
            failing = next((text for text in strings if unencodable(self._tokenizer, text)), "")
            raise unencodable_error(self._tokenizer, failing, "the task text", "evaluate a byte-level BPE model, "
                                    "which encodes any text", exc) from None

    def encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """(context ids, continuation ids) of each (context, continuation), as TemplateLM.loglikelihood splits
        them (its _encode_pair, and the prefix token for an empty context), the strings encoded in batches:
        trailing spaces of the context move to the continuation; the continuation is encode(context +
        continuation) past encode(context); an empty context is the prefix token (<|endoftext|>, the exported
        folder's bos and eos) and the continuation encoded without special tokens. Too-long inputs then lose
        tokens on the left."""
        moved = []
        for context, continuation in pairs:
            n_spaces = len(context) - len(context.rstrip())
            if n_spaces:
                context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
            moved.append((context, continuation))
        with_ctx = [i for i, (c, _) in enumerate(moved) if c]
        contexts = iter(self._encode([moved[i][0] for i in with_ctx]))
        wholes = iter(self._encode([moved[i][0] + moved[i][1] for i in with_ctx]))
        alone = iter(self._encode([k for c, k in moved if not c], add_special_tokens=False))
        out = []
        for i, (context, continuation) in enumerate(moved):
            if context:
                ctx_ids = next(contexts)
                out.append((ctx_ids, next(wholes)[len(ctx_ids):]))
                continue
            cont = next(alone)
            if self.prefix_token_id is None:
                raise BurnoutError(f"request {i} has an empty context, which needs a prefix token, "
                                   f"and this tokenizer has no {EOT_TOKEN}")
            if not cont:
                raise BurnoutError(f"request {i}: the continuation {continuation!r} encodes to no tokens")
            out.append(([self.prefix_token_id], cont) if cont[0] != self.prefix_token_id else (cont[:1], cont[1:]))
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        encoded = self.encode_pairs([req.args for req in requests])
        results = self._score(encoded, "loglikelihood requests", disable_tqdm)
        for req, answer in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", req.args, answer)
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """TemplateLM's token-level entry: ((context, continuation) strings, context ids, continuation ids)."""
        return self._score([(ctx, cont) for _, ctx, cont in requests], "loglikelihood requests", disable_tqdm)

    def _score(self, encoded, desc: str, disable_tqdm: bool) -> list[tuple[float, bool]]:
        with tqdm(total=len(encoded), desc=desc, disable=disable_tqdm) as bar:
            return score_token_pairs(self.model, encoded, self.batch_size, progress=bar.update)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each string's log-likelihood over lm-eval's disjoint rolling windows (context 1), as HFLM does."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows, owner = [], []
        for i, ids in enumerate(self._encode([req.args[0] for req in requests])):
            for window in get_rolling_token_windows(token_list=ids, prefix_token=self.prefix_token_id,
                                                    max_seq_len=self.max_length, context_len=1):
                windows.append(make_disjoint_window(window))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, self._score(windows, "rolling windows", disable_tqdm)):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each request's continuation, decoded with its task's settings; requests of equal settings decode
        together, batch_size at a time, longest prompts first, each batch padded on the left. As lm-eval's "hf"
        backend: the context keeps its last (window − max_gen_toks) tokens; decoding stops at <|endoftext|> (and
        a chat model's <|im_end|>, as the export's generation_config does), at max_gen_toks, or once the text
        holds a stop sequence; the answer is the decoded text (special tokens skipped) cut at the first stop
        sequence."""
        by_settings: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            by_settings.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out: list[str] = [""] * len(requests)
        with tqdm(total=len(requests), desc="generate_until requests", disable=disable_tqdm) as bar:
            for indices in by_settings.values():
                texts = self._generate([requests[i].args[0] for i in indices], requests[indices[0]].args[1], bar)
                for i, text in zip(indices, texts):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def _generate(self, contexts: list[str], gen_kwargs: dict, bar) -> list[str]:
        until, max_gen_toks, sampling = self.generation_settings(gen_kwargs)
        room = self.max_length - max_gen_toks
        if room <= 0:
            raise BurnoutError(f"the task asks for up to {max_gen_toks} new tokens, which leaves no room for its "
                               f"prompt in the model's context of {self.max_length}; lower max_gen_toks in its YAML")
        prompts = [ids[-room:] for ids in self._encode(contexts)]
        for i, ids in enumerate(prompts):
            if not ids:
                raise BurnoutError(f"generation request {i}: the prompt {contexts[i][:40]!r} encodes to no tokens")
        # Longest first, batch_size at a time, each batch padded on the left: neighbours have similar lengths,
        # so little padding, and prompts of many lengths still decode together.
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        texts = [""] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            new_ids = generate_batch(self.model, [prompts[i] for i in chunk], max_gen_toks, stop_id=self.stop_ids,
                                     is_done=lambda r, ids: _has_stop(self.tok_decode(ids), until), pad=True,
                                     **sampling)
            for i, ids in zip(chunk, new_ids):
                texts[i] = _cut_at_stop(self.tok_decode(ids), until)
            bar.update(len(chunk))
        return texts

    def generation_settings(self, gen_kwargs: dict) -> tuple[list[str], int, dict]:
        """(stop sequences, max new tokens, our sampling settings) from a request's gen_kwargs, normalized as
        lm-eval's backends normalize them; the end-of-text string is a stop sequence too, as HFLM adds it."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        kwargs = dict(normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks))
        eos = self._tokenizer.id_to_token(self.eot_token_id) if self.eot_token_id is not None else None
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_gen_toks = int(kwargs.pop("max_gen_toks"))
        do_sample, temperature = bool(kwargs.pop("do_sample", False)), float(kwargs.pop("temperature", 0.0))
        if kwargs.pop("num_beams", 1) != 1:
            raise BurnoutError("the task asks for beam search (num_beams > 1), which burnout's generator does not do")
        kwargs.pop("max_length", None)  # HF's prompt + new tokens; lm-eval warns and uses max_gen_toks
        unknown = sorted(set(kwargs) - SAMPLING_KWARGS)
        if unknown:
            raise BurnoutError(f"the task's generation_kwargs {', '.join(unknown)} are not supported; burnout "
                               "generates with until, max_gen_toks, do_sample, temperature, top_k, top_p and "
                               "repetition_penalty")
        # HF's repetition penalty reads every earlier token, the prompt's included (repetition_window 0).
        settings = {"repetition_penalty": float(kwargs.get("repetition_penalty", 1.0)), "repetition_window": 0}
        if not do_sample:  # greedy, as HF's do_sample=False is whatever the temperature
            return until, max_gen_toks, {"temperature": 0.0, **settings}
        # transformers' sampling defaults: temperature 1, top-k 50, top-p 1.
        return until, max_gen_toks, {"temperature": temperature or 1.0, "top_k": kwargs.get("top_k", 50) or None,
                                     "top_p": kwargs.get("top_p"), **settings}


# ----------------------------------------------------------------------------------------------
# burnout eval --harness


def task_manager(include: Sequence[str | Path] = (), include_defaults: bool = True):
    """lm-eval's TaskManager over its built-in tasks (unless include_defaults is False) and the YAML folders
    or files in `include`."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    paths = [Path(p) for p in include]
    for path in paths:
        if not path.exists():
            raise BurnoutError(f"--harness-include '{path}' does not exist; give a folder of lm-eval task YAMLs")
    return TaskManager(include_path=[str(p) for p in paths] or None, include_defaults=include_defaults)


def parse_harness_tasks(spec: str | Sequence[str], manager) -> list[str]:
    """'mmlu,gsm8k' → ['mmlu', 'gsm8k'], each a task, group or tag lm-eval knows (or a glob over them, or a
    task YAML's path); an unknown name is one line with the closest known names."""
    names = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t.strip()]
    if not names:
        raise BurnoutError("--harness is empty; give lm-eval task names, e.g. --harness arc_easy,gsm8k")
    known = manager.all_tasks
    out = []
    for name in names:
        if name in known or Path(name).is_file():
            out.append(name)
            continue
        matches = fnmatch.filter(known, name) if any(c in name for c in "*?[") else []
        if not matches:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise BurnoutError(f"unknown lm-eval task '{name}'{hint} (list them with `lm-eval ls tasks`; "
                               "a custom task's YAML folder goes in --harness-include)")
        out += matches
    return list(dict.fromkeys(out))


def run_harness(target: str | Path, tasks: str | Sequence[str], include: Sequence[str | Path] = (),
                limit: int | None = None, num_fewshot: int | None = None, batch_size: int = 16,
                device: str = "auto", all_checkpoints: bool = False, include_defaults: bool = True,
                log_samples: bool = False, say: Callable[[str], None] = print) -> list[dict]:
    """Run lm-eval's `tasks` on a checkpoint (a run folder: its latest, or every one with all_checkpoints)
    through BurnoutLM; print lm-eval's tables and write RUN/eval/harness_step_N.json (lm-eval's results without
    the per-sample log) for each checkpoint.
    Returns lm-eval's results per checkpoint (with its per-sample log when log_samples)."""
    require_lm_eval()
    if limit is not None and limit < 1:
        raise BurnoutError(f"--limit must be at least 1, not {limit}")
    if batch_size < 1:
        raise BurnoutError(f"--batch-size must be at least 1, not {batch_size}")
    paths = checkpoints_to_evaluate(target, all_checkpoints)
    dev = resolve_device(device, "--device")
    manager = task_manager(include, include_defaults)  # indexing lm-eval's built-in tasks takes seconds
    names = parse_harness_tasks(tasks, manager)
    return [_run_one(path, names, manager, limit, num_fewshot, batch_size, dev, log_samples, say) for path in paths]


def _run_one(path: Path, names: list[str], manager, limit, num_fewshot, batch_size, device, log_samples,
             say) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable, make_table

    lm = BurnoutLM.from_checkpoint(path, device, batch_size)
    ckpt = lm.checkpoint
    try:
        results = simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=limit, num_fewshot=num_fewshot,
                                  batch_size=batch_size, device=str(device), log_samples=log_samples)
    except Exception as exc:  # a task's dataset that cannot be had (offline, a wrong path) is the user's to fix
        data_error = isinstance(exc, (ConnectionError, FileNotFoundError)) or type(exc).__module__.split(".")[0] in (
            "datasets", "huggingface_hub", "requests", "urllib3")
        if not data_error:
            raise
        raise BurnoutError(f"lm-eval could not load the data of {', '.join(names)} ({first_line(exc)}); "
                           "offline, point a custom task YAML at local files and pass its folder with "
                           "--harness-include") from None
    step = ckpt.info.get("step")
    record = {"checkpoint": str(ckpt.path), "step": step, "tokens": ckpt.info.get("tokens"), "limit": limit,
              **{k: v for k, v in results.items() if k != "samples"}}
    out = run_dir_of(ckpt.path) / "eval" / f"harness_{ckpt.path.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(record, indent=2, default=handle_non_serializable) + "\n")
    say(f"step {step}: lm-eval tasks {', '.join(names)}" + (f", first {limit} examples each" if limit else ""))
    say(make_table(results))
    if results.get("groups"):
        say(make_table(results, "groups"))
    say(f"saved to {out}")
    return results
