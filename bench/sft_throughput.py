"""Fine-tuning speed: SFT steps (packed and padded conversations) vs pretraining steps, same model, side by side.

    .venv/bin/python bench/sft_throughput.py                  # the demo's model: gpt2 4 layers x 192, block 128
    .venv/bin/python bench/sft_throughput.py --repeats 7

One optimizer step = forward, loss, backward, AdamW, on the same model and batch shape (B x T):

- pretrain: windows of token ids, every position a target (what `gptlab train` feeds the model).
- sft-pack: the built-in tasks' conversations, several per row, each attending only to itself
            (positions restart, a block-diagonal mask), targets on assistant tokens only.
- sft-pad:  one conversation per row, padded to T.

Reported per mode: row tokens/s (B x T per second: the Trainer's tokens/s) and conversation tokens/s
(real tokens, padding excluded: the useful work). Modes are timed in turn, `--repeats` rounds, and
the medians compared; the ratio of SFT to pretraining is the issue's target (within 10%), with a
Mann-Whitney test of the rounds (p: how likely a difference this large is from noise alone).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import header
from scipy.stats import mannwhitneyu

from gptlab.chat import ChatFormat, add_chat_tokens
from gptlab.chat.data import Mixture, MixtureConfig
from gptlab.chat.loader import ConversationLoader, ConversationLoaderConfig
from gptlab.data.corpus import shakespeare_documents
from gptlab.model import GPT, preset
from gptlab.tokenizer import Tokenizer


def step(model: GPT, optimizer: torch.optim.Optimizer, batch: tuple) -> None:
    """One training step, the loss as the Trainer forms it: summed over counted targets, divided by their number."""
    x, y, *extra = batch
    kwargs = extra[0] if extra else {}
    _, loss = model(x, y, loss_reduction="sum", **kwargs)
    counted = (y != -100).sum()
    (loss / counted.clamp(min=1)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def time_steps(model, optimizer, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        step(model, optimizer, batch)
    return time.perf_counter() - start


def conversation_batches(chat: ChatFormat, mode: str, B: int, T: int, n: int) -> tuple[list, int]:
    mixture = Mixture.load(MixtureConfig.from_spec("task:arithmetic[n=4000], task:spelling[n=4000], task:sorting[n=4000]"))
    loader = ConversationLoader(mixture, chat, config=ConversationLoaderConfig(batch_size=B, seq_len=T, mode=mode))
    batches = [loader.next_batch() for _ in range(n)]
    return batches, loader.stats["tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per timing (default 8)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds of every mode (default 7)")
    parser.add_argument("--batch", type=int, default=32, help="rows per step (default 32)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per row (default 128)")
    args = parser.parse_args()
    print(header("SFT throughput vs pretraining (same model, same B x T)", ["torch"]))
    torch.manual_seed(0)
    tokenizer = add_chat_tokens(Tokenizer.train(shakespeare_documents()[:6], vocab_size=4096))
    chat = ChatFormat(tokenizer)
    B, T = args.batch, args.seq_len
    model = GPT(preset("gpt2-mini", vocab_size=tokenizer.vocab_size, n_layer=4, n_head=4, n_embd=192, block_size=T))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 4096, (args.steps, B, T + 1))
    modes = {"pretrain": ([(row[:, :-1], row[:, 1:]) for row in ids], None)}
    for mode in ("pack", "pad"):
        batches, tokens = conversation_batches(chat, mode, B, T, args.steps)
        modes[f"sft-{mode}"] = (batches, tokens)
    step(model, optimizer, modes["pretrain"][0][0])  # warm up
    rows: dict[str, list[float]] = {name: [] for name in modes}
    real: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, (batches, tokens) in modes.items():
            seconds = time_steps(model, optimizer, batches)
            rows[name].append(B * T * len(batches) / seconds)
            real[name].append((tokens if tokens is not None else B * T * len(batches)) / seconds)
    base = statistics.median(rows["pretrain"])
    print(f"model: gpt2 4 layers x 192, vocab {tokenizer.vocab_size}, B={B} T={T}; {args.steps} steps x {args.repeats} rounds (medians)")
    for name in modes:
        r, c = statistics.median(rows[name]), statistics.median(real[name])
        test = "" if name == "pretrain" else f"  p={mannwhitneyu(rows[name], rows['pretrain']).pvalue:.2f} (Mann-Whitney vs pretrain)"
        print(f"{name:9s} row tokens/s {r:8,.0f}  conversation tokens/s {c:8,.0f}  row ratio to pretrain {r / base:5.2f}{test}"
              f"  (rounds: {', '.join(f'{v:,.0f}' for v in rows[name])})")


if __name__ == "__main__":
    main()
