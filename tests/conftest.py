"""Suite-wide settings.

Hypothesis draws examples from a seed fixed per test by default, so a run of `make test` (and CI)
is reproducible: a red run is red again. `HYPOTHESIS_PROFILE=explore make test` draws fresh
random examples on each run, to hunt for new failures.

Under pytest-xdist (`make test` runs 2 workers on 2 cores) each worker, and every process it starts, computes on
one thread: two workers' thread pools on the same cores wait on each other's descheduled threads, which made the
tiny models' steps up to 100x slower whenever both workers trained at once.
"""

import os

import pytest
from hypothesis import settings

settings.register_profile("default", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config):
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


def pytest_xdist_make_scheduler(config, log):
    """`make test`'s `--dist loadgroup`, with a scheduler that fails the test a crashed worker died on and goes on
    (tests/xdist_crash.py); other --dist modes keep xdist's own."""
    if config.getvalue("dist") == "loadgroup":
        from tests.xdist_crash import CrashSafeLoadGroupScheduling

        return CrashSafeLoadGroupScheduling(config, log)
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup`, give each test of an xdist_group the `@group` id suffix that sends the group to one
    worker. pytest-xdist 3.8 writes it into `item._nodeid`, which pytest 9 no longer reads (the id is `item._id`), so
    without this every group is split across the workers and each worker builds the group's shared fixture again."""
    if not getattr(config.option, "loadgroup", False) or not items or not hasattr(items[0], "_id"):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = {str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")) for mark in item.iter_markers("xdist_group")}
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """A small prepared dataset: 6 Shakespeare works, a 512-token BPE (`tokenizer/`) and its shards (`data/`)."""
    from gptlab.data.corpus import shakespeare_documents
    from gptlab.data.prepare import PrepareConfig, prepare_shards
    from gptlab.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("prepared")
    documents = shakespeare_documents()[:6]
    tokenizer = Tokenizer.train(documents, vocab_size=512)
    tokenizer.save(root / "tokenizer")
    prepare_shards("shakespeare", tokenizer, root / "data", PrepareConfig(val=0.1, shard_tokens=200_000, progress=False))
    return root


def with_ctrl_c():
    """preexec_fn for a child that a test sends Ctrl-C (SIGINT): in a terminal SIGINT is live, but a test run
    started in the background (make test &, some CI runners) inherits it ignored, and Python keeps it so."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="session")
def chat_model(prepared, tmp_path_factory):
    """A tiny untrained chat model folder (`model.safetensors`, `config.json`, `tokenizer/` with the chat tokens):
    what `gptlab chat`, `gptlab serve` and the web chat load. Its replies are noise, but the same noise every time."""
    import torch

    from gptlab.chat import add_chat_tokens
    from gptlab.model import GPT, preset
    from gptlab.model.io import save_model
    from gptlab.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("chat_model")
    tokenizer = add_chat_tokens(Tokenizer.load(prepared / "tokenizer"))
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=256))
    save_model(model, folder)
    tokenizer.save(folder / "tokenizer")
    return folder


TOOL_QUESTIONS = 8  # the tool model's training questions: 2-digit products, the first of the arithmetic task's train split


@pytest.fixture(scope="session")
def tool_model(prepared, tmp_path_factory):
    """A tiny chat model folder trained (seconds, by heart) to answer its TOOL_QUESTIONS through the calculator:
    `<|call|>calculator {"expression": "a * b"}<|end|>`, then the result it is fed. What the tool loop's front ends
    (gptlab chat, the server, the web chat) need to see a real call from a real model."""
    import torch

    from gptlab.chat import ChatFormat, add_chat_tokens
    from gptlab.chat.tasks import Arithmetic
    from gptlab.model import GPT, preset
    from gptlab.model.io import save_model
    from gptlab.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("tool_model")
    tokenizer = add_chat_tokens(Tokenizer.load(prepared / "tokenizer"))
    chat = ChatFormat(tokenizer)
    task = Arithmetic(digits=2, ops="*", tools=1, work=0)
    rendered = [chat.render(task.conversation(example)) for example in task.examples("train", TOOL_QUESTIONS)]
    width = max(len(r.ids) for r in rendered)
    x = torch.tensor([r.ids[:-1] + [0] * (width - len(r.ids)) for r in rendered])
    y = torch.tensor([[i if m else -100 for i, m in zip(r.ids[1:], r.mask[1:])] + [-100] * (width - len(r.ids)) for r in rendered])
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny", vocab_size=tokenizer.vocab_size, block_size=256))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_model(model.eval(), folder)
    tokenizer.save(folder / "tokenizer")
    return folder


@pytest.fixture(scope="session")
def hf_modules_cache(tmp_path_factory):
    """transformers copies a folder's modeling code (trust_remote_code) into HF_MODULES_CACHE before importing it as
    the package `transformers_modules`, which it binds to that folder once: so one folder per test process, under tmp."""
    import transformers.dynamic_module_utils as dynamic

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path_factory.mktemp("hf_modules")))
        yield
