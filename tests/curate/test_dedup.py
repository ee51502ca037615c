"""Corpus-wide dedup against brute force: Counters over all lines and texts, all-pairs Jaccard with its components."""

import json
import random
from collections import Counter

import numpy as np
import pytest

from gptlab.curate.dedup import (
    DocumentDeduplicationConfig,
    DocumentDeduplicator,
    LineDeduplicationConfig,
    LineDeduplicator,
    MinHashDeduplicator,
    UnionFind,
    candidate_pairs,
)
from gptlab.curate.document import Document, size
from gptlab.curate.minhash import MinHashConfig
from gptlab.runtime import GptlabError

VOCABULARY = [f"{stem}{suffix}" for stem in ("river", "stone", "market", "engine", "garden", "signal", "harbor",
                                             "winter", "copper", "lantern", "meadow", "orbit", "violin", "basket")
              for suffix in ("", "s", "ed", "ing", "er", "ly", "ion", "ity", "ous", "ism", "ant", "ive", "al", "ure")]


def corpus(texts: list[str]) -> list[Document]:
    return [Document(id=f"doc{index}", text=text, metadata={"position": index}) for index, text in enumerate(texts)]


def run(stage, documents: list[Document]) -> list[Document]:
    return list(stage.apply(lambda: iter(documents))())


def words(rng: random.Random, count: int) -> list[str]:
    return [rng.choice(VOCABULARY) for _ in range(count)]


def mutate(text: str, rng: random.Random, changes: int) -> str:
    """The text with `changes` words, at least 10 apart, replaced by other words."""
    tokens = text.split()
    for position in rng.sample(range(0, len(tokens), 10), changes):
        tokens[position] = rng.choice([word for word in VOCABULARY if word != tokens[position]])
    return " ".join(tokens)


def brute_force_kept(texts: list[str], threshold: float, ngram: int = 5) -> list[int]:
    """All pairs' true Jaccard on word n-gram tuples, thresholded; connected components; the first of each."""
    grams = [{tuple(text.split()[i:i + ngram]) for i in range(len(text.split()) - ngram + 1)} for text in texts]
    component = list(range(len(texts)))
    for first in range(len(texts)):
        for second in range(first + 1, len(texts)):
            if len(grams[first] & grams[second]) / len(grams[first] | grams[second]) >= threshold:
                old, new = sorted((component[first], component[second]))[::-1]
                component = [new if label == old else label for label in component]
    return sorted(set(component))


def boilerplate_corpus() -> list[str]:
    rng = random.Random(0)
    shared = ["Home | About | Contact", "Subscribe to our newsletter", "© 2024 Example Media"]
    texts = []
    for index in range(30):
        body = [" ".join(words(rng, 8)) for _ in range(rng.randint(0, 4))]
        lines = rng.sample(shared, rng.randint(0, 3)) + body + (["", "  "] if index % 3 else [])
        rng.shuffle(lines)
        texts.append("\n".join(lines))
    texts.append(shared[0] + "\n\n" + shared[1])  # only boilerplate: emptied, dropped
    texts.append("a line said twice\na line said twice\nand one said once")  # repeats inside one document
    return texts


def test_line_dedup_removes_every_copy_of_repeated_lines_as_a_brute_force_counter_does():
    texts = boilerplate_corpus()
    counts = Counter(line for text in texts for line in text.split("\n") if line.strip())
    expected, removed = {}, 0
    for index, text in enumerate(texts):
        kept = [line for line in text.split("\n") if not line.strip() or counts[line] == 1]
        removed += len(text.split("\n")) - len(kept)
        if any(line.strip() for line in kept):
            expected[f"doc{index}"] = "\n".join(kept)
    stage = LineDeduplicator()
    output = run(stage, corpus(texts))
    assert {document.id: document.text for document in output} == expected
    assert stage.stats.changes["lines removed"] == removed
    assert stage.stats.reasons["empty after line dedup"] == len(texts) - len(expected) >= 1
    assert stage.stats.documents_in == len(texts) and stage.stats.documents_out == len(expected)
    assert stage.stats.bytes_out == sum(size(text) for text in expected.values())
    assert stage.stats.changes["documents changed"] == sum(expected[key] != texts[int(key[3:])] for key in expected)
    assert output[0].metadata == {"position": 0}


def test_line_dedup_keeps_the_first_copy_when_keep_first():
    texts = boilerplate_corpus()
    seen, expected = set(), {}
    for index, text in enumerate(texts):
        kept = []
        for line in text.split("\n"):
            if not line.strip() or line not in seen:
                kept.append(line)
            seen.add(line)
        expected[f"doc{index}"] = "\n".join(kept)
    output = run(LineDeduplicator(LineDeduplicationConfig(keep_first=True)), corpus(texts))
    assert {document.id: document.text for document in output} == {key: text for key, text in expected.items()
                                                                    if text.strip()}


def test_line_dedup_replays_are_identical_and_count_stats_once():
    documents = corpus(boilerplate_corpus())
    stage = LineDeduplicator(LineDeduplicationConfig(keep_first=True))
    replay = stage.apply(lambda: iter(documents))
    first = [(document.id, document.text) for document in replay()]
    stats = stage.stats.as_dict()
    assert [(document.id, document.text) for document in replay()] == first
    assert stage.stats.as_dict() == stats and stats["documents_in"] == len(documents)


def test_dedup_refuses_a_one_shot_iterator_and_a_corpus_that_changes_between_passes():
    documents = corpus(["one", "two", "three"])
    with pytest.raises(GptlabError, match="callable giving a fresh iterator"):
        LineDeduplicator().apply(iter(documents))
    calls = []

    def shrinking():
        calls.append(1)
        return iter(documents[: 4 - len(calls)])

    replay = DocumentDeduplicator().apply(shrinking)
    with pytest.raises(GptlabError, match="3 documents on the first pass and 2 now"):
        list(replay())


def test_document_dedup_keeps_the_first_of_each_text_as_a_brute_force_counter_does():
    rng = random.Random(1)
    originals = [" ".join(words(rng, 20)) for _ in range(12)]
    texts = [rng.choice(originals) for _ in range(60)]
    first = {}
    for index, text in enumerate(texts):
        first.setdefault(text, index)
    stage = DocumentDeduplicator()
    output = run(stage, corpus(texts))
    assert [document.id for document in output] == [f"doc{index}" for index in sorted(first.values())]
    assert stage.stats.reasons["exact duplicate"] == len(texts) - len(first)
    for example in stage.stats.examples["exact duplicate"]:
        assert example["duplicate_of"] == f"doc{first[texts[int(example['id'][3:])]]}"


def test_document_dedup_matches_case_punctuation_accent_and_whitespace_variants_only_when_normalise():
    texts = ["The café opened, at last!", "the cafe opened at last", "THE  CAFÉ\nOPENED... at last", "The café closed."]
    assert len(run(DocumentDeduplicator(), corpus(texts))) == 4
    output = run(DocumentDeduplicator(DocumentDeduplicationConfig(normalise=True)), corpus(texts))
    assert [document.id for document in output] == ["doc0", "doc3"]


def test_minhash_keeps_exactly_one_of_a_set_of_near_duplicates():
    rng = random.Random(2)
    base = " ".join(words(rng, 200))
    texts = [base] + [mutate(base, rng, 2) for _ in range(9)]
    assert brute_force_kept(texts, 0.8) == [0]  # every copy is within Jaccard 0.8 of another, by brute force
    stage = MinHashDeduplicator()
    output = run(stage, corpus(texts))
    assert [document.id for document in output] == ["doc0"]
    assert stage.stats.reasons["near duplicate"] == 9 and stage.stats.changes["clusters"] == 1
    assert all(example["duplicate_of"] == "doc0" for example in stage.stats.examples["near duplicate"])
    changes = stage.stats.changes
    assert changes["candidate pairs"] >= changes["pairs compared"] >= changes["verified pairs"] >= 9


def test_minhash_verification_rejects_candidates_below_the_threshold():
    rng = random.Random(2)
    base = " ".join(words(rng, 200))
    texts = [base] + [mutate(base, rng, 2) for _ in range(9)]
    assert brute_force_kept(texts, 0.99) == list(range(10))
    stage = MinHashDeduplicator(MinHashConfig(threshold=0.99))
    assert len(run(stage, corpus(texts))) == 10
    assert stage.stats.changes["candidate pairs"] > 0 and stage.stats.changes["verified pairs"] == 0


def test_minhash_drops_nothing_from_distinct_documents():
    rng = random.Random(3)
    texts = [" ".join(words(rng, 200)) for _ in range(40)]
    assert brute_force_kept(texts, 0.8) == list(range(40))
    stage = MinHashDeduplicator()
    assert len(run(stage, corpus(texts))) == 40
    assert stage.stats.changes["verified pairs"] == 0


def test_minhash_keeps_the_brute_force_answer_on_clusters_chains_and_singles():
    rng = random.Random(4)
    texts = []
    for _ in range(3):  # clusters of close copies
        base = " ".join(words(rng, 200))
        texts += [base] + [mutate(base, rng, rng.randint(1, 3)) for _ in range(rng.randint(2, 5))]
    chain = [" ".join(words(rng, 200))]
    for _ in range(5):  # each link close to the one before, the ends far apart: one component, not one clique
        chain.append(mutate(chain[-1], rng, 2))
    texts += chain
    texts += [" ".join(words(rng, rng.randint(50, 300))) for _ in range(12)]
    rng.shuffle(texts)
    expected = brute_force_kept(texts, 0.8)
    assert len(expected) < len(texts) - 10
    output = run(MinHashDeduplicator(), corpus(texts))
    assert [document.id for document in output] == [f"doc{index}" for index in expected]


def test_minhash_matches_case_punctuation_accent_and_whitespace_variants_when_normalise():
    rng = random.Random(5)
    base = " ".join(words(rng, 100)).replace("river ", "rivér, ").replace("stone ", "Stone! ")
    variants = [base, base.upper(), base.replace(" ", "  \n"), base.replace(",", "").replace("!", "."),
                base.replace("é", "e")]
    assert len(run(MinHashDeduplicator(), corpus(variants))) == 1
    assert len(run(MinHashDeduplicator(MinHashConfig(normalise=False)), corpus(variants))) > 1


def test_minhash_never_pairs_documents_without_words_and_pairs_identical_short_ones():
    output = run(MinHashDeduplicator(), corpus(["!!!", "!!!", "short note", "short note", "other"]))
    assert [document.id for document in output] == ["doc0", "doc1", "doc2", "doc4"]


def test_dedup_passes_chain_over_a_corpus_read_from_disk(tmp_path):
    rng = random.Random(6)
    base = " ".join(words(rng, 120))
    texts = [f"Menu\n{base}", f"Menu\n{mutate(base, rng, 1)}", f"Menu\n{base}", " ".join(words(rng, 120)), "Menu"]
    path = tmp_path / "filtered.jsonl"
    path.write_text("".join(json.dumps({"id": f"doc{i}", "text": text}) + "\n" for i, text in enumerate(texts)))

    def documents():
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                yield Document(**json.loads(line))

    stages = [DocumentDeduplicator(), LineDeduplicator(), MinHashDeduplicator()]  # documents first: see below
    replay = documents
    for stage in stages:
        replay = stage.apply(replay)
    assert [document.id for document in replay()] == ["doc0", "doc3"]
    assert [(stats.documents_in, stats.documents_out) for stats in (stage.stats for stage in stages)] == [
        (5, 4), (4, 3), (3, 2)]
    assert [dict(stage.stats.reasons) for stage in stages] == [
        {"exact duplicate": 1}, {"empty after line dedup": 1}, {"near duplicate": 1}]


def test_line_dedup_without_keep_first_empties_every_copy_of_a_duplicated_document():
    texts = ["first paragraph\nsecond paragraph", "first paragraph\nsecond paragraph", "something else"]
    assert [document.id for document in run(LineDeduplicator(), corpus(texts))] == ["doc2"]
    kept = run(LineDeduplicator(LineDeduplicationConfig(keep_first=True)), corpus(texts))
    assert [document.id for document in kept] == ["doc0", "doc2"]


def test_candidate_pairs_are_the_distinct_pairs_sharing_a_band_bucket():
    keys = np.array([[1, 7], [1, 8], [2, 8], [1, 8], [5, 9]], dtype=np.uint64)
    eligible = np.array([True, True, True, False, True])
    assert candidate_pairs(keys, eligible) == [(0, 1), (1, 2)]


def test_union_find_roots_are_the_first_position_of_each_component():
    clusters = UnionFind()
    for first, second in [(5, 9), (3, 9), (7, 8), (8, 5)]:
        clusters.union(first, second)
    assert {position: clusters.find(position) for position in (3, 5, 7, 8, 9, 11)} == {
        3: 3, 5: 3, 7: 3, 8: 3, 9: 3, 11: 11}


@pytest.mark.parametrize("stage", [LineDeduplicator, DocumentDeduplicator, MinHashDeduplicator])
def test_dedup_passes_an_empty_corpus_through(stage):
    deduplicator = stage()
    assert run(deduplicator, []) == []
    assert deduplicator.stats.documents_in == deduplicator.stats.documents_out == 0
