"""Likelihood evaluation speed: gptlab's evaluate_task (shared prefix, packed rows) vs lm-eval's HFLM, same model.

    .venv/bin/python bench/eval_speed.py                          # 6 layers x 384, both forms; writes docs/bench_eval_speed.txt
    .venv/bin/python bench/eval_speed.py --questions 48 --rounds 4
    .venv/bin/python bench/eval_speed.py --quick                  # a tiny model and a few questions: a smoke run

One randomly initialised GPT-2-shaped Hugging Face folder (transformers' GPT2LMHeadModel with GPT-2's 50257-token
tokenizer, 1024 positions) is loaded by both sides, fp32 on the CPU: by gptlab.model.hf.from_pretrained and by
lm_eval.models.huggingface.HFLM. The questions are real 5-shot MMLU (a seeded sample of the test split of
../shared/data/eval/mmlu, shots from its dev split), asked in two forms:

- letters: lm-eval's MMLU form, "question\\nA. ...\\nD. ...\\nAnswer:" then " A" .. " D". Every continuation is one
  token and lm-eval already runs a question's four requests as one (its logits cache for one-token continuations),
  so here gptlab gains only from packing and from computing the output layer at 4 positions instead of all.
  As lm-eval's own MMLU task, the prompt opens with the subject's description and the shots are the first five
  of the question's subject's dev set.
- cloze: "Question: ...\\nAnswer:" then each choice's text, as ARC and HellaSwag are asked: several tokens per
  continuation, so lm-eval runs the 5-shot context once per choice and gptlab once per question.

The requests are rendered once with gptlab.eval.tasks.core (few-shot choice, prompts), so both sides score identical
(context, continuation) texts. gptlab's time is evaluate_task end to end (few-shot choice, rendering, encoding,
packed scoring, metrics); lm-eval's is HFLM.loglikelihood on the texts (its own encoding) and the argmax per question.
Both must pick the same answer for every question. The sides alternate for `--rounds` rounds; reported are
examples/s (medians), their ratio, a Mann-Whitney test of the rounds, and the tokens each side runs through the
model per question (gptlab's from packing.plan_rows; lm-eval's from its request lengths and one-token grouping).
HFLM runs at lm-eval's default batch size, 1 request per pass, which was also its faster setting on a 2-core CPU
(with `--lm-eval-batch-size 8` its letters ran at half the speed and its cloze no faster: larger batches pad each
request to the batch's longest and take log_softmax over a (batch, length, 50257) tensor); gptlab runs 8 packed
rows of up to 1024 tokens per pass.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from machine import REPO_ROOT, header
from scipy.stats import mannwhitneyu

from gptlab.eval.packing import plan_rows
from gptlab.eval.tasks.core import CORE_TASKS, TaskSpec, build_fewshot_pool, choose_shots, encode_group, evaluate_task, render_requests
from gptlab.eval.tasks.sources import load_task_records
from gptlab.model.hf import from_pretrained
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.tokenizer.pretrained import load_pretrained

SEED = 1234  # evaluate_task's default few-shot seed; the rendering for lm-eval must use the same
MMLU = REPO_ROOT.parent / "shared" / "data" / "eval" / "mmlu"
OUTPUT = REPO_ROOT / "docs" / "bench_eval_speed.txt"
LETTERS = CORE_TASKS["mmlu"]  # 5 shots, "question\nA. ...\nAnswer:" then " A" .. " D"
CLOZE = TaskSpec(name="mmlu_cloze", kind="multiple_choice", shots=5, chance=0.25)
TIE = 1e-4  # log-likelihoods this close are a tie: the two sides' float sums may order them either way


@dataclass(frozen=True)
class ModelSize:
    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int = 1024  # GPT-2's context: long 5-shot MMLU prompts are cut on the left by both sides alike


FULL = ModelSize(n_layer=6, n_embd=384, n_head=6)
QUICK = ModelSize(n_layer=2, n_embd=64, n_head=2)


# ---------------------------------------------------------------- the model, the questions


def build_model_folder(directory: Path, size: ModelSize, seed: int = 0) -> Path:
    """A Hugging Face folder both sides load: a random GPT2LMHeadModel and GPT-2's tokenizer (transformers' files)."""
    import transformers

    tokenizer = load_pretrained("gpt2")
    tokenizer.save_huggingface_dir(directory, model_max_length=size.n_positions)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=size.n_layer, n_embd=size.n_embd, n_head=size.n_head, n_positions=size.n_positions,
                                     vocab_size=tokenizer.vocab_size, bos_token_id=tokenizer.eot_id, eos_token_id=tokenizer.eot_id)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


@contextlib.contextmanager
def hub_offline():
    """Local folders only, for this block: a hub lookup fails at once instead of downloading or waiting on the network."""
    import huggingface_hub

    before_env, before_flag = os.environ.get("HF_HUB_OFFLINE"), huggingface_hub.constants.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"] = "1"
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE = before_flag
        if before_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before_env


def load_sides(directory: Path, batch_size: int = 1):
    """(gptlab's GPT, lm-eval's HFLM with `batch_size` requests per pass) on the same folder, both fp32 on the CPU."""
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # one warning per request cut to fit the context otherwise
    with hub_offline():
        theirs = HFLM(pretrained=str(directory), tokenizer=str(directory), batch_size=batch_size, device="cpu", dtype="float32")
    return from_pretrained(directory).eval(), theirs


def mmlu_sample(folder: Path, n: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """n test questions drawn over all subjects (seeded), and the dev split as the few-shot pool."""
    data = load_task_records("mmlu", source=folder)
    picked = sorted(random.Random(seed).sample(range(len(data.records)), min(n, len(data.records))))
    return [data.records[i] for i in picked], data.fewshot_pool


def as_cloze(record: dict) -> dict:
    """The same question with the choice texts as continuations (the form ARC and HellaSwag use)."""
    return {"query": f"Question: {record['question'].strip()}\nAnswer:", "choices": list(record["choice_texts"]),
            "gold": record["gold"], "id": record["id"]}


def render_questions(spec: TaskSpec, records: list[dict], pool: list[dict]) -> list[list[tuple[str, str]]]:
    """Each question's (context, continuation) texts, with the shots evaluate_task draws for it (same seed)."""
    fewshot = build_fewshot_pool(spec, records, pool)
    questions = []
    for index, record in enumerate(records):
        picked = choose_shots(spec, fewshot, records, index, spec.shots, SEED)
        questions.append(render_requests(spec, record, [pool[j] for j in picked]))
    return questions


# ---------------------------------------------------------------- the two sides


Answers = tuple[list[list[float]], list[int]]  # each question's log-likelihoods, and the choice picked by them (acc)


def run_gptlab(model, spec: TaskSpec, records: list[dict], pool: list[dict], encode, batch_size: int) -> Answers:
    """evaluate_task end to end: its log-likelihoods and its own pick for acc (the argmax)."""
    _, examples = evaluate_task(model, spec, records, encode, fewshot_pool=pool, seed=SEED, batch_size=batch_size)
    return [example["logprobs"] for example in examples], [example["picks"]["acc"] for example in examples]


def run_lm_eval(lm, questions: list[list[tuple[str, str]]]) -> Answers:
    """HFLM.loglikelihood on every request as text, then the argmax per question (lm-eval's acc)."""
    from lm_eval.api.instance import Instance

    instances = [Instance("loglikelihood", {}, pair, k) for question in questions for k, pair in enumerate(question)]
    results = iter(lm.loglikelihood(instances, disable_tqdm=True))
    logprobs = [[next(results)[0] for _ in question] for question in questions]
    return logprobs, [answer(question) for question in logprobs]


def answer(logprobs: list[float]) -> int:
    """The argmax, ties to the first choice (lm-eval's np.argmax and gptlab's choose_answers agree on this)."""
    return max(range(len(logprobs)), key=lambda k: logprobs[k])


def compare(ours: Answers, theirs: Answers) -> tuple[float, int]:
    """(the largest |log-likelihood difference|, questions with the same answer); raises if an answer differs
    by more than a tie within TIE."""
    largest, same = 0.0, 0
    (our_logprobs, our_picks), (their_logprobs, their_picks) = ours, theirs
    for index, (mine, other, pick, their_pick) in enumerate(zip(our_logprobs, their_logprobs, our_picks, their_picks, strict=True)):
        largest = max(largest, *(abs(a - b) for a, b in zip(mine, other, strict=True)))
        if pick != their_pick and abs(mine[pick] - mine[their_pick]) > TIE:
            raise AssertionError(f"question {index}: gptlab picks {pick}, lm-eval {their_pick} ({mine} vs {other})")
        same += pick == their_pick
    return largest, same


# ---------------------------------------------------------------- tokens through the model


def _padded(lengths: list[int], batch_size: int) -> int:
    """Tokens in batches of `batch_size` sequences, longest first, each padded to its batch's longest."""
    ordered = sorted(lengths, reverse=True)
    return sum(len(ordered[start:start + batch_size]) * ordered[start] for start in range(0, len(ordered), batch_size))


def tokens_per_question(questions: list[list[tuple[str, str]]], encode, block_size: int, batch_size: int,
                        lm_eval_batch_size: int) -> dict[str, dict[str, float]]:
    """Per question and side: real input tokens, tokens with pads, and positions that reach the output layer.

    gptlab: its packed rows (a question's shared prefix once), `batch_size` rows per pass, the head at scored
    positions only. lm-eval: one input per request cut to the context, except that requests with equal
    context + continuation[:-1] run once (its one-token grouping), `lm_eval_batch_size` inputs per pass; the
    model's head runs at every position."""
    groups = [encode_group(encode, question) for question in questions]
    rows = plan_rows(groups, block_size)
    row_lengths = [sum(len(unit.tokens) for unit in row) for row in rows]
    head = sum(len(reads) for row in rows for unit in row for reads in unit.reads)
    inputs = {tuple([*context, *continuation[:-1]]) for group in groups for context, continuation in group}
    lengths = [min(len(tokens), block_size) for tokens in inputs]
    n = len(questions)
    padded = _padded(lengths, lm_eval_batch_size)
    return {"gptlab": {"tokens": sum(row_lengths) / n, "padded": _padded(row_lengths, batch_size) / n, "head": head / n},
            "lm-eval": {"tokens": sum(lengths) / n, "padded": padded / n, "head": padded / n}}


# ---------------------------------------------------------------- timing


@dataclass
class FormResult:
    """One form's measurement: the rounds' times per side, and what the sides agreed on."""

    seconds: dict[str, list[float]]  # side -> seconds per round
    questions: int
    largest_difference: float  # max |log-likelihood difference| between the sides
    same_answers: int  # questions both sides answer alike (the rest are ties within TIE)
    tokens: dict[str, dict[str, float]]

    def examples_per_second(self, side: str) -> float:
        return self.questions / statistics.median(self.seconds[side])


def measure_form(spec: TaskSpec, records: list[dict], pool: list[dict], model, lm, encode, *, batch_size: int, rounds: int) -> FormResult:
    """Time both sides `rounds` times in alternating order on the same questions; check they agree.

    `batch_size`: gptlab's packed rows per pass (lm-eval's batch size is the HFLM's own)."""
    questions = render_questions(spec, records, pool)
    run_gptlab(model, spec, records[:2], pool, encode, batch_size)  # warm-up: first-call allocations, lazy imports
    run_lm_eval(lm, questions[:2])
    seconds: dict[str, list[float]] = {"lm-eval": [], "gptlab": []}
    results = {}
    for round_index in range(rounds):
        for side in ("gptlab", "lm-eval") if round_index % 2 == 0 else ("lm-eval", "gptlab"):  # drift falls on both
            start = time.perf_counter()
            results[side] = run_gptlab(model, spec, records, pool, encode, batch_size) if side == "gptlab" else run_lm_eval(lm, questions)
            seconds[side].append(time.perf_counter() - start)
    largest, same = compare(results["gptlab"], results["lm-eval"])
    tokens = tokens_per_question(questions, encode, model.config.block_size, batch_size, lm.batch_size)
    return FormResult(seconds, len(questions), largest, same, tokens)


def report(title: str, result: FormResult) -> list[str]:
    """The form's table: a line per side, then the ratio and the checks."""
    rounds = len(result.seconds["gptlab"])
    lines = [f"\n## {title}: {result.questions} questions x 4 choices, 5-shot, {rounds} round{'s' * (rounds != 1)} (medians)",
             f"{'side':<9}{'examples/s':>11}  {'tokens in/question':>18}{'with pads':>11}{'head positions':>16}   seconds per round"]
    for side in ("lm-eval", "gptlab"):
        tokens = result.tokens[side]
        times = " ".join(f"{value:.2f}" for value in result.seconds[side])
        lines.append(f"{side:<9}{result.examples_per_second(side):>11.2f}  {tokens['tokens']:>18,.0f}{tokens['padded']:>11,.0f}"
                     f"{tokens['head']:>16,.0f}   {times}")
    ratio = result.examples_per_second("gptlab") / result.examples_per_second("lm-eval")
    p = mannwhitneyu(result.seconds["gptlab"], result.seconds["lm-eval"]).pvalue
    lines.append(f"ratio gptlab / lm-eval {ratio:.2f}x (medians), Mann-Whitney p {p:.3f}; same answer on {result.same_answers}/{result.questions} "
                 f"questions (any other: a tie within {TIE:g}), max |log-likelihood difference| {result.largest_difference:.1e}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, help="MMLU test questions per form (default 24; --quick 6)")
    parser.add_argument("--rounds", type=int, help="timed rounds per side (default 6; --quick 1)")
    parser.add_argument("--batch-size", type=int, default=8, help="gptlab's packed rows (of up to 1024 tokens) per pass (default 8)")
    parser.add_argument("--lm-eval-batch-size", type=int, default=1,
                        help="HFLM's requests per pass (default 1: lm-eval's default)")
    parser.add_argument("--quick", action="store_true", help="a 2-layer x 64 model and a few questions: checks, not figures")
    parser.add_argument("--mmlu", type=Path, default=MMLU, help=f"MMLU's CSV folder (dev/, test/) (default {MMLU})")
    parser.add_argument("--output", help=f"also write the output here (default {OUTPUT.relative_to(REPO_ROOT)}; --quick: none; - for none)")
    args = parser.parse_args()
    for name in ("questions", "rounds", "batch_size", "lm_eval_batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    import transformers

    transformers.utils.logging.disable_progress_bar()  # its bars for writing and loading the folder are noise here
    size = QUICK if args.quick else FULL
    n = args.questions or (6 if args.quick else 24)
    rounds = args.rounds or (1 if args.quick else 6)
    output = args.output or ("-" if args.quick else str(OUTPUT))
    lines = [header("Likelihood evaluation speed: gptlab evaluate_task vs lm-eval HFLM (same model, same requests)",
                    ["gptlab", "torch", "transformers", "lm_eval"])]
    lines.append(f"# model: random GPT-2 shape, {size.n_layer} layers x {size.n_embd}, {size.n_head} heads, {size.n_positions} positions, "
                 f"vocab 50257; fp32 on cpu, torch threads {torch.get_num_threads()}; batch: gptlab {args.batch_size} packed rows, "
                 f"lm-eval {args.lm_eval_batch_size} requests; examples/s = questions/s")
    print("\n".join(lines), flush=True)
    try:
        records, pool = mmlu_sample(args.mmlu, n)
    except GptlabError as error:
        raise SystemExit(f"eval_speed: error: {error} (pass --mmlu FOLDER: MMLU's dev/ and test/ CSV folders)") from None
    encode = load_pretrained("gpt2").encode_ordinary
    with tempfile.TemporaryDirectory() as folder:
        model, lm = load_sides(build_model_folder(Path(folder), size), args.lm_eval_batch_size)
        for title, spec, form in (("letters: lm-eval's MMLU form, one-token continuations \" A\"..\" D\"", LETTERS, records),
                                  ("cloze: the choice texts as continuations", CLOZE, [as_cloze(record) for record in records])):
            shots_pool = pool if spec is LETTERS else [as_cloze(record) for record in pool]
            result = measure_form(spec, form, shots_pool, model, lm, encode, batch_size=args.batch_size, rounds=rounds)
            table = report(title, result)
            print("\n".join(table), flush=True)
            lines += table
    if output != "-":
        atomic_write_text(output, "\n".join(lines) + "\n")
        print(f"\nwritten to {output}")


if __name__ == "__main__":
    main()
