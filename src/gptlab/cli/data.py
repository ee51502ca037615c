"""`gptlab data get`: built-in corpora. (Shards and the loader come with the data stage.)"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from gptlab.runtime import GptlabError


def register(stages) -> None:
    parser = stages.add_parser("data", help="corpora and token shards")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=type(parser))
    get = verbs.add_parser("get", help="fetch a built-in corpus into the cache and print where it is")
    get.add_argument("name", choices=["shakespeare"])
    get.add_argument("--out", metavar="DIR", help="also copy the documents (one .txt per work) here")
    get.set_defaults(handler=run_get)


def run_get(args: argparse.Namespace) -> int:
    from gptlab.data.corpus import corpus_files

    files = corpus_files(args.name)
    size = sum(path.stat().st_size for path in files)
    print(f"{args.name}: {len(files)} documents, {size / 1e6:.2f} MB in {files[0].parent}")
    if args.out:
        out = Path(args.out)
        if out.exists() and any(out.iterdir()):
            raise GptlabError(f"{out} exists and is not empty; choose an empty or new directory")
        out.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copyfile(path, out / path.name)
        print(f"copied to {out}")
    return 0
