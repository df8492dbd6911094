import threading
import time

import numpy as np
import pytest
import torch

from burnout.config import DataConfig, TokenizerConfig
from burnout.data.loader import Prefetcher, TokenLoader, _ShardedTokens, check_compatible
from burnout.data.prepare import prepare_data
from burnout.data.shards import read_tokens
from burnout.errors import BurnoutError

B, T = 4, 32


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("loader")
    prepare_data(DataConfig(max_chars=50_000, shard_tokens=3_000), TokenizerConfig(kind="bpe", vocab_size=300), out)
    return out


@pytest.fixture(scope="module")
def one_shard_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("loader1")
    prepare_data(DataConfig(max_chars=50_000), TokenizerConfig(kind="bpe", vocab_size=300), out)
    return out


@pytest.mark.slow
def test_fixture_is_sharded(data_dir, one_shard_dir):
    shards = TokenLoader(data_dir, "train", B, T, seed=0).meta["splits"]["train"]["shards"]
    assert len(shards) > 3 and all(s["tokens"] == 3_000 for s in shards[:-1])
    assert len(TokenLoader(one_shard_dir, "train", B, T, seed=0).meta["splits"]["train"]["shards"]) == 1


def test_batches_do_not_depend_on_sharding(data_dir, one_shard_dir):
    assert np.array_equal(read_tokens(data_dir, "train"), read_tokens(one_shard_dir, "train"))
    for mode in ("mmap", "preload"):
        sharded = TokenLoader(data_dir, "train", B, T, seed=0, mode=mode)
        flat = TokenLoader(one_shard_dir, "train", B, T, seed=0, mode=mode)
        for step in range(20):  # 20 batches of 4 windows over ~10 shards: some cross a boundary
            assert torch.equal(sharded.get_batch(step)[0], flat.get_batch(step)[0])
        assert all(torch.equal(a[0], b[0]) for a, b in zip(sharded.iter_eval_batches(50), flat.iter_eval_batches(50)))


def test_windows_across_a_shard_boundary(data_dir):
    loader = TokenLoader(data_dir, "train", B, T, seed=0)
    tokens = read_tokens(data_dir, "train").astype(np.int64)
    offsets = np.array([3_000 - 5, 0, 6_000 - 1, len(tokens) - T - 1])
    windows = loader.data.windows(offsets, T + 1)
    for row, offset in enumerate(offsets):
        assert np.array_equal(windows[row], tokens[offset : offset + T + 1])


def test_batch_shape_dtype_and_shift(data_dir):
    loader = TokenLoader(data_dir, "train", B, T, seed=0)
    x, y = loader.get_batch(0)
    assert x.shape == y.shape == (B, T)
    assert x.dtype == y.dtype == torch.int64 and x.device.type == "cpu"
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < loader.meta["vocab_size"]
    tokens = read_tokens(data_dir, "train")
    assert loader.num_tokens == len(tokens)


def test_batches_are_a_function_of_seed_step_rank(data_dir):
    loader = TokenLoader(data_dir, "train", B, T, seed=0)
    same = TokenLoader(data_dir, "train", B, T, seed=0)
    assert torch.equal(loader.get_batch(5)[0], same.get_batch(5)[0])
    assert torch.equal(loader.get_batch(5)[0], loader.get_batch(5)[0])
    assert not torch.equal(loader.get_batch(5)[0], loader.get_batch(6)[0])
    other_rank = TokenLoader(data_dir, "train", B, T, seed=0, rank=1, world_size=2)
    assert not torch.equal(loader.get_batch(5)[0], other_rank.get_batch(5)[0])
    other_seed = TokenLoader(data_dir, "train", B, T, seed=1)
    assert not torch.equal(loader.get_batch(5)[0], other_seed.get_batch(5)[0])


def test_mmap_and_preload_agree(data_dir):
    mapped = TokenLoader(data_dir, "train", B, T, seed=3, mode="mmap")
    loaded = TokenLoader(data_dir, "train", B, T, seed=3, mode="preload")
    for step in range(5):
        for a, b in zip(mapped.get_batch(step), loaded.get_batch(step)):
            assert torch.equal(a, b)


@pytest.mark.slow
def test_the_shards_are_opened_read_only_and_preloaded_as_one_array(data_dir, one_shard_dir, tmp_path):
    mapped = TokenLoader(data_dir, "train", B, T, seed=3, mode="mmap")
    assert len(mapped.data.parts) > 3
    for part in mapped.data.parts:  # training can never write into the prepared data
        with pytest.raises(ValueError, match="read-only"):
            part[0] = 1
    half = len(read_tokens(one_shard_dir, "train")) // 2 + 1
    prepare_data(DataConfig(max_chars=50_000, shard_tokens=half), TokenizerConfig(kind="bpe", vocab_size=300), tmp_path)
    for directory, shards in ((data_dir, len(mapped.data.parts)), (tmp_path, 2)):
        loaded = TokenLoader(directory, "train", B, T, seed=3, mode="preload")
        assert len(loaded.meta["splits"]["train"]["shards"]) == shards
        # Batches gather from one array, with no shard lookup.
        assert len(loaded.data.parts) == 1 and not isinstance(loaded.data.parts[0], np.memmap)


def test_eval_batches_walk_the_split_without_overlap(data_dir):
    loader = TokenLoader(data_dir, "val", B, T, seed=0)
    tokens = torch.from_numpy(read_tokens(data_dir, "val").astype(np.int64))
    batches = list(loader.iter_eval_batches(2))
    assert len(batches) == 2
    x = torch.cat([b[0] for b in batches]).flatten()
    assert torch.equal(x, tokens[: 2 * B * T])
    assert list(loader.iter_eval_batches(2))[1][1].equal(batches[1][1])


def test_eval_batches_stop_when_the_split_runs_out(data_dir):
    loader = TokenLoader(data_dir, "val", B, T, seed=0)
    windows = (loader.num_tokens - 1) // T
    batches = list(loader.iter_eval_batches(10**6))
    assert sum(len(x) for x, _ in batches) == windows
    ranks = [list(TokenLoader(data_dir, "val", B, T, seed=0, rank=r, world_size=2).iter_eval_batches(10**6))
             for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    assert not torch.equal(ranks[0][0][0], ranks[1][0][0])


def test_refuses_split_shorter_than_a_window(data_dir):
    n = TokenLoader(data_dir, "val", B, T, seed=0).num_tokens
    TokenLoader(data_dir, "val", B, n - 1, seed=0)  # x and y of one window: n tokens, just enough
    with pytest.raises(BurnoutError) as refused:
        TokenLoader(data_dir, "val", B, n, seed=0)
    assert str(refused.value) == (f"batch larger than the data: the val split has {n} tokens but seq_len={n} needs "
                                  f"at least {n + 1}; lower train.seq_len or prepare more data (raise data.max_chars)")


def test_check_compatible(data_dir):
    meta = TokenLoader(data_dir, "train", B, T, seed=0).meta
    check_compatible(meta, vocab_size=300, seq_len=T)
    with pytest.raises(BurnoutError, match="model.vocab_size.*300 tokens.*at least 300"):
        check_compatible(meta, vocab_size=256)
    with pytest.raises(BurnoutError, match="batch larger than the data"):
        check_compatible(meta, vocab_size=300, seq_len=10**7)


def test_unknown_split_or_mode_or_rank(data_dir):
    with pytest.raises(BurnoutError) as refused:
        TokenLoader(data_dir, "test", B, T, seed=0)
    assert str(refused.value) == f"loader: '{data_dir}' has no split 'test'; it has train, val"
    for rank, world_size in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(BurnoutError) as refused:
            TokenLoader(data_dir, "train", B, T, seed=0, rank=rank, world_size=world_size)
        assert str(refused.value) == f"loader: rank {rank} is outside [0, world_size={world_size})"
    TokenLoader(data_dir, "train", B, T, seed=0, rank=1, world_size=2)
    with pytest.raises(BurnoutError, match="mode 'gpu'"):
        TokenLoader(data_dir, "train", B, T, seed=0, mode="gpu")


def test_the_prefetcher_reads_ahead_exactly_the_batches_the_train_step_asks_for(tiny_bpe_data):
    from burnout.train.distributed import DistContext
    from burnout.train.step import batch_index, batch_indices

    loader = TokenLoader(tiny_bpe_data, "train", batch_size=4, seq_len=32, seed=5)
    rank = DistContext(rank=1, world_size=2)  # rank 1 of 2, accumulating 3: resumed at step 4
    prefetcher = Prefetcher(loader, batch_indices(4, 3, rank))
    try:
        for step in range(4, 7):
            for micro in range(3):
                index = batch_index(step, micro, 3, rank)
                x, y = prefetcher.get_batch(index)
                expected_x, expected_y = loader.get_batch(index)
                assert torch.equal(x, expected_x) and torch.equal(y, expected_y)
        with pytest.raises(RuntimeError, match="order"):
            prefetcher.get_batch(0)
    finally:
        prefetcher.close()


@pytest.mark.parametrize("sizes", [[12], [5, 7], [1, 4, 3, 6]])
def test_every_window_of_one_two_or_many_shards_is_the_concatenation(sizes):
    """Each offset, the first and those at a shard's first token included, and windows of every length."""
    tokens = np.arange(sum(sizes), dtype=np.int64)
    data = _ShardedTokens(np.split(tokens, np.cumsum(sizes)[:-1]))
    assert len(data) == len(tokens)
    for length in range(1, len(tokens) + 1):
        offsets = np.arange(len(tokens) - length + 1)
        assert np.array_equal(data.windows(offsets, length), tokens[offsets[:, None] + np.arange(length)])


def test_training_offsets_reach_both_ends_of_the_split_and_never_past_them(data_dir):
    """With seq_len = N - 3 a window can start at 0, 1 or 2 only: 800 draws find all three and nothing else."""
    tokens = read_tokens(data_dir, "val").astype(np.int64)
    seq_len = len(tokens) - 3
    loader = TokenLoader(data_dir, "val", batch_size=8, seq_len=seq_len, seed=0)
    starts = set()
    for step in range(100):
        x, y = loader.get_batch(step)
        for row in x.numpy():
            starts.update(o for o in range(3) if np.array_equal(row, tokens[o : o + seq_len]))
        assert len(x) == 8
    assert starts == {0, 1, 2}


def test_eval_windows_are_every_whole_window_of_the_split(data_dir):
    """For each seq_len T, window k is tokens[kT : kT + T + 1], for every k whose window fits in the N tokens:
    none cut short, none left out (seq_lens with N = kT + 1 and N = kT - 1 both among those tried)."""
    tokens = read_tokens(data_dir, "val").astype(np.int64)
    n = len(tokens)
    # The smallest seq_len past 2 that divides N - 1, and N + 1, beside the first 200.
    exact = [next(t for t in range(3, m + 1) if m % t == 0) for m in (n - 1, n + 1)]
    seq_lens = sorted({*range(2, 200), *exact})
    assert any((n - 1) % t == 0 for t in seq_lens[1:]) and any((n + 1) % t == 0 for t in seq_lens[1:])
    for seq_len in seq_lens:
        loader = TokenLoader(data_dir, "val", batch_size=B, seq_len=seq_len, seed=0)
        fits = 0
        while (fits + 1) * seq_len + 1 <= n:
            fits += 1
        rows = torch.cat([x for x, _ in loader.iter_eval_batches(10**6)]).numpy()
        assert np.array_equal(rows, tokens[np.arange(fits)[:, None] * seq_len + np.arange(seq_len)])


class _SlowLoader:
    """Stands in for a TokenLoader whose reads take `seconds`, or last until `gate` is set: records each read's index,
    thread and times."""

    def __init__(self, seconds, gate: threading.Event | None = None):
        self.seconds, self.gate, self.reads, self.finished = seconds, gate, [], []

    def get_batch(self, index):
        self.reads.append((index, threading.current_thread().name, time.perf_counter()))
        if self.gate is None:
            time.sleep(self.seconds)
        else:
            self.gate.wait(timeout=30)
        self.finished.append((index, time.perf_counter()))
        return torch.tensor([index]), torch.tensor([index])


def _wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the prefetcher's thread did not get there"
        time.sleep(0.005)


def test_the_prefetcher_reads_two_ahead_one_at_a_time_on_one_named_thread():
    loader = _SlowLoader(0.02)
    prefetcher = Prefetcher(loader, iter(range(100)))
    try:
        _wait_for(lambda: len(loader.finished) == 2)
        time.sleep(0.3)  # time for a third read to start, were one asked for
        assert [index for index, *_ in loader.reads] == [0, 1]  # two ahead, then it waits
        for index in range(6):
            assert prefetcher.get_batch(index)[0].item() == index
        _wait_for(lambda: len(loader.finished) == 8)
        time.sleep(0.3)
        assert [index for index, *_ in loader.reads] == list(range(8))
        assert {name for _, name, _ in loader.reads} == {"batch-prefetch_0"}
        # One at a time: each read starts after the one before it finished.
        assert all(start >= done for (_, _, start), (_, done) in zip(loader.reads[1:], loader.finished))
        with pytest.raises(RuntimeError) as refused:
            prefetcher.get_batch(0)
        assert str(refused.value) == ("prefetcher: batch 0 asked for, 6 read ahead; batches must be asked for in "
                                      "the order of `indices`")
    finally:
        prefetcher.close()


def test_closing_the_prefetcher_waits_for_the_read_under_way_and_drops_the_rest():
    """Read 0 lasts until the test lets it end, so that close() (on a thread of its own) meets it under way and
    read 1 queued, however slow the machine."""
    gate = threading.Event()
    loader = _SlowLoader(None, gate)
    prefetcher = Prefetcher(loader, iter(range(100)))
    _wait_for(lambda: loader.reads)  # read 0 under way, read 1 queued
    closing = threading.Thread(target=prefetcher.close)
    closing.start()
    _wait_for(lambda: prefetcher._ahead[1][1].cancelled())  # read 1 dropped...
    assert closing.is_alive()  # ...and close() waits for read 0
    gate.set()
    closing.join(timeout=30)
    assert not closing.is_alive() and [index for index, _ in loader.finished] == [0]
    time.sleep(0.5)
    assert [index for index, _ in loader.finished] == [0]
