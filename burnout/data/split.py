"""Which tokens of each document go to val: a fair sample of the text by tokens, whatever its documents' lengths.

Val's loss stands for the loss on the whole text only when every token is as likely to be in val as any other:
val_fraction, whether its document is a heading of five tokens or a chapter of five thousand. `ValSplit` gives
that in two ways, each fair on its own:
- a document larger than its source's whole share of val (fewer than one such document is expected in val) is
  cut: its last val_fraction of tokens to val, the rest to train, so that a text of one book, or of a few long
  stories, still gives val its share; smaller ones are not cut, which would leave val crumbs of documents;
- the others go whole, by systematic sampling within their length class (lengths within a factor of two): each
  class of a source adds val_fraction per document to a count that starts at a seeded phase in [0, 1), and the
  document that takes it past a whole number goes to val. With the phase uniform, every document goes to val
  with probability val_fraction whatever its length; and each class's val holds its share of the class's
  documents to within one, so short and long documents hold the parts of val that they hold of the text.
A source's second document goes to val when none has yet (a source with no val says nothing of itself); its class
pays the document back from its count.

The previous rule (SPLIT_RULE 2) sent a document to val whenever val lacked half its length, so short documents
went far more often than long ones: WikiText-2's heading lines, 2.3% of its text, made 32% of val's tokens.
`split_warnings` says so of a folder parted that way, and of a new folder whose val's mix of lengths is still far
from train's (too few documents to sample from).
"""

from __future__ import annotations

import hashlib

# The rule that parts the documents into train and val, in meta.json and in an unfinished folder's fingerprint.
# 3: ValSplit (fair by tokens). 2: whole documents sent where val lacked half of one (favours the short); a document
# larger than its source's share of val cut. 1: whole documents only.
SPLIT_RULE = 3
# Val's share of the tokens is far from data.val_fraction beyond this factor of it, either way.
VAL_SHARE_FACTOR = 2
# Val's mix of document lengths is far from train's when their token shares differ by this much in all
# (total variation distance over the sources' length classes).
FAR_LENGTH_MIX = 0.25


def length_class(length: int) -> int:
    """The class of a document of `length` tokens: the power of two at or below it (64 holds 64 to 127)."""
    return 1 << (max(length, 1).bit_length() - 1)


def is_cut(length: int, budget: int, fraction: float) -> bool:
    """Whether a document of `length` tokens, of a source with a `budget` of tokens, is cut between train and val
    rather than sent whole: it is larger than the source's share of val. (A cut adds an <|endoftext|>.)"""
    return length > fraction * budget


class ValSplit:
    """How many of each document's tokens go to val, for the sources `names` with token `budgets` (module doc).

    Its state is the count of each (source, length class) seen; `state` and `restore` carry it across a resume.
    """

    def __init__(self, fraction: float, seed: int, names: list[str], budgets: dict[str, int]) -> None:
        self.fraction, self.seed, self.names, self.budgets = fraction, seed, names, budgets
        self.counts: dict[tuple[int, int], float] = {}

    def val_tokens(self, i: int, length: int, first_due: bool) -> int:
        """Tokens of source i's next document (`length` with its <|endoftext|>) that go to val: all, none, or the
        end of it (a count that includes the <|endoftext|> the cut adds). `first_due`: the source has given
        documents but none to val yet."""
        if is_cut(length, self.budgets[self.names[i]], self.fraction):
            tokens = round(self.fraction * (length + 1))  # the cut adds an <|endoftext|>
            if 2 <= tokens < length:  # val's part holds text, train's too
                return tokens
        key = (i, length_class(length))
        count = self.counts.get(key, self._phase(*key)) + self.fraction
        to_val = first_due or count >= 1
        self.counts[key] = count - 1 if to_val else count
        return length if to_val else 0

    def _phase(self, i: int, group: int) -> float:
        """The seeded phase in [0, 1) that source i's length class `group` starts counting from."""
        digest = hashlib.sha256(f"{self.seed}/{self.names[i]}/{group}".encode()).digest()
        return int.from_bytes(digest[:8], "little") / 2**64

    def state(self) -> list[list]:
        return [[i, group, count] for (i, group), count in sorted(self.counts.items())]

    def restore(self, state: list[list]) -> None:
        self.counts = {(int(i), int(group)): float(count) for i, group, count in state}


def split_warnings(meta: dict) -> list[str]:
    """A line for each way the val split of the prepared folder of `meta` is not a fair sample of its text: its
    share of the tokens far from data.val_fraction; its documents' lengths far from train's; an older rule."""
    lines = [_share_warning(meta), _length_mix_warning(meta)]
    if older_split_rule(meta) and (meta.get("data_config") or {}).get("split", "documents") == "documents":
        lines.append("warning: this data folder was parted into train and val by an older rule of burnout's, which "
                     "sent short documents to val far more often than long ones: its val loss leans towards them; "
                     "prepare it again (burnout data prepare SOURCE --out DIR --overwrite)")
    return [line for line in lines if line]


def _share_warning(meta: dict) -> str | None:
    fraction = (meta.get("data_config") or {}).get("val_fraction")
    val = meta["splits"]["val"]["tokens"]
    total = val + meta["splits"]["train"]["tokens"]
    if not fraction or fraction / VAL_SHARE_FACTOR <= val / total <= fraction * VAL_SHARE_FACTOR:
        return None
    return (f"warning: the val split holds {val / total:.0%} of the tokens ({val:,} of {total:,}), far from "
            f"data.val_fraction {fraction:g}: its loss says little of how the model does on text it has not seen; "
            "prepare more documents, or cut each one (data.split=contiguous)")


def _length_mix_warning(meta: dict) -> str | None:
    """A line when val's tokens are spread over document lengths far otherwise than train's (FAR_LENGTH_MIX)."""
    mixes = {}
    for split in ("train", "val"):
        tokens = {(name, int(group)): count for name, entry in meta["sources"]["per_source"].items()
                  for group, count in (entry.get("lengths") or {}).get(split, {}).items()}
        total = sum(tokens.values())
        if not total:
            return None
        mixes[split] = {key: count / total for key, count in tokens.items()}
    keys = mixes["train"].keys() | mixes["val"].keys()
    gaps = {key: mixes["val"].get(key, 0.0) - mixes["train"].get(key, 0.0) for key in keys}
    if sum(abs(gap) for gap in gaps.values()) / 2 <= FAR_LENGTH_MIX:
        return None
    (name, group), gap = max(gaps.items(), key=lambda item: abs(item[1]))
    return (f"warning: the val split's documents are not a fair sample of the text's lengths: documents of "
            f"{group:,}-{2 * group - 1:,} tokens of '{name}' hold {mixes['val'].get((name, group), 0):.0%} of val's "
            f"tokens against {mixes['train'].get((name, group), 0):.0%} of train's, so its loss leans towards them; "
            "prepare more documents, or cut each one (data.split=contiguous)")


def older_split_rule(meta: dict) -> bool:
    """Whether the folder of `meta` was parted into train and val by a rule before SPLIT_RULE. Such a folder is still
    used as it is (re-preparing a large corpus costs hours); `split_warnings` says to prepare it again."""
    rule = meta.get("split_rule", 1)
    return not isinstance(rule, int) or rule < SPLIT_RULE
