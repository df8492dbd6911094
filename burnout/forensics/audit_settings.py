"""What an audit counts and how much of it it keeps: one dataclass, checked before any document is read."""

from __future__ import annotations

from dataclasses import dataclass

from burnout.errors import BurnoutError


@dataclass
class AuditSettings:
    capacity: int = 300_000          # keys per counting table per source (bounded_counting.py)
    min_docs: int = 3                # a suspicious string occurs in at least this many documents
    max_doc_share: float = 0.25      # ... and in at most this share of its source's documents
    block_docs: int = 32             # documents counted together before merging into the tables
    run_gap_chars: int = 4000        # documents holding a term with less text between them form one run
    hosts: int = 8                   # documents remembered per term, for cohesion
    filter_bits: int = 1 << 28       # the word-pair filter's size (32 MB)
    top: int = 25                    # rows kept per table in the report
    near_dup_threshold: float = 0.8  # estimated Jaccard similarity of word shingles
    num_perm: int = 64
    shingle_words: int = 5
    min_line_chars: int = 20
    outlier_z: float = 5.0
    snippet_chars: int = 160
    max_examples: int = 3

    def validate(self) -> None:
        if not 0.0 < self.near_dup_threshold <= 1.0:
            raise BurnoutError(f"near-duplicate threshold {self.near_dup_threshold} is outside (0, 1]")
        for name in ("capacity", "min_docs", "block_docs", "run_gap_chars", "top", "num_perm", "shingle_words"):
            if getattr(self, name) < 1:
                raise BurnoutError(f"audit setting {name}={getattr(self, name)} must be at least 1")
        if self.capacity < 1000:
            raise BurnoutError(f"audit capacity {self.capacity} is too small; use at least 1000")
        if self.filter_bits < 1 << 16 or self.filter_bits & (self.filter_bits - 1):
            raise BurnoutError(f"audit filter_bits {self.filter_bits} must be a power of two, at least 65536")
