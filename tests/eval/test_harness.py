"""The lm-eval adapter against direct computations with the model: scores, rolling windows, generation, a local task."""

import json

import datasets
import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance  # lm-eval is a dev extra: make test installs it
from lm_eval.utils import get_rolling_token_windows

from gptlab.eval.harness import GptlabLM, cut_at_stops, evaluate_harness, results_table  # noqa: E402
from gptlab.infer import SamplingConfig, generate  # noqa: E402
from gptlab.model import GPT, preset  # noqa: E402
from gptlab.runtime import GptlabError  # noqa: E402
from gptlab.tokenizer import Tokenizer  # noqa: E402

BLOCK = preset("gpt2-tiny").block_size  # 64
LONG_TEXT = (
    "Now is the winter of our discontent made glorious summer by this sun of York; and all the clouds that "
    "loured upon our house in the deep bosom of the ocean buried. Now are our brows bound with victorious "
    "wreaths, our bruised arms hung up for monuments, our stern alarums changed to merry meetings, our dreadful "
    "marches to delightful measures. Grim-visaged war hath smooth'd his wrinkled front; and now, instead of "
    "mounting barded steeds to fright the souls of fearful adversaries, he capers nimbly in a lady's chamber."
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from gptlab.data.corpus import shakespeare_documents

    trained = Tokenizer.train([shakespeare_documents()[0][:20_000]], vocab_size=preset("gpt2-tiny").vocab_size)
    directory = tmp_path_factory.mktemp("tokenizer")
    trained.save(directory)
    return Tokenizer.load(directory)


@pytest.fixture(scope="module")
def model():
    """Weights of std 0.1 (5x GPT-2's init): varied greedy text, where the usual init repeats one token."""
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny")).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.1)
    return model


def reference_score(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """One example alone, unbatched: log_softmax over the model's logits, summed over the continuation."""
    tokens = (context + continuation)[-(BLOCK + 1) :]
    with torch.no_grad():
        logits, _ = model(torch.tensor([tokens[:-1]]))
    logprobs = F.log_softmax(logits[0, -len(continuation) :].double(), dim=-1)
    targets = torch.tensor(continuation)
    total = logprobs.gather(1, targets[:, None]).sum().item()
    return total, bool((logprobs.argmax(-1) == targets).all())


def encode_pair(tokenizer, eot: int, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's causal split: trailing spaces move to the continuation; ids of the whole minus the context's."""
    if not context:
        return [eot], tokenizer.encode(continuation)
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    context_ids = tokenizer.encode(context)
    return context_ids, tokenizer.encode(context + continuation)[len(context_ids) :]


def request(kind: str, *args) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_harness_loglikelihood_equals_each_example_scored_alone(model, tokenizer):
    lm = GptlabLM(model, tokenizer, batch_size=2)
    pairs = [
        ("The quick brown fox", " jumps over"),
        ("Now is the winter ", "of our discontent"),  # trailing space moves to the continuation
        ("", "Hello there"),  # empty context: conditioned on end-of-text
        ("A", " b c d e f g h"),
        (LONG_TEXT, " made glorious"),  # longer than the context: cut on the left
    ]
    results = lm.loglikelihood([request("loglikelihood", *pair) for pair in pairs])
    for (context, continuation), (logprob, greedy) in zip(pairs, results):
        expected = reference_score(model, *encode_pair(tokenizer, tokenizer.eot_id, context, continuation))
        assert logprob == pytest.approx(expected[0], abs=1e-5)
        assert greedy == expected[1]


def test_harness_model_built_by_lm_eval_from_strings_loads_the_model_and_the_tokenizer_beside_it(model, tokenizer, tmp_path):
    from lm_eval.api.registry import get_model

    from gptlab.model.io import save_model

    save_model(model, tmp_path / "model")
    tokenizer.save(tmp_path / "model" / "tokenizer")
    built = get_model("gptlab").create_from_arg_string(f"pretrained={tmp_path / 'model'}", {"batch_size": 3, "device": "cpu"})
    pairs = [("The quick brown fox", " jumps over"), ("", "Hello there")]
    expected = GptlabLM(model, tokenizer).loglikelihood([request("loglikelihood", *pair) for pair in pairs])
    assert built.batch_size == 3
    results = built.loglikelihood([request("loglikelihood", *pair) for pair in pairs])
    assert [logprob for logprob, _ in results] == pytest.approx([logprob for logprob, _ in expected], abs=1e-6)


def test_harness_rejects_auto_batch_size_and_unknown_tasks_with_the_fix(model, tokenizer, tmp_path):
    with pytest.raises(GptlabError, match="whole number"):
        GptlabLM(model, tokenizer, batch_size="auto")
    with pytest.raises(GptlabError, match="unknown lm-eval tasks: no_such_task"):
        evaluate_harness(model, tokenizer, ["no_such_task"], include_path=tmp_path, include_defaults=False)


def test_harness_loglikelihood_is_greedy_when_the_continuation_is_the_argmax(model, tokenizer):
    lm = GptlabLM(model, tokenizer, batch_size=4)
    context = tokenizer.encode("To be, or not to be")
    with torch.no_grad():
        best = int(model(torch.tensor([context]))[0][0, -1].argmax())
    second = (best + 1) % model.config.vocab_size
    results = lm._loglikelihood_tokens([(("", ""), context, [best]), (("", ""), context, [second])])
    assert [greedy for _, greedy in results] == [True, False]
    assert results[0][0] > results[1][0]


def test_harness_loglikelihood_rolling_equals_lm_eval_windows_scored_by_hand(model, tokenizer):
    lm = GptlabLM(model, tokenizer, batch_size=3)
    short, long = "Now is the winter of our discontent", LONG_TEXT
    eot = tokenizer.eot_id
    short_ids, long_ids = tokenizer.encode(short), tokenizer.encode(long)
    assert len(short_ids) < BLOCK and len(long_ids) > 2 * BLOCK  # one window, and three

    with torch.no_grad():
        logits, _ = model(torch.tensor([[eot] + short_ids[:-1]]))
    short_expected = F.log_softmax(logits[0].double(), -1).gather(1, torch.tensor(short_ids)[:, None]).sum().item()
    long_expected = 0.0
    for inputs, targets in get_rolling_token_windows(long_ids, prefix_token=eot, max_seq_len=BLOCK, context_len=1):
        with torch.no_grad():
            logits, _ = model(torch.tensor([inputs]))
        logprobs = F.log_softmax(logits[0, -len(targets) :].double(), -1)
        long_expected += logprobs.gather(1, torch.tensor(targets)[:, None]).sum().item()

    results = lm.loglikelihood_rolling([request("loglikelihood_rolling", short), request("loglikelihood_rolling", long)])
    assert results == pytest.approx([short_expected, long_expected], abs=1e-4)


def greedy_text(model, tokenizer, prompt: str, new_tokens: int) -> str:
    config = SamplingConfig(max_new_tokens=new_tokens, temperature=0, stop_tokens=(tokenizer.eot_id,))
    (tokens,) = generate(model, [tokenizer.encode(prompt)], config, truncate=True)
    return tokenizer.decode(tokens)


def middle_stop(text: str) -> str:
    """Two letters that first occur after the start of `text`: a stop string that cuts it short."""
    for i in range(2, len(text) - 1):
        if text[i : i + 2].isascii() and text[i : i + 2].isalpha() and text.index(text[i : i + 2]) == i:
            return text[i : i + 2]
    raise AssertionError(f"no stop string to pick in {text!r}")


def test_harness_generate_until_stops_at_the_until_string_like_greedy_generate(model, tokenizer):
    lm = GptlabLM(model, tokenizer, batch_size=2)
    prompts = ["Now is the winter", "To be, or not to be", LONG_TEXT]  # the last is cut on the left to fit
    full = [greedy_text(model, tokenizer, prompt, 24) for prompt in prompts]
    stops = [middle_stop(text) for text in full]
    requests = [request("generate_until", prompt, {"until": [stop], "max_gen_toks": 24, "do_sample": False})
                for prompt, stop in zip(prompts, stops)]
    requests.append(request("generate_until", prompts[1], {"until": "never seen \x00", "max_gen_toks": 5}))
    outputs = lm.generate_until(requests)
    assert outputs[:3] == [text[: text.index(stop)] for text, stop in zip(full, stops)]
    assert outputs[3] == greedy_text(model, tokenizer, prompts[1], 5)  # max_gen_toks respected
    assert all(stop not in output for stop, output in zip(stops, outputs))


def test_cut_at_stops_keeps_the_text_before_the_earliest_stop():
    assert cut_at_stops("4\n\nQ: 5", ["Q:", "\n\n"]) == "4"
    assert cut_at_stops("no stop here", ["</s>", ""]) == "no stop here"


TASK_YAML = """\
task: gptlab_tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
DOCS = [
    {"question": "The sun rises in the", "choices": ["east", "west", "sea"], "answer": 0},
    {"question": "Now is the winter of our", "choices": ["discontent", "summer", "house"], "answer": 0},
    {"question": "Two and two make", "choices": ["three", "four", "five"], "answer": 1},
    {"question": "A horse, a horse, my kingdom for a", "choices": ["horse", "crown", "cow"], "answer": 0},
    {"question": "To be, or not to", "choices": ["be", "see", "go"], "answer": 0},
    {"question": "The lady doth protest too", "choices": ["little", "much", "loud"], "answer": 1},
]


def test_evaluate_harness_reports_the_accuracy_of_a_local_task_from_its_loglikelihoods(model, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # read once, at import
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tmp_path / "tiny_choice.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (tasks / "tiny_choice.yaml").write_text(TASK_YAML.format(data=data, cache=tmp_path / "datasets"))

    results = evaluate_harness(model, tokenizer, ["gptlab_tiny_choice"], include_path=tasks, include_defaults=False,
                               batch_size=4, bootstrap_iters=0, log_samples=True)

    right = 0
    for doc in DOCS:
        scores = [reference_score(model, *encode_pair(tokenizer, tokenizer.eot_id, doc["question"], " " + choice))[0]
                  for choice in doc["choices"]]
        right += max(range(len(scores)), key=lambda k: (scores[k], -k)) == doc["answer"]
    assert results["results"]["gptlab_tiny_choice"]["acc,none"] == pytest.approx(right / len(DOCS))
    assert "gptlab_tiny_choice" in results_table(results)
    samples = sorted(results["samples"]["gptlab_tiny_choice"], key=lambda sample: sample["doc_id"])
    for sample, doc in zip(samples, DOCS):
        logprobs = [float(logprob) for logprob, _ in sample["filtered_resps"]]
        expected = [reference_score(model, *encode_pair(tokenizer, tokenizer.eot_id, doc["question"], " " + choice))[0]
                    for choice in doc["choices"]]
        assert logprobs == pytest.approx(expected, abs=1e-5)


def test_harness_answers_exactly_as_lm_eval_hugging_face_adapter_on_the_same_weights(model, tokenizer, tmp_path):
    """The trusted reference: lm-eval's own HFLM, on our model exported to transformers with our tokenizer."""
    from lm_eval.models.huggingface import HFLM

    from gptlab.model.hf import export_hf

    export_hf(model, tmp_path, eos_token_id=tokenizer.eot_id)
    tokenizer.save_huggingface(tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}))
    theirs, ours = HFLM(pretrained=str(tmp_path), batch_size=2, device="cpu"), GptlabLM(model, tokenizer, batch_size=2)

    scores = [request("loglikelihood", *pair) for pair in [("The quick brown fox", " jumps over"),
                                                            ("Now is the winter ", "of our discontent"),
                                                            ("", "Hello there"), (LONG_TEXT, " made glorious")]]
    documents = [request("loglikelihood_rolling", text) for text in ["Now is the winter of our discontent", LONG_TEXT]]
    generations = [request("generate_until", prompt, {"until": ["ea"], "max_gen_toks": 20, "do_sample": False})
                   for prompt in ["Now is the winter", "To be, or not to be", LONG_TEXT]]
    expected, got = theirs.loglikelihood(scores), ours.loglikelihood(scores)
    assert [logprob for logprob, _ in got] == pytest.approx([logprob for logprob, _ in expected], abs=1e-4)
    assert [greedy for _, greedy in got] == [greedy for _, greedy in expected]
    assert ours.loglikelihood_rolling(documents) == pytest.approx(theirs.loglikelihood_rolling(documents), rel=1e-5)
    assert ours.generate_until(generations) == theirs.generate_until(generations)


def test_cli_eval_harness_runs_a_local_task_on_a_checkpoint(model, tokenizer, tmp_path, monkeypatch, capsys):
    from gptlab.cli.main import main
    from gptlab.model.io import save_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tmp_path / "tiny_choice.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (tasks / "tiny_choice.yaml").write_text(TASK_YAML.format(data=data, cache=tmp_path / "datasets"))
    checkpoint = save_model(model, tmp_path / "checkpoint")
    tokenizer.save(checkpoint / "tokenizer")
    direct = evaluate_harness(model, tokenizer, ["gptlab_tiny_choice"], include_path=tasks, include_defaults=False,
                              batch_size=4, bootstrap_iters=0)
    assert main(["eval", "--checkpoint", str(checkpoint), "--harness", "gptlab_tiny_choice",
                 "--harness-include", str(tasks), "--batch-size", "4", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "gptlab_tiny_choice" in out
    row = next(line for line in out.splitlines() if line.startswith("|gptlab_tiny_choice"))
    value = float(row.split("|")[7])  # the table's Value column
    assert value == pytest.approx(direct["results"]["gptlab_tiny_choice"]["acc,none"], abs=1e-4)
