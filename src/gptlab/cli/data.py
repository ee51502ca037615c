"""`gptlab data get` (built-in corpora), `gptlab data curate` (raw web data to clean text) and `gptlab data prepare`
(token shards)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gptlab.runtime import check_out_dir


def register(stages) -> None:
    parser = stages.add_parser("data", help="corpora and token shards")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(parser))
    get = verbs.add_parser("get", help="fetch a built-in corpus into the cache and print where it is")
    get.add_argument("name", choices=["shakespeare"])
    get.add_argument("--out", metavar="DIR", help="also copy the documents (one .txt per work) here")
    get.set_defaults(handler=run_get)

    curate = verbs.add_parser(
        "curate", help="raw web data (WARC, WET, HTML, JSONL, parquet) to clean, deduplicated text shards (resumable)",
        description="Extract, filter (language, Gopher rules, repetition, classifiers), mask PII and deduplicate (exact "
        "documents, MinHash, exact lines) into OUT/shards, which `gptlab data prepare OUT/shards` reads. Rerunning the same "
        "command resumes.",
    )
    curate.add_argument("inputs", nargs="+", metavar="INPUT", help="files, directories or globs (.warc[.gz], .wet[.gz], .html, "
                        ".jsonl[.gz], .parquet, .txt)")
    curate.add_argument("--out", required=True, metavar="DIR", help="the curation's folder: shards/, report.json, report.txt "
                        "(new or empty, or one this command made: the same inputs and config resume it)")
    curate.add_argument("--config", metavar="TOML", help="stage settings (default: every stage at its defaults; "
                        "docs/curate.toml lists every setting)")
    curate.add_argument("--workers", type=int, metavar="N", help="processes for the per-document stages, at least 1 (default: one per core)")
    curate.add_argument("--force", action="store_true", help="start over: clear the curation in --out (its own files only)")
    curate.set_defaults(handler=run_curate)

    quality = verbs.add_parser(
        "train-quality", help="train a quality classifier on your own good and bad examples, for curate's [quality] stage",
        description="Hashed word 1-2-gram logistic regression (GPT-3's quality filter): POSITIVES are examples of the text "
        "to keep (e.g. pages Wikipedia links to), --negatives of the rest (e.g. random crawl pages). Any input curate reads.",
    )
    quality.add_argument("positives", nargs="+", metavar="POSITIVE")
    quality.add_argument("--negatives", nargs="+", required=True, metavar="NEGATIVE")
    quality.add_argument("--out", required=True, metavar="FILE", help="the classifier (.npz), for [quality] path = FILE")
    quality.add_argument("--text-field", default="text", help="JSONL / parquet field holding the text (default text)")
    quality.add_argument("--force", action="store_true", help="replace FILE, an earlier classifier")
    quality.set_defaults(handler=run_train_quality)

    prepare = verbs.add_parser(
        "prepare",
        help="tokenize a source into shuffled token shards + manifest (resumable)",
        description="SOURCE: shakespeare | files, globs, directories (every text file, .jsonl, .parquet; binary files are "
        "skipped) | hf:NAME[:CONFIG]",
    )
    prepare.add_argument("source", nargs="+", metavar="SOURCE")
    prepare.add_argument("-t", "--tokenizer", required=True, metavar="DIR",
                         help="tokenizer folder or file (gptlab's, Hugging Face's, a SentencePiece .model), or gpt2 / cl100k_base / o200k_base")
    prepare.add_argument("--out", required=True, metavar="DIR")
    prepare.add_argument(
        "--val", type=_val, metavar="X",
        help="val split: a fraction of documents (default 0.01, at least one document) or a token count (1000000, 5M); 0: none",
    )
    prepare.add_argument(
        "--val-from", nargs="+", metavar="SOURCE",
        help="the val split is exactly these documents (same SOURCE syntax), the SOURCE's are train; --val must be 0 or unset",
    )
    prepare.add_argument("--shard-tokens", type=_count, default=100_000_000, metavar="N", help="tokens per shard (default 100M)")
    prepare.add_argument("--seed", type=int, default=1337, help="seed of the document shuffle")
    prepare.add_argument("--no-shuffle", action="store_true", help="keep the source's document order")
    prepare.add_argument("--text-field", default="text", help=".jsonl field / .parquet or dataset column (default text)")
    prepare.add_argument("--separator", help=".txt: split files into documents on this string (default: a file is a document)")
    prepare.add_argument("--split", default="train", help="Hugging Face dataset split (default train)")
    prepare.add_argument("--workers", type=int, help="tokenizing processes (default: all cores)")
    prepare.add_argument("--force", action="store_true", help="replace prepared data (in --out) made with other arguments")
    prepare.add_argument("--quiet", action="store_true", help="no progress bar")
    prepare.set_defaults(handler=run_prepare)


def _count(text: str) -> int:
    """1000, 1_000, 5K, 100M, 2B."""
    multiplier = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1:].upper(), 1)
    number = text[:-1] if multiplier > 1 else text
    try:
        value = float(number.replace("_", "")) * multiplier
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value != int(value) or value < 0:
        raise argparse.ArgumentTypeError(f"not a whole count: {text!r}")
    return int(value)


def _val(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return float(_count(text))
    if value < 0 or (value >= 1 and value != int(value)):
        raise argparse.ArgumentTypeError(f"--val takes a fraction in [0, 1) or a whole token count, not {text!r}")
    return value


def run_get(args: argparse.Namespace) -> int:
    from gptlab.data.corpus import copy_corpus, corpus_files

    if args.out:  # before the download: a wrong --out costs nothing
        check_out_dir(args.out, ["*.txt", ".*.txt.*.tmp"], flag="--out")
    files = corpus_files(args.name)
    size = sum(path.stat().st_size for path in files)
    print(f"{args.name}: {len(files)} documents, {size / 1e6:.2f} MB in {files[0].parent}")
    if args.out:
        copied = copy_corpus(files, Path(args.out))
        kept = f" ({len(files) - copied} were there already)" if copied < len(files) else ""
        print(f"copied {copied} files to {args.out}{kept}")
    return 0


def run_prepare(args: argparse.Namespace) -> int:
    from gptlab.data.prepare import PrepareConfig, prepare_shards
    from gptlab.data.sources import SourceOptions, open_source
    from gptlab.data.workspace import WORK_DIR
    from gptlab.tokenizer.pretrained import load_any

    tokenizer = load_any(args.tokenizer)
    options = SourceOptions(text_field=args.text_field, separator=args.separator, split=args.split)
    source = open_source(args.source, options)
    val_source = open_source(args.val_from, options) if args.val_from else None
    for each in (source, val_source):
        if getattr(each, "skipped", ""):  # binary files in the folders given
            print(each.skipped)
    config = PrepareConfig(
        val=args.val, shard_tokens=args.shard_tokens, seed=args.seed, shuffle=not args.no_shuffle,
        workers=args.workers, progress=not args.quiet and sys.stderr.isatty(),
    )
    try:
        result = prepare_shards(source, tokenizer, args.out, config, force=args.force, val_source=val_source)
    except KeyboardInterrupt:
        if (Path(args.out) / WORK_DIR).is_dir():
            print(f"gptlab: the work so far is kept in {Path(args.out) / WORK_DIR}; the same command resumes it", file=sys.stderr)
        raise
    print(summary(result))
    return 0


def summary(result) -> str:
    manifest = result.manifest
    documents = manifest["documents"]
    lines = [
        f"{result.status} {result.out} in {result.seconds:.1f} s: {manifest['dtype']} shards of "
        f"{manifest['shard_tokens']:,} tokens, tokenizer {manifest['tokenizer']['fingerprint']}",
        f"  documents: {documents['read']:,} read, {documents['kept']:,} kept, {documents['empty_skipped']:,} empty skipped, "
        f"{documents['utf8_replaced']:,} with bytes that were not UTF-8 (replaced with U+FFFD)",
    ]
    for split, entry in manifest["splits"].items():
        lines.append(f"  {split}: {entry['tokens']:,} tokens, {entry['documents']:,} documents, {len(entry['shards'])} shards")
    if "val" not in manifest["splits"]:
        reason = manifest.get("val_skipped") or "--val 0"
        lines.append(f"  val: none ({reason})")
    if result.rewritten:
        lines.append(f"  rewrote what was wrong: {'; '.join(result.rewritten)}")
    return "\n".join(lines)


def run_curate(args: argparse.Namespace) -> int:
    from gptlab.curate.config import load_config
    from gptlab.curate.pipeline import WORK, curate, summary

    config = load_config(args.config)
    try:
        report = curate(args.inputs, args.out, config, workers=args.workers, force=args.force)
    except KeyboardInterrupt:
        if (Path(args.out) / WORK).is_dir():
            print(f"gptlab: the work so far is kept in {args.out}; the same command resumes it", file=sys.stderr)
        raise
    print(summary(report))
    print(f"wrote {args.out}/shards and {args.out}/report.json; tokenize with "
          f"`gptlab data prepare {args.out}/shards -t TOKENIZER --out DIR`")
    return 0


def _texts(inputs: list[str], text_field: str) -> list[str]:
    """Every document's text in the inputs, HTML pages extracted as curate extracts them."""
    from gptlab.curate.extract import Extract, ExtractConfig
    from gptlab.curate.readers import expand_inputs, read_documents

    extract = Extract(ExtractConfig())
    return [document.text for path in expand_inputs(inputs)
            for document in extract.run(read_documents(path, text_field=text_field))]


def run_train_quality(args: argparse.Namespace) -> int:
    from gptlab.curate.classifier import held_out_accuracy, is_classifier_file, train_quality_classifier
    from gptlab.runtime import GptlabError

    out = Path(args.out)
    if out.exists() and not is_classifier_file(out):  # --force replaces an earlier classifier, never another file
        raise GptlabError(f"--out {out} exists and is not a quality classifier (it is never overwritten); pass another --out")
    if out.exists() and not args.force:
        raise GptlabError(f"--out {out} holds an earlier quality classifier; pass --force to replace it, or another --out")
    if out.suffix != ".npz":
        raise GptlabError(f"--out {out}: the classifier is saved as .npz; name the file e.g. {out.with_suffix('.npz')}")
    positives, negatives = _texts(args.positives, args.text_field), _texts(args.negatives, args.text_field)
    classifier = train_quality_classifier(positives, negatives)
    check = held_out_accuracy(positives, negatives)
    classifier.training.update(check or {})
    classifier.save(out)
    training = classifier.training
    held = (f", held-out accuracy {check['held_out_accuracy']:.3f} on {check['held_out_examples']:,}" if check else
            ", too few examples to hold some out")
    print(f"trained on {len(positives):,} positives and {len(negatives):,} negatives "
          f"(training accuracy {training['training_accuracy']:.3f}{held}); saved {out}: "
          f"use it with [quality] path = \"{out}\" in curate's --config")
    if check and check["held_out_accuracy"] < check["chance_bound"]:
        print(f"gptlab: warning: the held-out accuracy {check['held_out_accuracy']:.3f} is at chance (a coin scores up to "
              f"{check['chance_bound']:.3f} on {check['held_out_examples']:,} examples): this classifier cannot tell the "
              "POSITIVES from the --negatives; give more examples, or sets that differ in quality", file=sys.stderr)
    return 0
