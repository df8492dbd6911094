"""Duplicates across all sources of an audit: exact duplicate documents, and near-duplicate clusters.

Exact: a 64-bit blake2b of each document's stripped text; a text seen before joins its group, and only
distinct texts go on to the near-duplicate index. Near: datasketch MinHash over lowercase word
`shingle_words`-grams, in a MinHashLSH index at `near_dup_threshold`, candidates confirmed by their
estimated Jaccard similarity, clusters joined transitively (union-find).

Unlike the counting tables, both indexes grow with the documents audited (which the character budget
bounds): a hash per document, and per distinct document its signature (num_perm x 4 bytes) and LSH band keys.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import time
import zlib
from array import array
from collections import Counter

import numpy as np

from burnout.base.text import install_extra
from burnout.errors import BurnoutError
from burnout.forensics.audit_settings import AuditSettings
from burnout.forensics.snippets import snippet

_WORD = re.compile(r"\w+")
_SHINGLE_MULTIPLIERS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
                                 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x27D4EB2F165667C5, 0x94D049BB133111EB],
                                dtype=np.uint64)
_MAX_CLUSTER_MEMBERS = 50


class Duplicates:
    """Exact duplicate documents (a 64-bit hash each) and near-duplicate clusters (MinHash LSH)."""

    def __init__(self, settings: AuditSettings, source_names: list[str]) -> None:
        try:
            from datasketch import MinHash, MinHashLSH
        except ImportError:
            raise BurnoutError(f"the near-duplicate search needs datasketch; {install_extra('data')}") from None
        self.settings = settings
        self.names = source_names
        self.first: dict[int, int] = {}  # hash -> source << 40 | ordinal of its first document
        self.groups: dict[int, dict] = {}
        self.template = MinHash(num_perm=settings.num_perm, hashfunc=int)
        self.lsh = MinHashLSH(threshold=settings.near_dup_threshold, num_perm=settings.num_perm)
        self.signatures = np.zeros((1024, settings.num_perm), dtype=np.uint32)
        self.where = array("q")  # LSH key -> source << 40 | ordinal
        self.parent: dict[int, int] = {}
        self.similarity: dict[int, float] = {}  # root -> lowest similarity that joined the cluster
        self.snippets: dict[int, str] = {}
        self.too_short = 0
        self.elapsed_s = 0.0

    def add(self, source: int, ordinal: int, text: str) -> None:
        start = time.perf_counter()
        where = source << 40 | ordinal
        key = int.from_bytes(hashlib.blake2b(text.strip().encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                             "little")
        first = self.first.setdefault(key, where)
        if first != where:
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = {"documents": Counter({first >> 40: 1}),
                                            "first": [self.names[first >> 40], first & ((1 << 40) - 1)],
                                            "example": snippet(text, 0, 0, self.settings.snippet_chars)}
            group["documents"][source] += 1
        else:
            self._near(where, text)
        self.elapsed_s += time.perf_counter() - start

    def _near(self, where: int, text: str) -> None:
        s = self.settings
        words = _WORD.findall(text.lower())
        if len(words) < s.shingle_words + 4:  # fewer than 5 shingles: too short to call near-identical
            self.too_short += 1
            return
        encoded = map(str.encode, words, itertools.repeat("utf-8"), itertools.repeat("surrogatepass"))
        hashes = np.fromiter(map(zlib.crc32, encoded), dtype=np.uint64, count=len(words))
        n = len(words) - s.shingle_words + 1
        mixed = np.zeros(n, dtype=np.uint64)
        for j in range(s.shingle_words):
            mixed += hashes[j : j + n] * _SHINGLE_MULTIPLIERS[j % len(_SHINGLE_MULTIPLIERS)]
        shingles = np.unique(mixed >> np.uint64(32))
        minhash = self.template.copy()
        minhash.update_batch(shingles.tolist())
        signature = np.asarray(minhash.hashvalues, dtype=np.uint32)
        doc = len(self.where)
        for other in self.lsh.query(minhash):
            similarity = float(np.mean(self.signatures[other] == signature))
            if similarity >= s.near_dup_threshold:
                self._join(doc, other, similarity)
                self.snippets.setdefault(doc, snippet(text, 0, 0, s.snippet_chars))
        self.lsh.insert(doc, minhash, check_duplication=False)
        if doc >= len(self.signatures):
            self.signatures = np.concatenate([self.signatures, np.zeros_like(self.signatures)])
        self.signatures[doc] = signature
        self.where.append(where)

    def _root(self, doc: int) -> int:
        parent = self.parent
        root = doc
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(doc, doc) != root:  # path compression
            parent[doc], doc = root, parent[doc]
        return root

    def _join(self, a: int, b: int, similarity: float) -> None:
        ra, rb = self._root(a), self._root(b)
        low = min(similarity, self.similarity.get(ra, 1.0), self.similarity.get(rb, 1.0))
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
            self.parent.setdefault(min(ra, rb), min(ra, rb))
            self.similarity.pop(max(ra, rb), None)
        self.similarity[min(ra, rb)] = low

    def exact_report(self, top: int) -> dict:
        per_source: Counter = Counter()
        groups = []
        for group in self.groups.values():
            copies = sum(group["documents"].values())
            for source, count in group["documents"].items():
                per_source[self.names[source]] += count
            groups.append({"copies": copies, "documents": {self.names[k]: v for k, v in group["documents"].items()},
                           "first": group["first"], "example": group["example"]})
        groups.sort(key=lambda g: (-g["copies"], g["first"]))
        return {"groups": len(groups), "documents": sum(g["copies"] for g in groups),
                "redundant_documents": sum(g["copies"] - 1 for g in groups),
                "documents_per_source": dict(per_source), "top": groups[:top]}

    def near_report(self, top: int) -> dict:
        clusters: dict[int, list[int]] = {}
        for doc in self.parent:
            clusters.setdefault(self._root(doc), []).append(doc)
        rows, per_source = [], Counter()
        mask = (1 << 40) - 1
        for root, members in clusters.items():
            members.sort()
            counts = Counter(self.names[self.where[m] >> 40] for m in members)
            per_source.update(counts)
            example = next((self.snippets[m] for m in members if m in self.snippets), "")
            rows.append({"size": len(members), "documents": dict(counts),
                         "min_similarity": round(self.similarity.get(root, 1.0), 3),
                         "members": [[self.names[self.where[m] >> 40], self.where[m] & mask]
                                     for m in members[:_MAX_CLUSTER_MEMBERS]],
                         "example": example})
        rows.sort(key=lambda r: (-r["size"], r["members"][0]))
        s = self.settings
        return {"threshold": s.near_dup_threshold, "num_perm": s.num_perm, "shingle_words": s.shingle_words,
                "clusters": len(rows), "documents": sum(r["size"] for r in rows),
                "documents_per_source": dict(per_source),
                "indexed_documents": len(self.where), "too_short_documents": self.too_short, "top": rows[:top]}
