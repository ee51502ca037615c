"""The shard loader against plain numpy slicing of the same shards, and against an uninterrupted run.

Token ids in the fixture are their position in the whole split (no id repeats),
so a value says which shard and offset a window came from.
"""

import json

import numpy as np
import pytest
import torch

from gptlab import GptlabError
from gptlab.data.loader import LoaderConfig, ShardLoader
from gptlab.data.shards import MANIFEST_FORMAT, MANIFEST_NAME, VERSION, open_shard, write_shard

FINGERPRINT = "0123456789abcdef"
OTHER_FINGERPRINT = "fedcba9876543210"
TRAIN_LENGTHS = (100, 5, 70, 50)  # the 5-token shard holds no window of T+1 = 9, nor a sequential round
B, T = 2, 8


def write_prepared(directory, splits, *, fingerprint=FINGERPRINT, shard_fingerprints=None):
    """A prepared directory: shards of position ids per split, and a manifest like `gptlab data prepare` writes."""
    directory.mkdir(parents=True, exist_ok=True)
    shards, entries, start = {}, {}, 0
    for split, lengths in splits.items():
        shards[split], entries[split] = [], []
        for index, length in enumerate(lengths):
            tokens = (np.arange(start, start + length) % 65536).astype(np.uint16)
            start += length
            name = f"{split}_{index:06d}.bin"
            stamp = (shard_fingerprints or {}).get(name, fingerprint)
            write_shard(directory / name, tokens, n_documents=1, fingerprint=stamp)
            shards[split].append(tokens)
            entries[split].append({"file": name, "tokens": length, "documents": 1})
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": VERSION,
        "tokenizer": {"fingerprint": fingerprint, "vocab_size": 65536, "eot_id": 0},
        "dtype": "uint16",
        "splits": {
            split: {"tokens": sum(e["tokens"] for e in listed), "documents": len(listed), "shards": listed}
            for split, listed in entries.items()
        },
    }
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))
    return shards


@pytest.fixture
def prepared(tmp_path):
    directory = tmp_path / "prepared"
    shards = write_prepared(directory, {"train": TRAIN_LENGTHS, "val": (40,)})
    return directory, shards["train"]


def make_loader(directory, mode="sequential", seed=0, batch_size=B, **kwargs):
    return ShardLoader(directory, config=LoaderConfig(batch_size=batch_size, seq_len=T, mode=mode, seed=seed), **kwargs)


def take(loader, n):
    return [loader.next_batch() for _ in range(n)]


def sequential_windows(shards, batch_size, seq_len, world_size):
    """One epoch of windows (B·T + 1 tokens), round by round and rank by rank, each round inside one shard."""
    size = batch_size * seq_len
    windows = []
    for tokens in shards:
        round_index = 0
        while (round_index + 1) * world_size * size + 1 <= len(tokens):
            for rank in range(world_size):
                start = (round_index * world_size + rank) * size
                windows.append(tokens[start : start + size + 1])
            round_index += 1
    return windows


def assert_batches_equal(left, right):
    assert len(left) == len(right)
    for (x1, y1), (x2, y2) in zip(left, right):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


# ---------------------------------------------------------------- sequential


def test_loader_sequential_batches_are_the_shards_in_order_and_wrap_around(prepared):
    directory, shards = prepared
    windows = sequential_windows(shards, B, T, 1)
    assert len(windows) == 6 + 0 + 4 + 3
    loader = make_loader(directory)
    expected = (windows * 3)[: 2 * len(windows) + 3]
    for index, window in enumerate(expected):
        x, y = loader.next_batch()
        assert x.dtype == torch.int64 and y.dtype == torch.int64
        assert x.shape == (B, T) and y.shape == (B, T)
        assert np.array_equal(x.numpy(), window[:-1].reshape(B, T).astype(np.int64)), index
        assert np.array_equal(y.numpy(), window[1:].reshape(B, T).astype(np.int64)), index
    assert loader.epoch == 2
    assert loader.step == len(expected)


def test_loader_sequential_targets_are_inputs_shifted_by_one(prepared):
    directory, _ = prepared
    for x, y in take(make_loader(directory), 8):
        flat_x, flat_y = x.flatten(), y.flatten()
        assert torch.equal(flat_y[:-1], flat_x[1:])


def test_loader_sequential_ranks_interleave_into_the_single_stream(prepared):
    directory, shards = prepared
    per_rank = len(sequential_windows(shards, B, T, 2)) // 2
    n = 2 * per_rank + 1  # two epochs and a bit
    rank0 = take(make_loader(directory, rank=0, world_size=2), n)
    rank1 = take(make_loader(directory, rank=1, world_size=2), n)
    interleaved = [batch for pair in zip(rank0, rank1) for batch in pair]
    windows = sequential_windows(shards, B, T, 2) * 3
    for (x, y), window in zip(interleaved, windows):
        assert np.array_equal(x.numpy(), window[:-1].reshape(B, T))
        assert np.array_equal(y.numpy(), window[1:].reshape(B, T))
    # one rank with twice the batch reads the same tokens: its rows are rank 0's, then rank 1's
    single = take(make_loader(directory, batch_size=2 * B), n)
    for (x0, y0), (x1, y1), (x, y) in zip(rank0, rank1, single):
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)


def test_loader_sequential_ranks_never_read_the_same_window(prepared):
    directory, shards = prepared
    per_epoch = len(sequential_windows(shards, B, T, 2)) // 2
    firsts = [
        {int(x[0, 0]) for x, _ in take(make_loader(directory, rank=rank, world_size=2), per_epoch)} for rank in (0, 1)
    ]
    assert len(firsts[0]) == len(firsts[1]) == per_epoch
    assert not firsts[0] & firsts[1]


def test_loader_tokens_per_batch_is_batch_times_sequence(prepared):
    directory, _ = prepared
    assert make_loader(directory).tokens_per_batch == B * T


# ---------------------------------------------------------------- random


def test_loader_random_windows_are_contiguous_slices_of_a_shard(prepared):
    directory, shards = prepared
    where = {int(token): (index, offset) for index, tokens in enumerate(shards) for offset, token in enumerate(tokens)}
    used = set()
    for x, y in take(make_loader(directory, mode="random", seed=3), 100):
        assert x.dtype == torch.int64 and x.shape == (B, T) and y.shape == (B, T)
        for row_x, row_y in zip(x.numpy(), y.numpy()):
            index, offset = where[int(row_x[0])]
            window = shards[index][offset : offset + T + 1]
            assert len(window) == T + 1
            assert np.array_equal(row_x, window[:-1]) and np.array_equal(row_y, window[1:])
            used.add(index)
    assert used == {0, 2, 3}  # every shard that holds a window, never the 5-token one


def test_loader_random_is_reproducible_with_the_same_seed(prepared):
    directory, _ = prepared
    first = take(make_loader(directory, mode="random", seed=7), 5)
    assert_batches_equal(first, take(make_loader(directory, mode="random", seed=7), 5))


def test_loader_random_differs_with_another_seed(prepared):
    directory, _ = prepared
    first = torch.stack([x for x, _ in take(make_loader(directory, mode="random", seed=7), 5)])
    second = torch.stack([x for x, _ in take(make_loader(directory, mode="random", seed=8), 5)])
    assert not torch.equal(first, second)


def test_loader_random_differs_across_ranks(prepared):
    directory, _ = prepared
    loaders = [make_loader(directory, mode="random", rank=rank, world_size=2) for rank in (0, 1)]
    ranks = [torch.stack([x for x, _ in take(loader, 5)]) for loader in loaders]
    assert not torch.equal(ranks[0], ranks[1])


# ---------------------------------------------------------------- resume


@pytest.mark.parametrize(
    ("mode", "rank", "world_size", "before", "after"),
    [("sequential", 0, 1, 11, 10), ("sequential", 1, 2, 5, 9), ("random", 0, 1, 4, 6), ("random", 1, 2, 3, 5)],
)
def test_loader_resumes_exactly_from_a_json_state(prepared, mode, rank, world_size, before, after):
    directory, _ = prepared
    original = make_loader(directory, mode=mode, seed=5, rank=rank, world_size=world_size)
    take(original, before)
    state = json.loads(json.dumps(original.state_dict()))
    expected = take(original, after)
    resumed = make_loader(directory, mode=mode, seed=5, rank=rank, world_size=world_size)
    resumed.load_state_dict(state)
    assert_batches_equal(take(resumed, after), expected)
    assert resumed.state_dict() == original.state_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mode": "random"}, "mode"),
        ({"seed": 1}, "seed"),
        ({"rank": 1, "world_size": 2}, "rank"),
        ({"world_size": 2}, "world_size"),
    ],
)
def test_loader_load_state_rejects_a_state_from_a_different_loader(prepared, change, message):
    directory, _ = prepared
    settings = {"mode": "sequential", "seed": 0, "rank": 0, "world_size": 1}
    source = make_loader(directory, **{**settings, **change})
    take(source, 2)
    with pytest.raises(GptlabError, match=message):
        make_loader(directory, **settings).load_state_dict(source.state_dict())


def test_loader_load_state_rejects_a_position_that_is_not_a_batch_start(prepared):
    directory, _ = prepared
    loader = make_loader(directory)
    state = {**loader.state_dict(), "position": 3}
    with pytest.raises(GptlabError, match="position 3"):
        loader.load_state_dict(state)


# ---------------------------------------------------------------- errors


def test_loader_rejects_a_fingerprint_that_differs_from_the_manifest(prepared):
    directory, _ = prepared
    with pytest.raises(GptlabError, match=f"{FINGERPRINT}.*{OTHER_FINGERPRINT}"):
        make_loader(directory, fingerprint=OTHER_FINGERPRINT)


def test_loader_accepts_the_matching_fingerprint(prepared):
    directory, _ = prepared
    make_loader(directory, fingerprint=FINGERPRINT).next_batch()


def test_loader_rejects_a_shard_with_another_tokenizer(tmp_path):
    write_prepared(tmp_path, {"train": (100, 100)}, shard_fingerprints={"train_000001.bin": OTHER_FINGERPRINT})
    with pytest.raises(GptlabError, match=f"train_000001.bin.*{OTHER_FINGERPRINT}.*{FINGERPRINT}"):
        make_loader(tmp_path)


def test_loader_rejects_an_empty_split(tmp_path):
    write_prepared(tmp_path, {"train": (100,), "val": ()})
    with pytest.raises(GptlabError, match="'val' split .* is empty"):
        ShardLoader(tmp_path, "val", config=LoaderConfig(batch_size=B, seq_len=T))


def test_loader_rejects_a_missing_split(prepared):
    directory, _ = prepared
    with pytest.raises(GptlabError, match="no 'test' split"):
        ShardLoader(directory, "test", config=LoaderConfig(batch_size=B, seq_len=T))


def test_loader_rejects_a_missing_directory(tmp_path):
    with pytest.raises(GptlabError, match="no prepared data"):
        make_loader(tmp_path / "nowhere")


@pytest.mark.parametrize("offset", [64, 64 + 2 * 37 + 1, -1])  # the first token, one inside, the last byte
def test_loader_refuses_a_shard_with_a_flipped_token_byte_and_says_how_to_repair(prepared, offset):
    directory, _ = prepared
    path = directory / "train_000002.bin"
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(GptlabError, match=r"train_000002.bin is damaged: .*CRC-32.*rerun the `gptlab data prepare` command"):
        make_loader(directory)


def test_loader_detects_a_truncated_shard(prepared):
    directory, _ = prepared
    path = directory / "train_000002.bin"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(GptlabError, match="truncated"):
        make_loader(directory)


def test_loader_sequential_rejects_a_split_smaller_than_one_batch(prepared):
    directory, _ = prepared
    with pytest.raises(GptlabError, match=r"holds 40 tokens.*batch_size 5 × seq_len 8 \+ 1 = 41"):
        ShardLoader(directory, "val", config=LoaderConfig(batch_size=5, seq_len=8))


def test_loader_random_serves_a_split_smaller_than_one_batch_with_overlapping_windows(prepared):
    directory, _ = prepared
    loader = ShardLoader(directory, "val", config=LoaderConfig(batch_size=5, seq_len=8, mode="random", seed=1))
    tokens = np.asarray(open_shard(directory / "val_000000.bin")[1])  # 40 position ids: a value says its offset
    for x, y in take(loader, 20):
        for row_x, row_y in zip(x.numpy(), y.numpy()):
            offset = int(row_x[0]) - int(tokens[0])
            assert 0 <= offset <= len(tokens) - 9
            assert np.array_equal(row_x, tokens[offset : offset + 8]) and np.array_equal(row_y, tokens[offset + 1 : offset + 9])


def test_loader_random_rejects_a_split_without_one_window(tmp_path):
    write_prepared(tmp_path, {"train": (8, 5)})
    with pytest.raises(GptlabError, match=r"a window needs seq_len 8 \+ 1 = 9 tokens .* holds 8"):
        make_loader(tmp_path, mode="random")


def test_loader_rejects_sequential_batches_larger_than_every_shard(prepared):
    directory, _ = prepared
    make_loader(directory, batch_size=7)  # one rank needs 7 × 8 + 1 = 57 tokens: the 100-token shard holds them
    with pytest.raises(GptlabError, match="113 tokens, but the largest shard .* holds 100"):
        make_loader(directory, batch_size=7, world_size=2)


@pytest.mark.parametrize(
    "settings",
    [{"batch_size": 0, "seq_len": 8}, {"batch_size": 2, "seq_len": 0}, {"batch_size": 2, "seq_len": 8, "mode": "shuffle"}],
)
def test_loader_config_rejects_bad_values(settings):
    with pytest.raises(GptlabError):
        LoaderConfig(**settings)


def test_loader_rejects_a_rank_outside_the_world(prepared):
    directory, _ = prepared
    with pytest.raises(GptlabError, match="rank=2 world_size=2"):
        make_loader(directory, rank=2, world_size=2)


# ---------------------------------------------------------------- device


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_loader_cuda_batches_equal_the_cpu_batches(prepared):
    directory, _ = prepared
    on_gpu = take(make_loader(directory, device="cuda"), 5)
    assert all(x.is_cuda and y.is_cuda for x, y in on_gpu)
    assert_batches_equal([(x.cpu(), y.cpu()) for x, y in on_gpu], take(make_loader(directory), 5))


# ---------------------------------------------------------------- smaller batches


@pytest.mark.parametrize(("mode", "rank", "world_size"), [("sequential", 0, 1), ("sequential", 1, 2), ("random", 1, 2)])
def test_loader_rebatch_continues_as_a_loader_that_always_served_the_smaller_batches(tmp_path, mode, rank, world_size):
    """Batches of 2 after 2 batches of 4 == batches of 2 after 4 of 2: what the Trainer's OOM backoff relies on.
    (One long shard: no shard end in between, where a smaller round could fit in a tail a larger one skipped.)"""
    directory = tmp_path / "long"
    write_prepared(directory, {"train": (1000,)})
    settings = {"mode": mode, "seed": 3, "rank": rank, "world_size": world_size}
    always_small = make_loader(directory, batch_size=2, **settings)
    take(always_small, 4)
    shrunk = make_loader(directory, batch_size=4, **settings)
    take(shrunk, 2)
    shrunk.rebatch(2)
    assert shrunk.state_dict() == always_small.state_dict()
    assert_batches_equal(take(shrunk, 3), take(always_small, 3))


def test_loader_rebatch_splits_the_batch_it_would_have_served(prepared):
    """Sequential, one rank: the next batch of 4 is the next two batches of 2, row for row."""
    directory, _ = prepared
    large = make_loader(directory, batch_size=4)
    take(large, 1)
    split = make_loader(directory, batch_size=4)
    take(split, 1)
    split.rebatch(2)
    (x, y), = take(large, 1)
    (x1, y1), (x2, y2) = take(split, 2)
    assert torch.equal(torch.cat([x1, x2]), x) and torch.equal(torch.cat([y1, y2]), y)


def test_loader_rebatch_refuses_a_size_that_does_not_divide_the_batch(prepared):
    directory, _ = prepared
    loader = make_loader(directory, batch_size=4)
    with pytest.raises(GptlabError, match="a divisor of 4, not 3"):
        loader.rebatch(3)
