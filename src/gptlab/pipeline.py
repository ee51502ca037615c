"""The `gptlab run` job: the whole pipeline as a sequence of API calls.

get the corpus -> train the tokenizer (byte-level BPE, or SentencePiece BPE with
`tokenizer.style`; and measure it on held-out works) ->
tokenize the corpus into shuffled train/val shards -> train a GPT -> evaluate
val bits per byte on the whole val split -> sample -> fine-tune it for chat on
the built-in tasks (held-out accuracy before and after) -> a short conversation.
Every artefact goes under `out/`: the resolved config (`config.json`, what
actually ran), the tokenizer, the shards, checkpoints, metrics, the loss plots,
and the chat model (`out/sft`, for `gptlab chat` and `gptlab serve`).

The folder belongs to this run (gptlab.runtime.rundir): rerunning the same
config reuses the finished stages and resumes training; another config, or a
folder that is not a gptlab run, is refused (`force` starts over).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.align.finetune.sft import SFTConfig, SFTResult, run_sft, sft_cpu
from gptlab.data.documents import RunCorpus, load_run_corpus, prompt_from
from gptlab.data.prepare import PrepareConfig, prepare_shards
from gptlab.eval.card import CARD_FILE, CARD_FILES, Card, proportion_row
from gptlab.eval.loss import evaluate_split as evaluate_loss_on_split
from gptlab.infer.generate import SamplingConfig, generate
from gptlab.model import ModelConfig
from gptlab.model.io import load_model
from gptlab.runtime import GptlabError, atomic_write_text
from gptlab.runtime.config import config_to_json, field_defaults, prefix_flags
from gptlab.runtime.device import init_runtime
from gptlab.runtime.rundir import RunFolder, claim_run_folder
from gptlab.tokenizer import SentencePieceTokenizer, Tokenizer
from gptlab.tokenizer.show import render_tokens, token_stats
from gptlab.train import TrainConfig, Trainer, TrainResult
from gptlab.train.config import shakespeare_cpu
from gptlab.train.trainer import FREE_FIELDS as TRAIN_FREE_FIELDS

STYLES = ("bytelevel", "sentencepiece")
SENTENCEPIECE_CONTROL = ("<s>", "</s>")  # Llama 2's control pieces: </s> ends each document


@dataclass(frozen=True, kw_only=True)
class TokenizerStageConfig:
    style: str = "bytelevel"  # bytelevel (GPT-2/GPT-4 style, tokenizer.json) | sentencepiece (Llama 2 style, tokenizer.model)
    vocab_size: int = 4096  # ids in all: 256 bytes + merges + special tokens (sentencepiece: + <unk>, <s>, </s>)
    pattern: str = "gpt4"  # bytelevel's split pattern: gpt2 | gpt4 | o200k | none (sentencepiece splits on no regex)
    special_tokens: tuple[str, ...] = ("<|endoftext|>",)  # bytelevel's, comma-separated (sentencepiece: always <s>, </s>)

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise GptlabError(f"tokenizer.style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if self.style == "sentencepiece":  # a setting that would be ignored is refused
            changed = {"pattern": self.pattern != "gpt4", "special-tokens": list(self.special_tokens) != ["<|endoftext|>"]}
            given = [name for name, differs in changed.items() if differs]
            if given:
                raise GptlabError(f"--tokenizer.{given[0]} does not apply to --tokenizer.style sentencepiece; drop it")


@dataclass(frozen=True, kw_only=True)
class DataStageConfig:
    shard_tokens: int = 1_000_000  # tokens per shard
    seed: int = 1337  # seed of the training documents' shuffle


@dataclass(frozen=True, kw_only=True)
class SampleStageConfig:
    prompt: str = ""  # text the sample continues ("": ROMEO: on the built-in corpus, else the first words of a held-out document)
    max_new_tokens: int = 300  # at most what fits in the model's context after the prompt
    temperature: float = 0.8  # 0: greedy
    top_k: int = 50  # sample among the k most likely tokens
    seed: int = 0  # seed of the sample


# The demo's pretraining budget: its schedule follows the time, so a slower machine still ends annealed, on time.
DEMO_SECONDS = 180.0


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    corpus: str = "shakespeare"  # the built-in corpus, a folder or file of text (any text files), or hf:NAME[:CONFIG]
    out: str = ""  # the run's folder ("": runs/<the corpus's name>, e.g. runs/shakespeare)
    val_every: int = 10  # every val_every-th document is held out: unseen by the tokenizer, the val split
    tokenizer: TokenizerStageConfig = field(default_factory=TokenizerStageConfig)
    data: DataStageConfig = field(default_factory=DataStageConfig)
    train: TrainConfig = field(default_factory=lambda: dataclasses.replace(shakespeare_cpu(), max_steps=10**9, time_limit=DEMO_SECONDS))  # data, out, tokenizer: the run's
    sample: SampleStageConfig = field(default_factory=SampleStageConfig)
    sft: SFTConfig = field(default_factory=sft_cpu)  # fine-tuning for chat; init_from, out and model are set by the run
    card_examples: int = 200  # questions per task on the report cards (95% intervals about +-0.07 wide at 200)
    pretrain_only: bool = False  # stop after the held-out evaluation: a record track's score (gptlab.tracks)

    def __post_init__(self) -> None:
        if self.val_every < 2:
            raise GptlabError(f"val_every must be at least 2 (one document in val_every is held out), got {self.val_every}")
        if self.card_examples < 1:
            raise GptlabError(f"card_examples must be at least 1 question per task, got {self.card_examples}")


# Fields `gptlab run` sets itself, so setting them would be silently ignored: refused instead.
FIXED_FIELDS = {
    "train.data": "the run prepares its own data into OUT/data",
    "train.out": "the run trains into OUT/train; choose the run's folder with --out",
    "train.tokenizer": "the run trains its own tokenizer into OUT/tokenizer",
    "train.model.vocab_size": "the model's vocabulary is the run's tokenizer's; set --tokenizer.vocab-size",
    "train.init_from": "the run trains from scratch with its own tokenizer; fine-tune with `gptlab train --init-from`",
    "sft.init_from": "the run fine-tunes the model it pretrained",
    "sft.out": "the run fine-tunes into OUT/sft; choose the run's folder with --out",
    "sft.tokenizer": "the run fine-tunes with its own tokenizer (plus the chat tokens)",
    **{f"sft.model.{name.name}": "the fine-tuned model is the run's pretrained model (set --train.model.*)"
       for name in dataclasses.fields(ModelConfig) if name.name != "dropout"},
}
FREE_FIELDS = ("out", "sample", "card_examples", *(f"{stage}.{name}" for stage in ("train", "sft") for name in TRAIN_FREE_FIELDS))
RUN_FILES = ("config.json", "tokenizer", "data", "train", "sft")
STAGES = 10


@dataclass
class RunResult:
    tokenizer_dir: Path
    val_bytes_per_token: float
    train_seconds: float
    data_dir: Path
    train: TrainResult | None = None
    val_bpb: float | None = None
    sample: str = ""
    sft: SFTResult | None = None
    conversation: list[dict] = field(default_factory=list)


def run_pipeline(config: RunConfig, log: Callable[[str], None] = print, color: bool = False, force: bool = False) -> RunResult:
    corpus = load_run_corpus(config.corpus, config.val_every)  # bad input is refused before anything is made
    config = resolved_run_config(config, corpus)
    out = Path(config.out)
    refuse_another_corpus(out, config.corpus, corpus.name, force)
    folder = claim_run_folder(out, command="run", config=dataclasses.asdict(config), ours=RUN_FILES, free=FREE_FIELDS,
                              force=force, legacy=_made_by_an_earlier_gptlab, defaults=field_defaults(RunConfig))
    if folder.status == "resume":
        log(f"resuming the run in {out} (same settings): finished stages are reused")
    trainer, training = None, False
    try:
        tokenizer, tokenizer_seconds, stats, data_dir, train_config = prepare_stages(config, corpus, folder, log, color)
        model_config = train_config.model
        log(f"[5/{STAGES}] train: {model_config.arch} {model_config.n_layer} layers x {model_config.n_embd} wide, "
            f"{_length(train_config)} of {train_config.batch_tokens:,} tokens a step")
        runtime = init_runtime(train_config.device)
        training = True
        trainer = Trainer(train_config, runtime=runtime, log=lambda line: log("      " + line))
        trained = trainer.fit()
    except GptlabError as error:  # refused for bad input before training began: a new run leaves nothing behind
        if trainer is None or not trainer.started:
            folder.undo()
        if not training:
            raise
        raise GptlabError(prefix_flags(str(error), TrainConfig, "train")) from None  # the trainer's flags as typed here
    if trained.status == "interrupted":  # Ctrl-C: the checkpoint is saved; the same command resumes
        log(f"      interrupted: rerun the same command to resume from {trained.checkpoint}")
        raise KeyboardInterrupt
    if trained.losses:
        log(f"      {trained.status} in {trained.seconds:.0f} s, final train loss {trained.final_loss:.3f} -> {trained.checkpoint}")

    log(f"[6/{STAGES}] evaluate: the whole val split (the held-out {corpus.kind})")
    model = load_model(trained.checkpoint, device=runtime.device)
    val = evaluate_split(model, trainer.config)  # its micro_batch resolved (0: auto)
    log(f"      val loss {val['loss']:.4f} nats/token, val bits per byte {val['bpb']:.4f} ({val['tokens']:,} tokens)")
    if config.pretrain_only:
        log(f"done: pretrained and scored; artefacts in {out}/ (the remaining stages are skipped: pretrain_only)")
        return RunResult(tokenizer_dir=out / "tokenizer", val_bytes_per_token=stats.bytes_per_token, train_seconds=tokenizer_seconds,
                         data_dir=data_dir, train=trained, val_bpb=val["bpb"])

    log(f"[7/{STAGES}] sample: {config.sample.max_new_tokens} tokens, temperature {config.sample.temperature}, top-k {config.sample.top_k}")
    text = sample_text(model, tokenizer, config.sample)
    log(text)
    tuned = sft_stage(config, out, train_config, trained, runtime, log)
    conversation = conversation_stage(tuned, config.sft.eval_tasks(), runtime, log)
    card_stage(config, corpus, model, tokenizer, tuned, runtime, log)
    log(f"done: artefacts in {out}/ (loss plots: {out / 'train' / 'loss.png'}, {out / 'sft' / 'loss.png'})")
    from gptlab.runtime.optional import activation_hint, gptlab_command

    command = gptlab_command()  # `gptlab` when on PATH, else the path that runs it from here (.venv/bin/gptlab)
    log(f"talk to it: {command} chat {out / 'sft'}   or serve it (OpenAI API and web chat): {command} serve {out / 'sft'}")
    log(f"align it: {command} dpo --init {out / 'sft'} --out runs/dpo   or {command} grpo ... (docs/alignment.md)")
    if activation_hint(command):
        log(activation_hint(command))
    return RunResult(
        tokenizer_dir=out / "tokenizer", val_bytes_per_token=stats.bytes_per_token, train_seconds=tokenizer_seconds,
        data_dir=data_dir, train=trained, val_bpb=val["bpb"], sample=text, sft=tuned, conversation=conversation,
    )


def resolved_run_config(config: RunConfig, corpus: RunCorpus) -> RunConfig:
    """The settings left to the corpus: the folder (runs/<name>) and the sample's prompt (ROMEO: on the built-in
    corpus, else the first words of a held-out document, said among what was adapted)."""
    out = config.out or str(Path("runs") / corpus.name)
    prompt = config.sample.prompt
    if not prompt and corpus.builtin:
        prompt = "ROMEO:\n"
    elif not prompt:
        prompt = prompt_from(corpus.held_out)
        corpus.adapted.append(f"sample prompt {prompt.strip()!r} from its held-out text")
    return dataclasses.replace(config, out=out, sample=dataclasses.replace(config.sample, prompt=prompt))


def refuse_another_corpus(out: Path, corpus: str, name: str, force: bool) -> None:
    """A folder holding the run of another corpus is refused before the usual settings check, naming both."""
    from gptlab.runtime.rundir import read_marker

    record = read_marker(out) if out.is_dir() else None
    if force or not record or record.get("command") != "run":
        return
    earlier = record.get("config", {}).get("corpus")
    if earlier is not None and earlier != corpus:
        raise GptlabError(f"--out {out} holds the run on corpus {earlier!r}, not {corpus!r}; pass --out runs/{name} "
                          "(the default for this corpus), or --force to start over there")


def held_out_rows(model, tokenizer: Tokenizer, texts: list[str], n: int, log) -> list:
    """The base model's card rows on the tasks cut from the held-out text (gptlab.eval.tasks.heldout); a task that
    text is too short or too plain for is left out, in one line."""
    from gptlab.eval.tasks.core import evaluate_task
    from gptlab.eval.tasks.heldout import LAST_WORD, NEXT_LINE, last_word_records, next_line_records

    rows = []
    for spec, make in ((NEXT_LINE, next_line_records), (LAST_WORD, last_word_records)):
        try:
            records = make(texts, n)
        except GptlabError as error:
            log(f"      {spec.name}: left out ({error})")
            continue
        row, _ = evaluate_task(model, spec, records, tokenizer.encode_ordinary, batch_size=32)
        rows.append(row)
    return rows


def _length(config: TrainConfig) -> str:
    """How long training runs: a time budget (the schedule follows it) and/or a number of steps."""
    steps = f"{config.max_steps:,} steps"
    if not config.time_limit:
        return steps
    return f"{config.time_limit:g} s" + (f" (at most {steps})" if config.max_steps < 10**8 else "")


def sft_stage(config: RunConfig, out: Path, train_config: TrainConfig, trained: TrainResult, runtime, log) -> SFTResult:
    """Fine-tune the pretrained model on the built-in tasks; their held-out accuracy before and after."""
    log(f"[8/{STAGES}] fine-tune for chat: {config.sft.max_steps} steps of {config.sft.batch_tokens:,} tokens on {config.sft.data}")
    try:
        sft = dataclasses.replace(config.sft, init_from=str(trained.checkpoint), out=str(out / "sft"), tokenizer=str(out / "tokenizer"),
                                  model=train_config.model, device=train_config.device)
        tuned = run_sft(sft, runtime=runtime, log=lambda line: log("      " + line), flags="sft.")
    except GptlabError as error:  # the fine-tuning's flags as this command spells them: --sft.seq-len
        raise GptlabError(prefix_flags(str(error), SFTConfig, "sft")) from None
    if tuned.status == "interrupted":
        log(f"      interrupted: rerun the same command to resume from {tuned.train.checkpoint}")
        raise KeyboardInterrupt
    return tuned


def conversation_stage(tuned: SFTResult, tasks: list, runtime, log) -> list[dict]:
    """A short conversation with the fine-tuned model: one held-out question of each task."""
    from gptlab.chat import ChatFormat
    from gptlab.data.match import find_model_tokenizer
    from gptlab.eval.chat import grade

    log(f"[9/{STAGES}] chat: held-out questions the model never saw in fine-tuning")
    model = load_model(tuned.train.checkpoint, device=runtime.device)
    chat = ChatFormat(find_model_tokenizer(tuned.train.checkpoint))
    turns = []
    for task in tasks:
        for question, response, correct in grade(model, chat, task, task.examples("test", 1)):
            log(f"      user:      {question}")
            log(f"      assistant: {response}   [{'correct' if correct else 'wrong'}]")
            turns.append({"task": task.name, "question": question, "response": response, "correct": correct})
    return turns


def card_stage(config: RunConfig, corpus: RunCorpus, model, tokenizer: Tokenizer, tuned: SFTResult, runtime, log) -> tuple[Card, Card]:
    """Report cards (gptlab.eval.card) of the base model, on benchmarks cut from the held-out works, and of the chat
    model, on the fine-tuning tasks' held-out questions; saved as OUT/train/eval/eval.json and OUT/sft/eval/eval.json."""
    from gptlab.chat import ChatFormat
    from gptlab.data.match import find_model_tokenizer
    from gptlab.eval.chat import evaluate_task as evaluate_chat_task
    log(f"[10/{STAGES}] report cards: the base model on the held-out {corpus.kind}, the chat model on held-out questions")
    rows = held_out_rows(model, tokenizer, corpus.held_out, config.card_examples, log)
    base = Card(str(Path(config.out) / "train"), rows, settings={"suite": "held-out", "examples": config.card_examples})
    if rows:
        base.add_aggregate("CORE-style (held-out)", rows)
    chat_model = load_model(tuned.train.checkpoint, device=runtime.device)
    chat = ChatFormat(find_model_tokenizer(tuned.train.checkpoint))
    chat_card = Card(str(Path(config.out) / "sft"), settings={"suite": "fine-tuning tasks", "examples": config.card_examples})
    for task in config.sft.eval_tasks():
        result = evaluate_chat_task(chat_model, chat, task, n=min(config.card_examples, getattr(task, "test_size", config.card_examples)))
        chat_card.add(proportion_row(task.name, shots=0, metric="accuracy", right=result["correct"], n=result["total"]))
    chat_card.add_aggregate("ChatCORE-style", chat_card.rows)
    saved = [(base, "train/eval-heldout", "base model")] * bool(base.rows) + [(chat_card, "sft/eval-tasks", "chat model")]
    for card, folder, what in saved:
        claim_run_folder(Path(config.out) / folder, command="eval", config=card.settings, ours=CARD_FILES, force=True)
        path = card.save(Path(config.out) / folder / CARD_FILE)
        log(f"      {what} ({Path(config.out) / folder.split('/')[0]}), saved in {path}:")
        log("\n".join("        " + line for line in card.text().splitlines()))
    log("      near chance at this size: the 95% intervals say how far from it each score is")
    return base, chat_card


def prepare_stages(config: RunConfig, corpus: RunCorpus, folder: RunFolder, log, color: bool):
    """Stages 1-4: corpus, tokenizer, held-out text, data; and the training config they resolve."""
    out = folder.path
    log(f"[1/{STAGES}] corpus: {config.corpus}")
    corpus_stage(corpus, folder, log)
    tokenizer, tokenizer_seconds = tokenizer_stage(config, folder, corpus, log)
    stats = held_out_stage(tokenizer, corpus.held_out, log, color)
    train_config = resolved_train_config(config, out, tokenizer)
    atomic_write_text(out / "config.json", config_to_json(dataclasses.replace(config, train=train_config)))
    data_dir = data_stage(config, tokenizer, corpus, out, log)
    return tokenizer, tokenizer_seconds, stats, data_dir, train_config


def corpus_stage(corpus: RunCorpus, folder: RunFolder, log) -> None:
    """Say what the run trains on and what was adapted to it; a user's corpus must be the one the run began with."""
    size = sum(len(text.encode("utf-8", errors="surrogatepass")) for text in corpus.train)
    log(f"      {len(corpus.train)} training documents ({size / 1e6:.1f} MB), {len(corpus.held_out)} held out, from {corpus.where}")
    if corpus.skipped:
        log(f"      {corpus.skipped}")
    if corpus.adapted:
        log(f"      adapted to this corpus: {'; '.join(corpus.adapted)}")
    if corpus.builtin:
        return
    done, digest = folder.stage("corpus"), corpus.digest()
    if done and done.get("sha256") != digest:
        raise GptlabError(f"the documents of --corpus {corpus.where} changed since the run in {folder.path} began; "
                          "pass --force to start over on them, or another --out")
    if not done:
        folder.finish_stage("corpus", {"sha256": digest, "documents": len(corpus.train) + len(corpus.held_out)})


def _made_by_an_earlier_gptlab(out: Path) -> bool:
    """A `gptlab run` folder from before run records: its config.json has exactly RunConfig's sections."""
    try:
        saved = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and set(saved) == {field.name for field in dataclasses.fields(RunConfig)}


def tokenizer_stage(config: RunConfig, folder: RunFolder, corpus: RunCorpus, log) -> tuple[Tokenizer, float]:
    """Train the tokenizer on the training works, or reuse the one this run already trained."""
    settings = config.tokenizer
    sentencepiece = settings.style == "sentencepiece"
    what, pattern = ("SentencePiece BPE", "") if sentencepiece else ("byte-level BPE", f", pattern {settings.pattern}")
    log(f"[2/{STAGES}] tokenizer: {what}, vocab {settings.vocab_size}{pattern}")
    kind = SentencePieceTokenizer if sentencepiece else Tokenizer
    directory = folder.path / "tokenizer"
    path = directory / kind.FILE_NAME
    done = folder.stage("tokenizer")
    if done and path.is_file():
        tokenizer = kind.from_file(path) if sentencepiece else Tokenizer.load(directory)
        if tokenizer.fingerprint() == done["fingerprint"]:
            log(f"      reused {path} (trained earlier in this run)")
            return tokenizer, 0.0
    start = time.perf_counter()
    tokenizer = train_tokenizer(settings, corpus)
    seconds = time.perf_counter() - start
    tokenizer.save(directory)
    folder.finish_stage("tokenizer", {"fingerprint": tokenizer.fingerprint()})
    log(f"      trained in {seconds:.1f} s -> {path}")
    return tokenizer, seconds


def train_tokenizer(settings: TokenizerStageConfig, corpus: RunCorpus) -> Tokenizer | SentencePieceTokenizer:
    """A byte-level BPE tokenizer, or a SentencePiece BPE model with Llama 2's control pieces, of the training works
    (the built-in corpus's files, or a user's documents)."""
    given = {"files": corpus.train_files} if corpus.builtin else {"texts": corpus.train}
    if settings.style == "sentencepiece":
        from gptlab.tokenizer.sp_train import train_sentencepiece

        model = train_sentencepiece(**given, vocab_size=settings.vocab_size, control_symbols=SENTENCEPIECE_CONTROL)
        return SentencePieceTokenizer(model)
    return Tokenizer.train(**given, vocab_size=settings.vocab_size, pattern=settings.pattern, special_tokens=settings.special_tokens)


def held_out_stage(tokenizer: Tokenizer, texts: list[str], log, color: bool):
    """How well the tokenizer compresses the works it never saw, and that it round-trips them."""
    log(f"[3/{STAGES}] held-out text")
    tokenizer.encode(texts[0][:1000])  # warm up: the compiled encoder builds its tables on first use
    start = time.perf_counter()
    encoded = [tokenizer.encode(text) for text in texts]
    encode_seconds = time.perf_counter() - start
    if [tokenizer.decode(ids) for ids in encoded] != texts:
        raise AssertionError("decode(encode(text)) != text on held-out documents")
    stats = token_stats("".join(texts), [i for ids in encoded for i in ids])
    rate = stats.bytes / 1e6 / max(encode_seconds, 1e-9)
    log(f"      {stats}; encoded at {rate:.1f} MB/s; decode(encode(text)) == text")
    excerpt = texts[0][:400].rsplit("\n", 1)[0]
    log(render_tokens(tokenizer, tokenizer.encode(excerpt), color=color))
    return stats


def data_stage(config: RunConfig, tokenizer: Tokenizer, corpus: RunCorpus, out: Path, log) -> Path:
    """Shards of the training works (shuffled) and, as the val split, exactly the held-out works."""
    log(f"[4/{STAGES}] data: the training {corpus.kind} into shuffled shards; the {len(corpus.held_out)} held-out {corpus.kind} are the val split")
    data_dir = out / "data"
    prepare_config = PrepareConfig(val=0, shard_tokens=config.data.shard_tokens, seed=config.data.seed, progress=False)
    train, val = corpus.sources()
    prepared = prepare_shards(train, tokenizer, data_dir, prepare_config, val_source=val)
    splits = prepared.manifest["splits"]
    described = ", ".join(f"{name} {entry['tokens']:,} tokens ({entry['documents']} documents, {len(entry['shards'])} shards)"
                          for name, entry in splits.items())
    log(f"      {prepared.status} in {prepared.seconds:.1f} s: {described} -> {data_dir}")
    check_val_fits(splits["val"]["tokens"], config.train)
    return data_dir


def check_val_fits(tokens: int, train: TrainConfig) -> None:
    """A held-out text shorter than one evaluation batch (a small corpus of one's own) is refused before training,
    naming the flags that would fit it: a micro-batch that still divides the batch, or a shorter sequence."""
    micro = train.micro_batch or 1
    if tokens >= micro * train.seq_len + 1:
        return
    rows = train.batch_tokens // train.seq_len
    fits = [m for m in range(micro - 1, 0, -1) if rows % m == 0 and m * train.seq_len + 1 <= tokens]
    shorter = 1 << max(0, ((tokens - 1) // micro).bit_length() - 1)  # a power of two, so the batch still divides
    fix = f"--train.micro-batch {fits[0]}" if fits else f"--train.seq-len {shorter}"
    raise GptlabError(f"the held-out text is {tokens:,} tokens, fewer than one evaluation batch of --train.micro-batch {micro} x "
                      f"--train.seq-len {train.seq_len} + 1 = {micro * train.seq_len + 1:,}: pass {fix}, or give more text")


def resolved_train_config(config: RunConfig, out: Path, tokenizer: Tokenizer) -> TrainConfig:
    """The training config as the run trains it: its own data, folder, tokenizer and vocabulary."""
    return dataclasses.replace(
        config.train, data=str(out / "data"), out=str(out / "train"), tokenizer=str(out / "tokenizer"),
        model=dataclasses.replace(config.train.model, vocab_size=tokenizer.vocab_size),
    )


def evaluate_split(model, train_config: TrainConfig, split: str = "val") -> dict:
    """Loss and bits per byte over the whole split, in the training run's batch shape."""
    return evaluate_loss_on_split(model, train_config.data, split, batch_size=train_config.micro_batch, seq_len=train_config.seq_len)


def sample_text(model, tokenizer: Tokenizer, config: SampleStageConfig) -> str:
    """The prompt and what the model writes after it (a document start, then the prompt)."""
    prompt = [tokenizer.eot_id, *tokenizer.encode_ordinary(config.prompt)]
    room = model.config.block_size - len(prompt)  # the engine keeps the whole sample in the context
    if room < 1:
        raise GptlabError(f"the sample prompt ({len(prompt)} tokens) fills the model's context ({model.config.block_size})")
    sampling = SamplingConfig(
        max_new_tokens=min(config.max_new_tokens, room), temperature=config.temperature, top_k=config.top_k, seed=config.seed,
        stop_tokens=(tokenizer.eot_id,), vocab_size=tokenizer.vocab_size,
    )
    (ids,) = generate(model, [prompt], sampling)
    return tokenizer.decode(prompt[1:] + ids)


def hellaswag_fn(config: TrainConfig):
    """A function model -> {"hellaswag_acc", "hellaswag_acc_norm"} for the trainer (None when not asked for)."""
    if not config.hellaswag_every:
        return None
    if not config.tokenizer:
        raise GptlabError("periodic HellaSwag needs the data's tokenizer: pass --tokenizer DIR")
    from gptlab.eval.tasks import HellaSwag
    from gptlab.tokenizer.pretrained import load_any

    tokenizer = load_any(config.tokenizer)
    task = HellaSwag(config.hellaswag_path or None)

    def evaluate(model) -> dict[str, float]:
        result = task.evaluate(model, tokenizer.encode_ordinary, limit=config.hellaswag_limit or None)
        return {"hellaswag_acc": result["acc"], "hellaswag_acc_norm": result["acc_norm"]}

    return evaluate


def text_sampler(max_new_tokens: int, prompt: str = "\n"):
    """A function (model, tokenizer) -> text for the trainer's periodic samples."""
    config = SampleStageConfig(prompt=prompt, max_new_tokens=max_new_tokens)
    return lambda model, tokenizer: sample_text(model, tokenizer, config)
