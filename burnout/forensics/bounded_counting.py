"""Counting in bounded memory: a source of any size is counted in tables that never pass their capacity.

Per source, the term and word-pair tables hold at most `capacity` keys, the line and paragraph tables
`capacity` / 4: when one grows past it, every count drops by one and keys at zero go, until half remain
(Misra-Gries in batches). A round removes at least capacity/2 counts, so a count is short by at most
2 x (the table's document-key incidences) / capacity, `count_error_bound` in the report (0: nothing was
dropped, counts are exact), and a key in more documents than that is never dropped. Word pairs, lines and
paragraphs enter their table only when met in a second document: a Bloom filter (`filter_bits`, 32 MB a
source, freed when it ends) remembers the first sighting, so the singletons that are most of them cost
nothing, and a false positive counts one document too many. A finished source keeps only keys in
`min_docs` documents or more.
"""

from __future__ import annotations

import heapq
import itertools
import zlib
from array import array
from collections import Counter
from collections.abc import Callable

import numpy as np


class CountTable:
    """key -> [documents, occurrences, runs, hosts] for at most `capacity` keys.

    When the table passes `capacity`, every count drops by one and keys at zero are removed, until half
    remain (Misra-Gries in batches): `floor` counts these rounds, the most any count is short by.
    """

    def __init__(self, capacity: int) -> None:
        self.items: dict = {}
        self.capacity = capacity
        self.floor = 0
        self.full: set = set()  # keys whose hosts are all kept

    def add(self, docs: Counter, occurrences: Counter | None = None, runs: Counter | None = None,
            seen_before: set = frozenset(), hosts: dict | None = None, max_hosts: int = 0) -> None:
        """Merge one block: `docs` (key → documents of the block holding it), `occurrences`, `runs`
        (runs starting in the block). A key in `seen_before` has one earlier document not counted yet.
        `hosts` (key → document numbers) are kept, up to `max_hosts` per key."""
        items = self.items
        for key, d in docs.items():
            entry = items.get(key)
            if entry is None:
                b = 1 if key in seen_before else 0
                entry = items[key] = [d + b, (occurrences[key] if occurrences is not None else d) + b,
                                      (runs[key] if runs is not None else d) + b, None]
            else:
                entry[0] += d
                entry[1] += occurrences[key] if occurrences is not None else d
                entry[2] += runs[key] if runs is not None else d
            if hosts is not None and key in hosts:
                kept = entry[3]
                if kept is None:
                    kept = entry[3] = array("I")
                kept.extend(hosts[key][: max_hosts - len(kept)])
                if len(kept) >= max_hosts:
                    self.full.add(key)
        if len(items) > self.capacity:
            self._prune()

    def _prune(self) -> None:
        items = self.items
        while len(items) > self.capacity // 2:
            self.floor += 1
            dead = []
            for key, entry in items.items():
                entry[0] -= 1
                entry[1] -= 1
                if entry[0] <= 0:
                    dead.append(key)
            for key in dead:
                del items[key]
                self.full.discard(key)

    def keep(self, wanted: Callable[[object, list], bool]) -> None:
        """Drop the keys for which wanted(key, entry) is false (a finished source keeps its candidates)."""
        self.items = {k: e for k, e in self.items.items() if wanted(k, e)}
        self.full = set()


class SeenFilter:
    """A Bloom filter (two hashes: crc32 and adler32 of the UTF-8 bytes) over `bits` bits: which keys were
    seen before. Keys seen in one document only never enter the phrase table, which most word pairs
    are; a false positive (rate about (1 - exp(-2 n / bits))^2 after n distinct keys: 0.5% at 10M keys
    in the default 2^28 bits, 32 MB) counts one document too many for a key."""

    def __init__(self, bits: int = 1 << 28) -> None:
        self.mask = bits - 1
        self.bits = np.zeros(bits // 8, dtype=np.uint8)

    def check_and_add(self, keys: list[str]) -> np.ndarray:
        """For each key, whether it was (probably) added before; then adds them all."""
        if not keys:
            return np.zeros(0, dtype=bool)
        raw = list(map(str.encode, keys, itertools.repeat("utf-8"), itertools.repeat("surrogatepass")))
        found = np.ones(len(keys), dtype=bool)
        for fn in (zlib.crc32, zlib.adler32):
            h = np.fromiter(map(fn, raw), dtype=np.uint64, count=len(raw))
            h = (h * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(20)  # spread 32 bits over the table
            h &= np.uint64(self.mask)
            byte, bit = (h >> np.uint64(3)).astype(np.int64), (h & np.uint64(7)).astype(np.uint8)
            flag = np.left_shift(np.uint8(1), bit)
            found &= (self.bits[byte] & flag) != 0
            np.bitwise_or.at(self.bits, byte, flag)
        return found


class TopK:
    """The k largest (value, payload) pairs seen; the payload is built only for a pair that gets in."""

    def __init__(self, k: int) -> None:
        self.k, self.heap, self._tie = k, [], 0

    def offer(self, value: float, make: Callable[[], dict]) -> None:
        if len(self.heap) >= self.k and value <= self.heap[0][0]:
            return
        self._tie += 1
        item = (value, self._tie, make())
        if len(self.heap) < self.k:
            heapq.heappush(self.heap, item)
        else:
            heapq.heapreplace(self.heap, item)

    def items(self) -> list[tuple[float, dict]]:
        return [(v, p) for v, _, p in sorted(self.heap, reverse=True)]
