"""HellaSwag-style scoring throughput: batched rows (gptlab's default) vs one example per forward pass.

build-nanogpt scores HellaSwag one example at a time (its 4 endings as one batch of 4 rows). gptlab
packs many examples' rows into each forward pass. Both run here through the same scorer on the same
model and examples; only the rows per pass differ, and the accuracies must agree.

Examples are written in the official HellaSwag jsonl format from Shakespeare (context: a few lines;
endings: the true next line and three lines from elsewhere), since the real file needs the network.
The model is a randomly initialised GPT-2 (124M) shape with GPT-2's tokenizer: speed, not accuracy.

    .venv/bin/python bench/eval_hellaswag.py               # 64 examples
    .venv/bin/python bench/eval_hellaswag.py --examples 16
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch
from machine import header

from gptlab.data.corpus import shakespeare_documents
from gptlab.eval.tasks import HellaSwag
from gptlab.model import GPT, preset
from gptlab.tokenizer.pretrained import load_pretrained


def write_examples(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    lines = [line.strip() for document in shakespeare_documents() for line in document.splitlines() if len(line.strip()) > 20]
    with open(path, "w") as handle:
        for index in range(n):
            start = rng.randrange(len(lines) - 8)
            context = " ".join(lines[start : start + 4])
            endings = [lines[start + 4]] + [lines[rng.randrange(len(lines))] for _ in range(3)]
            order = list(range(4))
            rng.shuffle(order)
            record = {"ind": index, "ctx": context, "endings": [endings[i] for i in order], "label": order.index(0)}
            handle.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--rows", type=int, default=32, help="rows per forward pass on the batched side")
    args = parser.parse_args()
    print(header("HellaSwag scoring: batched rows vs one example per pass (build-nanogpt)", ["gptlab", "torch"]))
    torch.manual_seed(0)
    model = GPT(preset("gpt2")).eval()
    tokenizer = load_pretrained("gpt2")
    print(f"# model: random GPT-2 (124M) shape, fp32 on cpu, torch threads {torch.get_num_threads()}; {args.examples} examples x 4 endings")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hellaswag_val.jsonl"
        write_examples(path, args.examples)
        task = HellaSwag(path)
        task.evaluate(model, tokenizer.encode_ordinary, batch_size=args.rows, limit=4)  # warm-up
        batched = task.evaluate(model, tokenizer.encode_ordinary, batch_size=args.rows)
        single = task.evaluate(model, tokenizer.encode_ordinary, batch_size=4)
    assert (batched["acc"], batched["acc_norm"]) == (single["acc"], single["acc_norm"]), "batched scores differ"
    print(f"batched ({args.rows} rows/pass)   {batched['examples_per_second']:6.2f} examples/s")
    print(f"one example per pass      {single['examples_per_second']:6.2f} examples/s")
    print(f"ratio batched / one-at-a-time {batched['examples_per_second'] / single['examples_per_second']:.2f}; same accuracies: yes")


if __name__ == "__main__":
    main()
