import numpy as np
import pytest
import torch

from burnout.config import DataConfig, TokenizerConfig
from burnout.data.loader import Prefetcher, TokenLoader, check_compatible
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
    loader = TokenLoader(data_dir, "val", B, T, seed=0)
    with pytest.raises(BurnoutError, match=rf"val split has {loader.num_tokens} tokens.*needs at least"):
        TokenLoader(data_dir, "val", B, loader.num_tokens, seed=0)


def test_check_compatible(data_dir):
    meta = TokenLoader(data_dir, "train", B, T, seed=0).meta
    check_compatible(meta, vocab_size=300, seq_len=T)
    with pytest.raises(BurnoutError, match="model.vocab_size.*300 tokens.*at least 300"):
        check_compatible(meta, vocab_size=256)
    with pytest.raises(BurnoutError, match="batch larger than the data"):
        check_compatible(meta, vocab_size=300, seq_len=10**7)


def test_unknown_split_or_mode(data_dir):
    with pytest.raises(BurnoutError, match="no split 'test'"):
        TokenLoader(data_dir, "test", B, T, seed=0)
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
