"""The CORE-style likelihood suite: prompts, few-shot choice, metrics, the aggregate, limits, DDP and bad input.

Scores are checked against gptlab.eval.scoring's one-request-per-row reference on a tiny model; metrics and
the aggregate against hand computations on scripted log-likelihoods. lm-eval parity is in test_core_parity.py.
"""

import json
import re
from pathlib import Path

import pytest
import torch

from gptlab.eval.scoring import Score, score_continuations
from gptlab.eval.tasks import core
from gptlab.eval.tasks.core import (
    CORE_TASKS,
    TaskSpec,
    choose_answers,
    choose_fewshot,
    core_task,
    encode_request,
    evaluate_suite,
    evaluate_task,
    render_requests,
    spec_from_bundle,
)
from gptlab.model import GPT, preset
from gptlab.model.io import save_model
from gptlab.runtime import GptlabError

from .two_ranks import run_on_two_ranks

MC = TaskSpec(name="mc", kind="multiple_choice", shots=2, chance=0.25)
SCHEMA = TaskSpec(name="schema", kind="schema", shots=1, chance=0.5)
LM = TaskSpec(name="lm", kind="language_modeling", shots=1, chance=0.0)


def encode(text: str) -> list[int]:
    """UTF-8 bytes as ids: a prefix-stable tokenizer, so expected ids can be written by hand."""
    return list(text.encode("utf-8"))


def mc_records(n: int) -> list[dict]:
    return [{"query": f"Question: what is {i} plus one?\nAnswer:", "choices": [str(i + 1), str(i + 2), "seven", "no"],
             "gold": i % 4, "id": f"q{i}"} for i in range(n)]


def schema_records(n: int) -> list[dict]:
    return [{"context_options": [f"The cup {i} fell because the cup", f"The cup {i} fell because the table"],
             "continuation": "was slippery.", "gold": i % 2, "id": f"w{i}"} for i in range(n)]


def lm_records(n: int) -> list[dict]:
    return [{"context": f"She counted to {i} and then said ", "continuation": f"{i + 1}", "id": f"l{i}"} for i in range(n)]


@pytest.fixture(scope="module")
def model():
    """The tiny preset with weights of std 0.1, so log-probabilities differ clearly between choices."""
    torch.manual_seed(0)
    model = GPT(preset("gpt2-tiny")).eval()  # vocab 512 covers the 256 byte ids; block 64 makes long prompts truncate
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.1)
    return model


# ---------------------------------------------------------------- specs


def test_core_tasks_declare_dclm_shots_and_chance():
    expected = {"arc_easy": (10, 0.25), "arc_challenge": (10, 0.25), "hellaswag": (10, 0.25), "piqa": (10, 0.5),
                "winogrande": (0, 0.5), "boolq": (10, 0.62), "copa": (0, 0.5), "openbookqa": (0, 0.25),
                "commonsense_qa": (10, 0.2), "lambada": (0, 0.0), "mmlu": (5, 0.25)}
    assert {name: (spec.shots, spec.chance) for name, spec in CORE_TASKS.items()} == expected
    assert CORE_TASKS["winogrande"].kind == "schema" and CORE_TASKS["lambada"].kind == "language_modeling"
    assert CORE_TASKS["lambada"].metric == "exact" and CORE_TASKS["piqa"].metric == "acc_per_token"


def test_task_spec_rejects_unknown_kind_metric_shots_and_chance():
    with pytest.raises(GptlabError, match="kind 'essay'"):
        TaskSpec(name="x", kind="essay", shots=0, chance=0.0)
    with pytest.raises(GptlabError, match="metric 'acc' is not one of exact"):
        TaskSpec(name="x", kind="language_modeling", shots=0, chance=0.0, metric="acc")
    with pytest.raises(GptlabError, match="shots must be a whole number >= 0, got -1"):
        TaskSpec(name="x", kind="schema", shots=-1, chance=0.5)
    with pytest.raises(GptlabError, match="chance 1.0"):
        TaskSpec(name="x", kind="schema", shots=0, chance=1.0)


# ---------------------------------------------------------------- prompts


def test_render_requests_multiple_choice_puts_each_shot_answer_then_the_question():
    shots = [{"query": "Q: 1+1?\nA:", "choices": ["1", "2"], "gold": 1}, {"query": "Q: 2+2?\nA:", "choices": ["4", "5"], "gold": 0}]
    question = {"query": "Q: 3+3?\nA:", "choices": ["6", "7"], "gold": 0}
    prefix = "Q: 1+1?\nA: 2\n\nQ: 2+2?\nA: 4\n\n"
    assert render_requests(MC, question, shots) == [(prefix + "Q: 3+3?\nA:", " 6"), (prefix + "Q: 3+3?\nA:", " 7")]
    assert render_requests(MC, question) == [("Q: 3+3?\nA:", " 6"), ("Q: 3+3?\nA:", " 7")]


def test_render_requests_keeps_a_worded_delimiter_in_the_context_so_only_the_answer_is_scored():
    spec = TaskSpec(name="arc", kind="multiple_choice", shots=1, chance=0.25, continuation_delimiter="\nAnswer: ")
    shot, question = {"query": "Question: 1+1?", "choices": ["2", "3"], "gold": 0}, {"query": "Question: 2+2?", "choices": ["4", "5"], "gold": 0}
    context = "Question: 1+1?\nAnswer: 2\n\nQuestion: 2+2?\nAnswer:"
    assert render_requests(spec, question, [shot]) == [(context, " 4"), (context, " 5")]
    lm = TaskSpec(name="qa", kind="language_modeling", shots=0, chance=0.0, continuation_delimiter="\nAnswer: ")
    assert render_requests(lm, {"context": "Capital of France? ", "continuation": "Paris"}) == [("Capital of France?\nAnswer:", " Paris")]


def test_render_requests_schema_varies_the_context_and_keeps_the_continuation():
    shot = {"context_options": ["Ann helped Bo, so Ann", "Ann helped Bo, so Bo"], "continuation": "said thanks.", "gold": 1}
    question = {"context_options": ["The cat chased the dog because the cat", "The cat chased the dog because the dog"],
                "continuation": "was angry.", "gold": 0}
    prefix = "Ann helped Bo, so Bo said thanks.\n\n"
    assert render_requests(SCHEMA, question, [shot]) == [
        (prefix + "The cat chased the dog because the cat", " was angry."),
        (prefix + "The cat chased the dog because the dog", " was angry."),
    ]


def test_render_requests_language_modelling_trims_contexts_as_nanochat_does():
    shot = {"context": "  One, two, three ", "continuation": "four"}
    question = {"context": "Five, six, seven ", "continuation": "eight"}
    assert render_requests(LM, question, [shot]) == [("One, two, three four\n\nFive, six, seven", " eight")]


def test_encode_request_moves_trailing_space_to_the_continuation_as_lm_eval_does():
    assert encode_request(encode, "Answer: ", "B") == (encode("Answer:"), encode(" B"))
    assert encode_request(encode, "Answer:", " B") == (encode("Answer:"), encode(" B"))
    with pytest.raises(GptlabError, match="context is empty"):
        encode_request(encode, "", " B")


# ---------------------------------------------------------------- few-shot choice


def test_fewshot_choice_is_seeded_and_never_the_question_itself():
    picks = {seed: [choose_fewshot("arc_easy", i, f"q{i}", 12, 10, seed) for i in range(12)] for seed in (1, 2)}
    assert picks[1] == [choose_fewshot("arc_easy", i, f"q{i}", 12, 10, 1) for i in range(12)]
    assert picks[1] != picks[2]
    assert choose_fewshot("arc_easy", 3, "q3", 12, 10, 1) != choose_fewshot("piqa", 3, "q3", 12, 10, 1)
    for seed in (1, 2):
        for i, chosen in enumerate(picks[seed]):
            assert i not in chosen and len(set(chosen)) == 10 and all(0 <= j < 12 for j in chosen)


def test_fewshot_choice_from_a_separate_pool_skips_a_record_with_the_question_id():
    pool_ids = {f"t{j}": j for j in range(5)} | {"q7": 5}
    chosen = [choose_fewshot("mmlu", 7, "q7", 6, 5, seed, pool_ids) for seed in range(20)]
    assert all(sorted(picked) == [0, 1, 2, 3, 4] for picked in chosen)
    assert choose_fewshot("mmlu", 0, "q0", 6, 6, 1, pool_ids) != []  # q0 is not in the pool: all six may be used
    with pytest.raises(GptlabError, match="7 shots need 7 examples besides each question, but the few-shot pool has 5"):
        choose_fewshot("mmlu", 7, "q7", 6, 7, 1, pool_ids)


MMLU_SUBJECTS = ("anatomy", "college_physics", "world_religions")


def write_mmlu_folder(folder, dev: int = 6, test: int = 4):
    """MMLU's CSV layout (dev/SUBJECT_dev.csv, test/SUBJECT_test.csv, no header), `dev` and `test` rows per subject."""
    import csv

    for split, n in (("dev", dev), ("test", test)):
        (folder / split).mkdir(parents=True)
        for subject in MMLU_SUBJECTS:
            with open(folder / split / f"{subject}_{split}.csv", "w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerows([f"{subject} {split} question {i}?", "w", "x", "y", "z", "ABCD"[i % 4]] for i in range(n))
    return folder


def test_mmlu_shots_are_the_first_five_of_the_questions_own_subject_dev_set(tmp_path, model, monkeypatch):
    from gptlab.eval.tasks.sources import load_task_records

    data = load_task_records("mmlu", source=write_mmlu_folder(tmp_path / "mmlu"))
    assert len(data.records) == 12 and len(data.fewshot_pool) == 18  # every subject's dev set in one pool
    for seed in (1, 2):
        monkeypatch.setattr(core, "score_groups", scripted([[-1.0, -2.0, -3.0, -4.0]] * 12))
        _, examples = evaluate_task(model, "mmlu", data.records, encode, fewshot_pool=data.fewshot_pool, seed=seed)
        for example in examples:
            subject = example["id"].split("/")[1]
            assert example["fewshot_ids"] == [f"mmlu/{subject}/dev/{line}" for line in range(1, 6)]  # in file order


def test_mmlu_shots_from_the_records_themselves_share_the_subject_and_are_never_the_question():
    spec = CORE_TASKS["mmlu"]
    records = [{"query": f"{s} {i}?\nAnswer:", "choices": list("ABCD"), "gold": 0, "subject": s, "id": f"{s}/{i}"}
               for s in MMLU_SUBJECTS for i in range(7)]
    pool = core.build_fewshot_pool(spec, records, None)
    for seed in (1, 2):
        for index, record in enumerate(records):
            picked = core.choose_shots(spec, pool, records, index, 5, seed)
            assert len(set(picked)) == 5 and index not in picked
            assert {records[j]["subject"] for j in picked} == {record["subject"]}
    seeded = [core.choose_shots(spec, pool, records, i, 5, 1) for i in range(len(records))]
    assert seeded != [core.choose_shots(spec, pool, records, i, 5, 2) for i in range(len(records))]  # a seeded draw
    with pytest.raises(GptlabError, match="mmlu: 7 shots need 7 examples of 'anatomy' besides each question, .* has 6"):
        evaluate_task(None, spec, records, encode, shots=7)


def test_mmlu_prompt_equals_lm_evals_mmlu_task_on_a_dataset_made_here(tmp_path):
    """lm-eval 0.4's mmlu/default template, one task per subject as its _generate_configs.py writes them, built on
    JSON files written here: its few-shot context for each question is the text gptlab renders."""
    import lm_eval
    import yaml
    from lm_eval.api.task import ConfigurableTask

    from gptlab.eval.tasks.native import convert_mmlu

    rows = {split: [{"question": f" {s} {split} question {i}?", "subject": s, "choices": [f"w{i}", "x", "y", "z"], "answer": i % 4}
                    for s in MMLU_SUBJECTS for i in range(6 if split == "dev" else 3)] for split in ("dev", "test")}
    records = {split: [{**convert_mmlu(row, split), "id": f"{split}{j}"} for j, row in enumerate(rows[split])] for split in rows}
    spec = CORE_TASKS["mmlu"]
    pool = core.build_fewshot_pool(spec, records["test"], records["dev"])
    template = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks/mmlu/default/_default_template_yaml").read_text())
    for subject in MMLU_SUBJECTS:
        files = {}
        for split in rows:  # cais/mmlu's per-subject configs: the subject's own rows only
            files[split] = tmp_path / f"{subject}_{split}.json"
            files[split].write_text("".join(json.dumps(row) + "\n" for row in rows[split] if row["subject"] == subject))
        description = f"The following are multiple choice questions (with answers) about {' '.join(subject.split('_'))}.\n\n"
        theirs = ConfigurableTask(config={**template, "task": f"mmlu_{subject}", "dataset_path": "json", "description": description,
                                          "dataset_kwargs": {"data_files": {k: str(v) for k, v in files.items()},
                                                             "cache_dir": str(tmp_path / "cache")}})
        docs = list(theirs.test_docs())
        questions = [(i, r) for i, r in enumerate(records["test"]) if r["subject"] == subject]
        assert len(docs) == len(questions) == 3
        for doc, (index, record) in zip(docs, questions):
            for shots in (0, 5):
                picked = core.choose_shots(spec, pool, records["test"], index, shots, seed=1234) if shots else []
                context = theirs.fewshot_context(doc, num_fewshot=shots)
                expected = [(context, " " + choice) for choice in theirs.doc_to_choice(doc)]
                assert render_requests(spec, record, [records["dev"][j] for j in picked]) == expected


def test_evaluate_task_saves_the_fewshot_ids_it_rendered(model, monkeypatch):
    records = mc_records(6)
    seen = []
    real = core.score_groups

    def spy(model, groups, **options):
        seen.extend(groups)
        return real(model, groups, **options)

    monkeypatch.setattr(core, "score_groups", spy)
    _, examples = evaluate_task(model, MC, records, encode, seed=5)
    by_id = {record["id"]: record for record in records}
    for example, group in zip(examples, seen):
        assert len(example["fewshot_ids"]) == 2 and example["id"] not in example["fewshot_ids"]
        shots = [by_id[shot] for shot in example["fewshot_ids"]]
        expected = [encode_request(encode, *pair) for pair in render_requests(MC, by_id[example["id"]], shots)]
        assert group == expected
    _, again = evaluate_task(model, MC, records, encode, seed=5)
    _, other = evaluate_task(model, MC, records, encode, seed=6)
    assert [e["fewshot_ids"] for e in again] == [e["fewshot_ids"] for e in examples] != [e["fewshot_ids"] for e in other]


# ---------------------------------------------------------------- metrics


def test_choose_answers_metrics_disagree_as_their_normalisations_say():
    # sums -4 > -5 > -6; per char -2, -0.5, -0.75; per token -4, -2.5, -1.5
    assert choose_answers([-4.0, -5.0, -6.0], [1, 2, 4], [2, 10, 8]) == {"acc": 0, "acc_norm": 1, "acc_per_token": 2}
    assert choose_answers([-3.0, -3.0], [1, 1], [1, 1]) == {"acc": 0, "acc_norm": 0, "acc_per_token": 0}  # ties: first


def scripted(logprobs: list[list[float]], greedy: list[list[bool]] | None = None):
    """A score_groups stand-in returning fixed log-likelihoods per question, looked up by the question's position."""
    calls = []

    def score_groups(model, groups, **options):
        start = sum(len(call) for call in calls)
        calls.append(groups)
        return [[Score(logprob, (greedy or [[False] * len(row) for row in logprobs])[start + g][k])
                 for k, logprob in enumerate(logprobs[start + g])] for g in range(len(groups))]

    return score_groups


def test_evaluate_task_counts_each_metric_from_the_log_likelihoods(model, monkeypatch):
    spec = TaskSpec(name="mc", kind="multiple_choice", shots=0, chance=0.25)
    records = [{"query": "Q:", "choices": ["ab", "abcdefgh", "ééééééé"], "gold": gold, "id": str(gold)} for gold in (0, 1, 2)]
    # byte tokens: " ab" 3, " abcdefgh" 9, " ééééééé" 15 (é is 2 bytes); characters 2, 8, 7
    monkeypatch.setattr(core, "score_groups", scripted([[-3.0, -4.0, -5.0]] * 3))
    row, examples = evaluate_task(model, spec, records, encode)
    picks = {"acc": 0, "acc_norm": 1, "acc_per_token": 2}  # per char -1.5, -0.5, -0.71; per token -1, -0.44, -0.33
    assert [example["picks"] for example in examples] == [picks] * 3
    assert [(e["acc"], e["acc_norm"], e["acc_per_token"]) for e in examples] == [(1, 0, 0), (0, 1, 0), (0, 0, 1)]
    assert examples[0]["tokens"] == [3, 9, 15] and examples[0]["chars"] == [2, 8, 7]
    assert (row.task, row.metric, row.score, row.n, row.chance, row.shots) == ("mc", "acc_per_token", 1 / 3, 3, 0.25, 0)
    assert row.note == "acc 0.3333; acc_norm 0.3333"


def test_evaluate_task_language_modelling_is_exact_only_when_every_token_is_greedy(model, monkeypatch):
    monkeypatch.setattr(core, "score_groups", scripted([[-1.0], [-0.5], [-2.0], [-0.1]], [[True], [False], [True], [True]]))
    row, examples = evaluate_task(model, LM, lm_records(4), encode, shots=0)
    assert [example["exact"] for example in examples] == [1, 0, 1, 1]
    assert (row.metric, row.score, row.n) == ("exact", 0.75, 4)
    assert examples[0]["logprob"] == -1.0 and examples[0]["tokens"] == len(encode(" 1"))


def test_evaluate_suite_aggregate_is_the_mean_centred_accuracy(model, monkeypatch):
    """CORE (DCLM section 3.4, nanochat base_eval): mean over tasks of (accuracy - chance) / (1 - chance)."""
    # copa: choice 0 is best by every metric and is gold in 3 of 4 questions; lambada: 2 of 5 continuations greedy
    mc = [{"query": "Q:", "choices": ["a", "b", "c", "d"], "gold": gold, "id": str(i)} for i, gold in enumerate([0, 0, 0, 1])]
    lm = lm_records(5)
    monkeypatch.setattr(core, "score_groups", scripted([[-1.0, -2.0, -3.0, -4.0]] * 4 + [[-1.0]] * 5,
                                                       [[False] * 4] * 4 + [[True], [True], [False], [False], [False]]))
    result = evaluate_suite(model, {"copa": mc, "lambada": lm}, encode, shots=0)
    copa, lambada = result.rows
    assert (copa.score, lambada.score) == (0.75, 0.4)
    assert result.aggregate.name == "CORE" and result.aggregate.tasks == ("copa", "lambada")
    assert result.aggregate.score == pytest.approx(((0.75 - 0.5) / (1 - 0.5) + (0.4 - 0.0) / 1.0) / 2)
    assert sorted(result.examples) == ["copa", "lambada"] and len(result.examples["lambada"]) == 5


def test_evaluate_suite_takes_declared_specs_such_as_the_eval_bundles(model, monkeypatch):
    from types import SimpleNamespace

    bundle = SimpleNamespace(label="jeopardy", kind="language_modeling", num_fewshot=1, random_baseline=0.0,
                             continuation_delimiter="\nAnswer: ")
    spec = spec_from_bundle(bundle)
    assert (spec.name, spec.shots, spec.chance, spec.metric, spec.continuation_delimiter) == ("jeopardy", 1, 0.0, "exact", "\nAnswer: ")
    monkeypatch.setattr(core, "score_groups", scripted([[-1.0]] * 3, [[True], [False], [True]]))
    result = evaluate_suite(model, {"jeopardy": lm_records(3)}, encode, specs={"jeopardy": spec})
    assert (result.rows[0].task, result.rows[0].shots, result.rows[0].score) == ("jeopardy", 1, 2 / 3)
    assert result.aggregate.score == pytest.approx(2 / 3)


# ---------------------------------------------------------------- on a model


def test_evaluate_task_scores_equal_each_request_scored_alone(model):
    for spec, records in ((MC, mc_records(5)), (SCHEMA, schema_records(4)), (LM, lm_records(4))):
        _, examples = evaluate_task(model, spec, records, encode, seed=3, batch_size=2)
        for example in examples:
            shots = [next(r for r in records if r["id"] == shot) for shot in example["fewshot_ids"]]
            pairs = [encode_request(encode, *pair) for pair in render_requests(spec, records[example["index"]], shots)]
            alone = [score_continuations(model, [pair], batch_size=1)[0] for pair in pairs]
            got = example["logprobs"] if spec.kind != "language_modeling" else [example["logprob"]]
            assert got == pytest.approx([score.logprob for score in alone], abs=1e-4)
        if spec is MC:
            assert any(example["truncated"] for example in examples)  # 2-shot prompts pass 65 bytes: cut on the left alike


def test_evaluate_task_limit_scores_the_first_questions_with_shots_from_all(model):
    records = mc_records(8)
    row, examples = evaluate_task(model, MC, records, encode, limit=3, seed=1)
    assert row.n == 3 and [example["index"] for example in examples] == [0, 1, 2]
    full = evaluate_task(model, MC, records, encode, seed=1)[1][:3]
    assert [e["fewshot_ids"] for e in examples] == [e["fewshot_ids"] for e in full]
    assert [e["logprobs"] for e in examples] == [e["logprobs"] for e in full]


def test_evaluate_task_shots_override_and_separate_fewshot_pool(model):
    records, pool = mc_records(4), [{**record, "id": f"train{i}"} for i, record in enumerate(mc_records(3))]
    row, examples = evaluate_task(model, MC, records, encode, shots=3, fewshot_pool=pool)
    assert row.shots == 3 and all(sorted(e["fewshot_ids"]) == ["train0", "train1", "train2"] for e in examples)


TWO_RANKS = """
import json, sys
import torch.distributed as dist
from gptlab.eval.tasks.core import evaluate_task
from gptlab.model.io import load_model
from tests.eval.test_core import MC, encode, mc_records
dist.init_process_group("gloo")
row, examples = evaluate_task(load_model(sys.argv[1]), MC, mc_records(7), encode, seed=9, batch_size=2)
sys.stdout.write(f"RESULT {dist.get_rank()} {json.dumps({'row': row.to_dict(), 'examples': examples})}\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


def test_evaluate_task_on_two_gloo_ranks_equals_one_process(model, tmp_path):
    """Rank r scores questions r::2 of 7; both ranks return the single-process row and every example."""
    folder = save_model(model, tmp_path / "model")
    row, examples = evaluate_task(model, MC, mc_records(7), encode, seed=9, batch_size=2)
    single = json.loads(json.dumps({"row": row.to_dict(), "examples": examples}))
    stdout = run_on_two_ranks(TWO_RANKS, folder, tmp_path)
    results = sorted(re.findall(r"^RESULT (\d) (.*)$", stdout, flags=re.MULTILINE))
    assert [rank for rank, _ in results] == ["0", "1"]
    for _, text in results:
        got = json.loads(text)
        assert got["row"] == single["row"]
        for mine, theirs in zip(got["examples"], single["examples"], strict=True):
            assert mine["logprobs"] == pytest.approx(theirs["logprobs"], abs=1e-5)
            assert {k: v for k, v in mine.items() if k != "logprobs"} == {k: v for k, v in theirs.items() if k != "logprobs"}


# ---------------------------------------------------------------- bad input


def test_unknown_task_names_the_known_ones(model):
    with pytest.raises(GptlabError, match="unknown task 'sat'.*arc_easy, arc_challenge"):
        core_task("sat")
    with pytest.raises(GptlabError, match="unknown task 'sat'"):
        evaluate_suite(model, {"sat": mc_records(2)}, encode)


def test_bad_shots_limit_and_pool_are_one_clear_error(model):
    with pytest.raises(GptlabError, match="mc: shots must be a whole number >= 0, got -1"):
        evaluate_task(model, MC, mc_records(3), encode, shots=-1)
    with pytest.raises(GptlabError, match="limit must be a whole number >= 1, got 0"):
        evaluate_task(model, MC, mc_records(3), encode, limit=0)
    with pytest.raises(GptlabError, match="2 shots need 2 examples besides each question, but the few-shot pool has 1"):
        evaluate_task(model, MC, mc_records(2), encode)
    with pytest.raises(GptlabError, match="shots names piqa, which the suite does not evaluate"):
        evaluate_suite(model, {"copa": mc_records(2)}, encode, shots={"piqa": 1})
    with pytest.raises(GptlabError, match="mc has no records"):
        evaluate_task(model, MC, [], encode)


@pytest.mark.parametrize(("spec", "record", "message"), [
    (MC, {"query": "Q:", "choices": ["a", "b"], "id": "x7"}, r"mc record 1 \(id 'x7'\): missing gold"),
    (MC, {"query": "Q:", "choices": ["a", "b"], "gold": 2, "id": "x7"}, "gold 2 is not an index into the 2 choices"),
    (MC, {"query": "Q:", "choices": "ab", "gold": 0}, "mc record 1: choices must be a non-empty list of texts"),
    (MC, {"query": 5, "choices": ["a"], "gold": 0}, "query must be text"),
    (SCHEMA, {"context_options": ["a", "b"], "continuation": "", "gold": 0}, "continuation is empty"),
    (LM, {"context": None, "continuation": "b"}, "context and continuation must be text"),
    (LM, ["context", "continuation"], "lm record 1: expected a JSON object, got list"),
])
def test_records_of_the_wrong_shape_name_the_record(model, spec, record, message):
    good = {"multiple_choice": mc_records(1), "schema": schema_records(1), "language_modeling": lm_records(1)}[spec.kind]
    with pytest.raises(GptlabError, match=message):
        evaluate_task(model, spec, [*good, record], encode, shots=0)
    with pytest.raises(GptlabError, match="few-shot record 0"):
        evaluate_task(model, spec, good, encode, shots=0, fewshot_pool=[record])
