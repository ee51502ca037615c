"""SFT batches (gptlab.chat.loader), checked against each conversation run alone through a real tiny GPT."""

import json
import random

import pytest
import torch
import torch.nn.functional as F

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.chat.data import Mixture
from gptlab.chat.loader import IGNORE, ConversationLoader, ConversationLoaderConfig
from gptlab.runtime import GptlabError
from gptlab.tokenizer import Tokenizer

WORDS = "the king is dead long live queen of night and day what say you my lord none but I".split()


@pytest.fixture(scope="module")
def chat_format(prepared):
    return ChatFormat(add_chat_tokens(Tokenizer.load(prepared / "tokenizer")))


def make_conversations(count: int, seed: int = 0, longest: int = 3) -> list[list[dict]]:
    """Distinct conversations (the first message names its number) of one to three exchanges, some with a system turn;
    with longest=3 every one renders to at most 65 tokens, so none is cut at seq_len 64."""
    rng = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    conversations = []
    for number in range(count):
        messages = [{"role": "system", "content": f"rule {number}"}] if rng.random() < 0.3 else []
        for turn in range(rng.randint(1, 3)):
            question = f"q{number}.{turn} {text(rng.randint(1, longest))}"
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": text(rng.randint(1, longest))}]
        conversations.append(messages)
    return conversations


def make_loader(chat_format, conversations, *, epochs=1.0, seed=0, **options) -> ConversationLoader:
    rank, world_size = options.pop("rank", 0), options.pop("world_size", 1)
    config = ConversationLoaderConfig(**{"batch_size": 3, "seq_len": 64, **options})
    return ConversationLoader(Mixture.of(conversations, epochs=epochs, seed=seed), chat_format, config=config, rank=rank, world_size=world_size)


def segments(batch) -> list[tuple[int, int, int]]:
    """(row, start, end) of every conversation in a batch: pack mode's positions restart at 0; in pad mode a row is one
    conversation, ending after the token whose target is its last (an assistant <|end|> closes every conversation)."""
    x, y = batch[0], batch[1]
    if len(batch) == 2:
        return [(row, 0, int((y[row] != IGNORE).nonzero().max()) + 1) for row in range(len(x))]
    found = []
    for row, positions in enumerate(batch[2]["positions"]):
        starts = (positions == 0).nonzero().flatten().tolist() + [len(positions)]
        found += [(row, start, end) for start, end in zip(starts, starts[1:])]
    return found


def identify(chat_format, conversations, x_segment: list[int]) -> int | None:
    """The conversation whose rendering this segment of x holds (all of it, or all but the last token), None for padding."""
    for number, messages in enumerate(conversations):
        ids = chat_format.render(messages).ids
        if ids[: len(x_segment)] == x_segment and len(ids) - len(x_segment) in (0, 1):
            return number
    assert set(x_segment) == {chat_format.bos}, f"segment {x_segment} is neither a conversation nor padding"
    return None


def alone_loss(model, chat_format, messages) -> tuple[float, int]:
    """Summed cross-entropy over the assistant tokens of one conversation run by itself, unpadded; and their count."""
    rendered = chat_format.render(messages)
    ids, mask = torch.tensor(rendered.ids), torch.tensor(rendered.mask, dtype=torch.bool)
    targets = torch.where(mask[1:], ids[1:], IGNORE)
    logits, _ = model(ids[None, :-1])
    return F.cross_entropy(logits[0], targets, ignore_index=IGNORE, reduction="sum").item(), int(mask[1:].sum())


def batch_token_losses(model, batch) -> torch.Tensor:
    """Per-token cross-entropy (B, T) of a pad or pack batch, 0 where the target is ignored."""
    logits, _ = model(batch[0], **(batch[2] if len(batch) == 3 else {}))
    losses = F.cross_entropy(logits.flatten(0, 1), batch[1].flatten(), ignore_index=IGNORE, reduction="none")
    return losses.view(batch[1].shape)


def tiny_model(name: str, chat_format) -> torch.nn.Module:
    from gptlab.model import GPT, preset

    torch.manual_seed(0)
    return GPT(preset(name, vocab_size=chat_format.tokenizer.vocab_size, block_size=64)).eval()


# ---------------------------------------------------------------- losses against conversations alone


@pytest.mark.parametrize("preset_name", ["gpt2-tiny", "llama-tiny"])
def test_conversation_loader_pack_loss_of_each_conversation_equals_its_loss_alone(chat_format, preset_name):
    model = tiny_model(preset_name, chat_format)
    conversations = make_conversations(24, seed=1)
    loader = make_loader(chat_format, conversations, mode="pack", batch_size=2, buffer_size=8, cycle=False)
    seen = []
    with torch.no_grad():
        for batch in loader:
            assert batch[2]["mask"].any(dim=-1).all(), "a query with no key to attend to gives NaN"
            losses = batch_token_losses(model, batch)
            for row, start, end in segments(batch):
                number = identify(chat_format, conversations, batch[0][row, start:end].tolist())
                if number is None:
                    assert (batch[1][row, start:end] == IGNORE).all()
                    continue
                expected, count = alone_loss(model, chat_format, conversations[number])
                assert int((batch[1][row, start:end] != IGNORE).sum()) == count
                assert losses[row, start:end].sum().item() == pytest.approx(expected, rel=1e-4, abs=1e-4)
                seen.append(number)
    assert sorted(seen) == list(range(24))
    assert loader.stats["conversations"] == 24 and loader.stats["dropped"] == loader.stats["truncated"] == 0


def test_conversation_loader_pad_and_pack_give_the_same_loss_sum_and_target_count(chat_format):
    model = tiny_model("gpt2-tiny", chat_format)
    conversations = make_conversations(20, seed=2)
    totals = {}
    with torch.no_grad():
        for mode in ("pad", "pack"):
            loader = make_loader(chat_format, conversations, mode=mode, batch_size=4, cycle=False)
            batches = list(loader)
            loss = sum(batch_token_losses(model, batch).sum().item() for batch in batches)
            targets = sum(int((batch[1] != IGNORE).sum()) for batch in batches)
            assert targets == loader.stats["target_tokens"]
            totals[mode] = (loss, targets, len(batches))
    assert totals["pack"][0] == pytest.approx(totals["pad"][0], rel=1e-5)
    assert totals["pack"][1] == totals["pad"][1]
    assert totals["pack"][2] < totals["pad"][2]  # packing fills rows: fewer batches


def test_conversation_loader_targets_exactly_the_assistant_tokens(chat_format):
    conversations = make_conversations(10, seed=3)
    loader = make_loader(chat_format, conversations, mode="pad", batch_size=10, cycle=False)
    x, y = loader.next_batch()
    encode = chat_format.tokenizer.encode_ordinary
    for row in range(10):
        valid = (y[row] != IGNORE).nonzero().flatten()
        number = identify(chat_format, conversations, x[row, : int(valid.max()) + 2].tolist())
        expected = [t for m in conversations[number] if m["role"] == "assistant" for t in [*encode(m["content"]), chat_format.end]]
        assert y[row, valid].tolist() == expected
        shifted = x[row, valid[valid + 1 < x.shape[1]] + 1]
        assert shifted.tolist() == expected[: len(shifted)]  # each target is the next token of the row
    with pytest.raises(StopIteration):
        loader.next_batch()


# ---------------------------------------------------------------- long conversations


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_conversation_loader_cuts_at_the_last_assistant_turn_that_fits_and_drops_the_rest(chat_format, mode):
    long_text = " ".join(WORDS * 4)
    fits_once = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": long_text},
        {"role": "assistant", "content": "ok"},
    ]
    never_fits = [{"role": "user", "content": long_text}, {"role": "assistant", "content": "ok"}]
    short = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    seq_len = 24
    assert len(chat_format.render(never_fits).ids) > seq_len + 1
    loader = make_loader(chat_format, [fits_once, never_fits, short], mode=mode, seq_len=seq_len, batch_size=4, cycle=False)
    rows = [batch[0][row, start:end].tolist() for batch in loader for row, start, end in segments(batch)]
    cut = chat_format.render(fits_once[:2]).ids
    assert cut[:-1] in [row[: len(cut) - 1] for row in rows]
    assert loader.stats["conversations"] == 2
    assert loader.stats["truncated"] == 1 and loader.stats["dropped"] == 1
    assert loader.stats["tokens"] == len(cut) + len(chat_format.render(short).ids)


def test_conversation_loader_refuses_when_no_conversation_fits(chat_format):
    never_fits = [{"role": "user", "content": " ".join(WORDS * 4)}, {"role": "assistant", "content": "ok"}]
    loader = make_loader(chat_format, [never_fits] * 3, seq_len=16)
    with pytest.raises(GptlabError, match="fits seq_len 16"):
        loader.next_batch()


# ---------------------------------------------------------------- epochs, resume, ranks


@pytest.mark.parametrize("mode", ["pad", "pack"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_conversation_loader_resumed_from_state_serves_the_batches_of_an_uninterrupted_run(chat_format, mode, world_size):
    conversations = make_conversations(11, seed=4)
    options = {"mode": mode, "batch_size": 3, "buffer_size": 5, "world_size": world_size, "rank": world_size - 1}
    running = make_loader(chat_format, conversations, epochs=1.5, seed=7, **options)
    for _ in range(4):
        running.next_batch()
    state = json.loads(json.dumps(running.state_dict()))
    resumed = make_loader(chat_format, conversations, epochs=1.5, seed=7, **options)
    resumed.load_state_dict(state)
    for _ in range(6):  # across more than one epoch
        expected, got = running.next_batch(), resumed.next_batch()
        assert len(expected) == len(got)
        for a, b in zip(expected[:2], got[:2]):
            assert torch.equal(a, b)
        if mode == "pack":
            assert all(torch.equal(expected[2][key], got[2][key]) for key in ("positions", "mask"))
    assert running.stats == resumed.stats and running.epoch == resumed.epoch >= 1
    fresh = make_loader(chat_format, conversations, epochs=1.5, seed=7, **options)
    running.reset()
    assert torch.equal(running.next_batch()[0], fresh.next_batch()[0])


def test_conversation_loader_refuses_state_from_a_different_loader(chat_format):
    conversations = make_conversations(6)
    state = make_loader(chat_format, conversations, mode="pad").state_dict()
    with pytest.raises(GptlabError, match="mode 'pad' \\(this loader: 'pack'\\)"):
        make_loader(chat_format, conversations, mode="pack").load_state_dict(state)


def test_conversation_loader_cycles_epochs_reshuffled_each_seeing_every_conversation_once(chat_format):
    conversations = make_conversations(12, seed=5)
    loader = make_loader(chat_format, conversations, mode="pad", batch_size=4)
    epochs = []
    for _ in range(2):
        batches = [loader.next_batch() for _ in range(3)]
        epochs.append([identify(chat_format, conversations, b[0][row, start:end].tolist()) for b in batches for row, start, end in segments(b)])
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(12))
    assert epochs[0] != epochs[1]


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_conversation_loader_ranks_read_disjoint_conversations_that_cover_the_epoch(chat_format, mode):
    conversations = make_conversations(17, seed=6)
    per_rank = []
    for rank in range(3):
        loader = make_loader(chat_format, conversations, mode=mode, rank=rank, world_size=3, cycle=False)
        found = set()
        for batch in loader:
            for row, start, end in segments(batch):
                number = identify(chat_format, conversations, batch[0][row, start:end].tolist())
                if number is not None:
                    found.add(number)
        per_rank.append(found)
    assert sum(len(found) for found in per_rank) == 17
    assert set().union(*per_rank) == set(range(17))
