"""The likelihood suite against lm-evaluation-harness's own Hugging Face adapter (HFLM) on the same model and text.

A tiny random GPT-2 is made with transformers and saved with a tokenizer trained here; gptlab loads the folder
(gptlab.model.hf.from_pretrained) and so does lm-eval (HFLM). Every request the suite renders, for every task
kind, goes to HFLM.loglikelihood as text: the log-likelihoods agree within 1e-4, and so do the greedy flags and
each example's acc and acc_norm as lm-eval's multiple-choice process_results computes them (argmax of the
log-likelihoods, and of them over len(choice) in characters).
"""

import huggingface_hub
import numpy as np
import pytest
import torch
import transformers
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from gptlab.eval.tasks.core import CORE_TASKS, TaskSpec, evaluate_task, render_requests
from gptlab.eval.tasks.native import convert_commonsense_qa, convert_openbookqa, convert_piqa
from gptlab.model.hf import from_pretrained
from gptlab.tokenizer import Tokenizer

ATOL = 1e-4

ARC = [
    {"query": "Question: Which gas do plants take in from the air?\nAnswer:", "choices": ["oxygen", "carbon dioxide", "helium", "steam"], "gold": 1},
    {"query": "Question: What makes a shadow?\nAnswer:", "choices": ["light blocked by an object", "sound", "heat", "wind"], "gold": 0},
    {"query": "Question: Which is a mammal?\nAnswer:", "choices": ["shark", "frog", "whale", "crow"], "gold": 2},
    {"query": "Question: Water freezes at what temperature?\nAnswer:", "choices": ["100 degrees", "50 degrees", "10 degrees", "0 degrees"], "gold": 3},
]
HELLASWAG = [
    {"query": "A man is sitting on a roof. He", "choices": ["starts pulling up roofing.", "is eating a cake.", "falls asleep.", "sings to a dog."], "gold": 0},
    {"query": "A woman holds a violin. She", "choices": ["puts it in the oven.", "begins to play a song.", "throws it away.", "paints it red."], "gold": 1},
    {"query": "The boy kicks the ball. The ball", "choices": ["turns into a bird.", "speaks loudly.", "rolls into the goal.", "melts."], "gold": 2},
    {"query": "Two dogs run in a park. They", "choices": ["read a book.", "cook dinner.", "drive a car.", "chase each other around."], "gold": 3},
]
WINOGRANDE = [
    {"context_options": ["The trophy did not fit in the case because the trophy", "The trophy did not fit in the case because the case"], "continuation": "was too big.", "gold": 0},
    {"context_options": ["Sarah lent Maria money because Sarah", "Sarah lent Maria money because Maria"], "continuation": "was short of cash.", "gold": 1},
    {"context_options": ["The cup broke on the floor because the cup", "The cup broke on the floor because the floor"], "continuation": "was hard.", "gold": 1},
    {"context_options": ["My lord met the king, and my lord", "My lord met the king, and the king"], "continuation": "spoke first.", "gold": 0},
]
BOOLQ = [
    {"query": "The sun is a star at the centre of our system.\nQuestion: is the sun a star?\nAnswer:", "choices": ["no", "yes"], "gold": 1},
    {"query": "Cats are mammals that purr.\nQuestion: are cats reptiles?\nAnswer:", "choices": ["no", "yes"], "gold": 0},
    {"query": "Rome is in Italy.\nQuestion: is rome in france?\nAnswer:", "choices": ["no", "yes"], "gold": 0},
    {"query": "Ice is frozen water.\nQuestion: is ice made of water?\nAnswer:", "choices": ["no", "yes"], "gold": 1},
]
COPA = [
    {"query": "The man broke his toe because", "choices": ["he dropped a hammer on his foot.", "he got a hole in his sock."], "gold": 0},
    {"query": "I tipped the bottle, so", "choices": ["the liquid in the bottle froze.", "the liquid in the bottle poured out."], "gold": 1},
    {"query": "The girl was tired, so", "choices": ["she went to bed.", "she ran a race."], "gold": 0},
    {"query": "The river flooded because", "choices": ["it rained for days.", "the sun was out."], "gold": 0},
]
LAMBADA = [
    {"context": "He took the sword from the wall and, with a cry, struck at the", "continuation": "king"},
    {"context": "Now is the winter of our discontent made glorious summer by this sun of", "continuation": "York"},
    {"context": "She opened the door and called out to her brother, but her", "continuation": "brother"},
    {"context": "To be, or not to be, that is the ", "continuation": "question"},  # a trailing space: trimmed
]
MMLU = [
    {"query": "What is 2 + 3?\nA. 4\nB. 5\nC. 6\nD. 7\nAnswer:", "choices": ["A", "B", "C", "D"], "gold": 1},
    {"query": "Which planet is red?\nA. Mars\nB. Venus\nC. Earth\nD. Jupiter\nAnswer:", "choices": ["A", "B", "C", "D"], "gold": 0},
    {"query": "Who wrote Hamlet?\nA. Dickens\nB. Austen\nC. Shakespeare\nD. Twain\nAnswer:", "choices": ["A", "B", "C", "D"], "gold": 2},
    {"query": "What is H2O?\nA. salt\nB. air\nC. gold\nD. water\nAnswer:", "choices": ["A", "B", "C", "D"], "gold": 3},
]
# the other tasks from native rows, through the loaders' own conversions (gptlab.eval.tasks.native)
PIQA = [convert_piqa({"goal": goal, "sol1": one, "sol2": two, "label": label}, "piqa") for goal, one, two, label in (
    ("How do you open a jar?", "Twist the lid.", "Shout at it.", 0), ("How do you dry wet hands?", "Wet them more.", "Use a towel.", 1),
    ("How do you cool soup?", "Blow on it.", "Heat it up.", 0), ("How do you light a room?", "Close the curtains.", "Switch on a lamp.", 1))]
OPENBOOKQA = [convert_openbookqa({"id": f"o{i}", "question_stem": stem, "choices": {"text": texts, "label": list("ABCD")}, "answerKey": key},
                                 "openbookqa") for i, (stem, texts, key) in enumerate((
    ("Plants need", ["sunlight", "rocks", "plastic", "noise"], "A"), ("A magnet attracts", ["wood", "iron", "glass", "paper"], "B"),
    ("Ice is", ["hot", "gas", "frozen water", "metal"], "C"), ("The moon orbits", ["Mars", "the sun only", "Venus", "the earth"], "D")))]
COMMONSENSE_QA = [convert_commonsense_qa({"id": f"c{i}", "question": question, "choices": {"text": texts, "label": list("ABCDE")},
                                          "answerKey": key}, "commonsense_qa") for i, (question, texts, key) in enumerate((
    ("Where do you keep milk cold?", ["oven", "fridge", "garden", "car", "roof"], "B"),
    ("What do you use to write?", ["pen", "spoon", "shoe", "cup", "lamp"], "A"),
    ("Where do fish live?", ["desert", "sky", "tree", "water", "road"], "D"),
    ("What do you wear on feet?", ["hat", "glove", "shoes", "scarf", "ring"], "C")))]
FIXTURES = {"arc_easy": ARC, "arc_challenge": ARC, "hellaswag": HELLASWAG, "piqa": PIQA, "winogrande": WINOGRANDE, "boolq": BOOLQ,
            "copa": COPA, "openbookqa": OPENBOOKQA, "commonsense_qa": COMMONSENSE_QA, "lambada": LAMBADA, "mmlu": MMLU}
assert set(FIXTURES) == set(CORE_TASKS)  # every likelihood task of the suite


def with_ids(task: str, records: list[dict]) -> list[dict]:
    return [{**record, "id": f"{task}/{i}"} for i, record in enumerate(records)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(gptlab's GPT, lm-eval's HFLM, the tokenizer) on one transformers GPT-2 folder with a tokenizer trained here."""
    from gptlab.data.corpus import shakespeare_documents

    directory = tmp_path_factory.mktemp("hf_gpt2")
    tokenizer = Tokenizer.train([shakespeare_documents()[0][:20_000]], vocab_size=400)
    tokenizer.save_huggingface_dir(directory)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=512, vocab_size=tokenizer.vocab_size,
                                     bos_token_id=tokenizer.eot_id, eos_token_id=tokenizer.eot_id)
    reference = transformers.GPT2LMHeadModel(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights well away from init, so choices get clearly different log-likelihoods
        for parameter in reference.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    reference.save_pretrained(directory)
    with pytest.MonkeyPatch.context() as offline:  # local folders only: any hub access would fail instead of download
        offline.setenv("HF_HUB_OFFLINE", "1")
        offline.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        theirs = HFLM(pretrained=str(directory), tokenizer=str(directory), batch_size=3, device="cpu", dtype="float32")
    return from_pretrained(directory).eval(), theirs, tokenizer


@pytest.mark.parametrize("task", list(FIXTURES))
def test_core_task_log_likelihoods_and_accuracy_equal_lm_eval_hflm(models, task):
    ours, theirs, tokenizer = models
    spec, records = CORE_TASKS[task], with_ids(task, FIXTURES[task])
    by_id = {record["id"]: record for record in records}
    for shots in sorted({0, min(spec.shots, 2)}):
        _, examples = evaluate_task(ours, spec, records, tokenizer.encode_ordinary, shots=shots, seed=7, batch_size=4)
        assert len(examples) == len(records)
        for example in examples:
            record = by_id[example["id"]]
            requests = render_requests(spec, record, [by_id[shot] for shot in example["fewshot_ids"]])
            results = theirs.loglikelihood([Instance("loglikelihood", {}, pair, k) for k, pair in enumerate(requests)],
                                           disable_tqdm=True)
            lls = np.array([logprob for logprob, _ in results])
            if spec.kind == "language_modeling":
                assert example["logprob"] == pytest.approx(lls[0], abs=ATOL)
                assert example["exact"] == int(results[0][1])
                continue
            assert example["logprobs"] == pytest.approx(lls.tolist(), abs=ATOL)
            assert example["greedy"] == [bool(greedy) for _, greedy in results]
            # lm-eval's process_results (lm_eval/api/task.py): completion_len = len(choice) for each doc_to_choice
            # entry: the answers, or Winogrande's context options
            choices = record["choices"] if spec.kind == "multiple_choice" else record["context_options"]
            completion_len = np.array([float(len(choice)) for choice in choices])
            assert example["acc"] == int(np.argmax(lls) == record["gold"])
            assert example["acc_norm"] == int(np.argmax(lls / completion_len) == record["gold"])


def test_exact_continuation_agrees_with_lm_eval_greedy_on_the_models_own_greedy_text(models):
    """Continuations that are the model's greedy text: exact is 1 for them in both, and 0 for a changed one."""
    ours, theirs, tokenizer = models
    spec = TaskSpec(name="greedy", kind="language_modeling", shots=0, chance=0.0, continuation_delimiter="")
    records = []
    for i, context in enumerate(["Now is the winter of our", "My lord, the king", "To be, or not to be"]):
        ids = tokenizer.encode_ordinary(context)
        for _ in range(3):
            logits, _ = ours(torch.tensor([ids]))
            ids.append(int(logits[0, -1].argmax()))
        text = tokenizer.decode(ids[-3:])
        if tokenizer.encode_ordinary(context + text) == ids:  # the text encodes back to the greedy ids
            records += [{"context": context, "continuation": text, "id": f"g{i}"},
                        {"context": context, "continuation": text[::-1] + "x", "id": f"n{i}"}]
    assert len(records) >= 2
    _, examples = evaluate_task(ours, spec, records, tokenizer.encode_ordinary)
    results = theirs.loglikelihood([Instance("loglikelihood", {}, render_requests(spec, record)[0], i)
                                    for i, record in enumerate(records)], disable_tqdm=True)
    assert [example["exact"] for example in examples] == [int(greedy) for _, greedy in results]
    assert [example["exact"] for example in examples] == [1, 0] * (len(records) // 2)
    assert [example["logprob"] for example in examples] == pytest.approx([logprob for logprob, _ in results], abs=ATOL)
