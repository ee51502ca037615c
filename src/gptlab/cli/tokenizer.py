"""`gptlab tokenizer train|encode|decode|show|view`: the flags, then calls into gptlab.tokenizer.

decode tells ids from files by their text (gptlab.tokenizer.id_text): arguments that are all whitespace-separated
integers are ids (`decode -t gpt2 15496 11 995`, or one quoted "15496 11 995"), others are files of ids.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gptlab.runtime import GptlabError, atomic_write_text, check_out_dir
from gptlab.runtime.files import check_out_file, check_parents, read_inputs

PATTERN_NAMES = ["gpt2", "gpt4", "cl100k", "o200k", "none"]  # gptlab.tokenizer.patterns, kept here so --help needs no import
# the arguments a tokenizer depends on: a rerun with the same ones (and the same inputs) keeps the folder's tokenizer
TRAIN_SETTINGS = ("style", "vocab_size", "pattern", "regex", "special", "no_special", "byte_fallback", "character_coverage", "normalizer")
SP_NORMALIZERS = ["identity", "nfkc", "nmt_nfkc", "nfkc_cf", "nmt_nfkc_cf"]  # gptlab.tokenizer.sp_train.NORMALIZERS


def register(stages) -> None:
    parser = stages.add_parser("tokenizer", help="train, use, compare and view tokenizers (byte-level BPE, SentencePiece BPE)")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(parser))

    train = verbs.add_parser("train", help="train a tokenizer on text files or a built-in corpus")
    train.add_argument("--input", nargs="+", default=[], metavar="FILE", help="text files, directories or globs; each text file is a document (binary files in folders are skipped)")
    train.add_argument("--corpus", choices=["shakespeare"], help="train on a built-in corpus")
    train.add_argument("--vocab-size", type=int, required=True, help="total ids: 256 bytes + merges + special tokens")
    split = train.add_mutually_exclusive_group()
    split.add_argument("--pattern", choices=PATTERN_NAMES, help="split pattern by name (default gpt4; none: no pre-split)")
    split.add_argument("--regex", metavar="REGEX", help="split with your own regex instead (Python `regex` syntax)")
    train.add_argument("--special", action="append", metavar="TOKEN", help="a special token (repeatable; default <|endoftext|>)")
    train.add_argument("--no-special", action="store_true", help="no special tokens at all")
    train.add_argument("--workers", type=int, default=None, help="pre-tokenization processes (default: all cores)")
    train.add_argument("--out", required=True, metavar="DIR", help="directory to write tokenizer.json into")
    train.add_argument("--force", action="store_true", help="replace a tokenizer already in --out (a rerun with the same inputs "
                       "and settings keeps it without --force)")
    train.add_argument("--style", choices=["bytelevel", "sentencepiece"], default="bytelevel",
                       help="bytelevel: GPT-2/GPT-4 style tokenizer.json; sentencepiece: Llama 2 style tokenizer.model")
    sp = train.add_argument_group("--style sentencepiece")
    sp.add_argument("--byte-fallback", action=argparse.BooleanOptionalAction, default=None,
                    help="byte pieces <0x00>..<0xFF> for characters no piece covers (default on)")
    sp.add_argument("--character-coverage", type=float, default=None, help="share of characters kept as pieces (default 0.9995)")
    sp.add_argument("--normalizer", choices=SP_NORMALIZERS, default=None, help="SentencePiece normalisation rules (default identity)")
    train.set_defaults(handler=run_train)

    encode = verbs.add_parser("encode", help="text to ids (files or stdin), one line of ids per input")
    _add_tokenizer_argument(encode)
    encode.add_argument("files", nargs="*", metavar="FILE", help="input files (default: stdin)")
    encode.add_argument("--allow-special", action="store_true", help="encode special tokens in the text as their ids")
    encode.add_argument("--special-as-text", action="store_true", help="encode special tokens in the text as ordinary text")
    encode.add_argument("--out", metavar="FILE", help="write here (atomically) instead of stdout")
    encode.set_defaults(handler=run_encode)

    decode = verbs.add_parser(
        "decode",
        help="ids (inline, files or stdin) to text",
        description="Decode token ids to text. Ids are given inline (`decode -t gpt2 15496 11 995`), or read from "
        "files or stdin (whitespace-separated). Arguments that are all integers are ids, otherwise file names "
        "(write ./42 for a file named 42).",
    )
    _add_tokenizer_argument(decode)
    decode.add_argument("inputs", nargs="*", metavar="ID|FILE", help="token ids, or files of ids (default: stdin)")
    decode.add_argument("--out", metavar="FILE", help="write here (atomically) instead of stdout")
    decode.set_defaults(handler=run_decode)

    show = verbs.add_parser("show", help="show text with coloured token boundaries and stats")
    _add_tokenizer_argument(show)
    show.add_argument("text", metavar="TEXT|FILE", help="text to show, or a file holding it")
    show.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    show.add_argument("--ids", action="store_true", help="also print the ids")
    show.set_defaults(handler=run_show)

    view = verbs.add_parser("view", help="compare tokenizers in the browser: a page on 127.0.0.1 showing each one's tokens")
    view.add_argument("tokenizers", nargs="*", metavar="TOKENIZER", help="tokenizer folders or files (gptlab's, Hugging Face's, "
                      "SentencePiece .model) or names (default: gpt2, cl100k_base, and o200k_base when its file is here)")
    view.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    view.add_argument("--port", type=int, default=8001, help="port (default 8001; 0: any free port)")
    view.set_defaults(handler=run_view)


def _add_tokenizer_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer",
        "-t",
        required=True,
        metavar="DIR|NAME",
        help="a tokenizer folder or file (gptlab's, a Hugging Face byte-level BPE one, a SentencePiece .model), or gpt2 / cl100k_base / o200k_base",
    )


def run_train(args: argparse.Namespace) -> int:
    from gptlab.tokenizer import Tokenizer
    from gptlab.tokenizer.formats import FILE_NAME
    from gptlab.tokenizer.patterns import SplitRegex, resolve_pattern
    from gptlab.tokenizer.train_record import save_record

    if not args.input and not args.corpus:
        raise GptlabError("nothing to train on: give --input FILE... or --corpus shakespeare")
    if args.style == "sentencepiece":
        return run_train_sentencepiece(args)
    _refuse_options(args, "bytelevel", byte_fallback="--byte-fallback", character_coverage="--character-coverage", normalizer="--normalizer")
    pattern = resolve_pattern(SplitRegex(args.regex) if args.regex is not None else args.pattern or "gpt4")
    out = Path(args.out)
    check_parents(out)
    if args.no_special and args.special:
        raise GptlabError("--special and --no-special contradict each other")
    specials = [] if args.no_special else (args.special or ["<|endoftext|>"])
    if args.workers is not None and args.workers < 1:
        raise GptlabError(f"--workers must be at least 1, got {args.workers}")
    files = _training_files(args)
    record, kept = _claim_out(out, FILE_NAME, files, args)
    if kept:
        return 0
    start = time.perf_counter()
    tokenizer = Tokenizer.train(
        **_documents(files),
        vocab_size=args.vocab_size,
        pattern=pattern,
        special_tokens=specials,
        workers=args.workers,
        progress=sys.stderr.isatty(),
    )
    seconds = time.perf_counter() - start
    path = tokenizer.save(out)
    save_record(out, record)
    size = sum(f.stat().st_size for f in files)
    note = "" if tokenizer.vocab_size == args.vocab_size else f" (the corpus supports only {len(tokenizer.merges)} merges)"
    print(f"trained {tokenizer} on {len(files)} files ({size / 1e6:.1f} MB) in {seconds:.1f} s{note}")
    print(f"saved {path}")
    return 0


def _training_files(args: argparse.Namespace) -> list[Path]:
    """--input's text files (binary ones in its folders skipped, and said) and --corpus's; the reader data prepare uses."""
    from gptlab.data.corpus import corpus_files
    from gptlab.data.sources import scan_inputs

    scanned = scan_inputs(args.input)
    if scanned.binary:
        print(scanned.skipped_line())
    return scanned.files + (corpus_files(args.corpus) if args.corpus else [])


def _documents(files: list[Path]) -> dict:
    """{"files": text files, "texts": the records of .jsonl/.parquet files}: each read as data prepare reads it."""
    from gptlab.data.sources import RECORD_SUFFIXES, open_source

    records = [str(path) for path in files if path.suffix in RECORD_SUFFIXES]
    return {"files": [path for path in files if path.suffix not in RECORD_SUFFIXES], "texts": open_source(records) if records else None}


def _claim_out(out: Path, name: str, files: list[Path], args: argparse.Namespace) -> tuple[dict, bool]:
    """(the training record, whether --out already holds this very tokenizer); a folder holding anything else is refused."""
    from gptlab.tokenizer.train_record import RECORD_FILE, reuse_or_refuse, training_record

    check_out_dir(out, [name, RECORD_FILE, f".{name}.*.tmp", f".{RECORD_FILE}.*.tmp"], flag="--out")
    settings = {key: getattr(args, key) for key in TRAIN_SETTINGS}
    record = training_record(name, files, settings)
    kept = reuse_or_refuse(out, record, force=args.force)
    if kept:
        print(f"kept {out / name}: trained earlier from the same inputs and settings (--force retrains it)")
    return record, kept


def _refuse_options(args: argparse.Namespace, style: str, **flags: str) -> None:
    given = next((flag for name, flag in flags.items() if getattr(args, name) not in (None, False)), None)
    if given is not None:
        raise GptlabError(f"{given} does not apply to --style {style}; drop it or pick the other --style")


def run_train_sentencepiece(args: argparse.Namespace) -> int:
    from gptlab.tokenizer.sp_model import write_model
    from gptlab.tokenizer.sp_train import SentencePieceTrainerConfig, train_with_config
    from gptlab.tokenizer.train_record import save_record

    _refuse_options(args, "sentencepiece", pattern="--pattern", regex="--regex", workers="--workers")
    if args.no_special and args.special:
        raise GptlabError("--special and --no-special contradict each other")
    name = "tokenizer.model"
    out = Path(args.out)
    check_parents(out)
    options = {"byte_fallback": args.byte_fallback, "character_coverage": args.character_coverage, "normalizer": args.normalizer}
    config = SentencePieceTrainerConfig(
        vocab_size=args.vocab_size,
        control_symbols=tuple([] if args.no_special else (args.special or ["<s>", "</s>"])),
        **{key: value for key, value in options.items() if value is not None},
    )
    files = _training_files(args)
    record, kept = _claim_out(out, name, files, args)
    if kept:
        return 0
    start = time.perf_counter()
    model = train_with_config(config, **_documents(files), progress=sys.stderr.isatty())
    seconds = time.perf_counter() - start
    path = write_model(model, out / name)
    save_record(out, record)
    size = sum(f.stat().st_size for f in files)
    note = "" if len(model.pieces) == args.vocab_size else f" (the corpus supports only {len(model.pieces)} pieces)"
    print(f"trained a SentencePiece BPE model of {len(model.pieces)} pieces on {len(files)} files ({size / 1e6:.1f} MB) in {seconds:.1f} s{note}")
    print(f"saved {path}")
    return 0


def _write_output(text: str, out: str | None) -> None:
    if out:
        atomic_write_text(out, text)
    else:
        sys.stdout.write(text)


def run_encode(args: argparse.Namespace) -> int:
    from gptlab.tokenizer.pretrained import load_any

    if args.allow_special and args.special_as_text:
        raise GptlabError("--allow-special and --special-as-text contradict each other")
    check_out_file(args.out)
    tokenizer = load_any(args.tokenizer)
    options = {"allowed_special": "all"} if args.allow_special else {}
    if args.special_as_text:
        options = {"disallowed_special": ()}
    lines = [" ".join(map(str, tokenizer.encode(text, **options))) + "\n" for text in read_inputs(args.files)]
    _write_output("".join(lines), args.out)
    return 0


def run_decode(args: argparse.Namespace) -> int:
    from gptlab.tokenizer.id_text import id_sources, parse_ids
    from gptlab.tokenizer.pretrained import load_any

    check_out_file(args.out)
    sources = id_sources(args.inputs)
    tokenizer = load_any(args.tokenizer)
    texts = [tokenizer.decode(parse_ids(text, where)) for where, text in sources]
    _write_output("\n".join(texts), args.out)
    return 0


def run_show(args: argparse.Namespace) -> int:
    from gptlab.tokenizer.pretrained import load_any
    from gptlab.tokenizer.show import render_tokens, token_stats

    tokenizer = load_any(args.tokenizer)
    path = Path(args.text)
    text = read_inputs([args.text])[0] if path.is_file() else args.text
    ids = tokenizer.encode(text, allowed_special="all")
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print(render_tokens(tokenizer, ids, color=color))
    if args.ids:
        print(" ".join(map(str, ids)))
    print(f"-- {token_stats(text, ids)}")
    return 0


def run_view(args: argparse.Namespace) -> int:
    import uvicorn

    from gptlab.cli.serve import LOOPBACK, bind, say
    from gptlab.serve.token_view import build_token_view, default_tokenizers, load_tokenizers

    if not 0 <= args.port <= 65535:
        raise GptlabError(f"--port must be in 0..65535, got {args.port}")
    tokenizers = load_tokenizers(args.tokenizers) if args.tokenizers else default_tokenizers()
    sock = bind(args.host, args.port)
    try:
        shown = f"[{args.host}]" if ":" in args.host else args.host
        say(f"gptlab tokenizer view: {', '.join(tokenizers.names)}")
        say(f"  open http://{shown}:{sock.getsockname()[1]}/tokenizer/   (Ctrl-C stops)")
        if args.host not in LOOPBACK:
            say(f"  warning: listening on {args.host}: anyone who reaches this port can use the viewer")
        config = uvicorn.Config(build_token_view(tokenizers), log_level="warning", timeout_graceful_shutdown=3, access_log=False)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
