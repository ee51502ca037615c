"""The trained quality classifier against reference fits, its file round trip, GPT-3's Pareto rule, and fastText
filters on a tiny model trained here."""

import pickle
import random
import sys

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse
from scipy.special import expit

from gptlab.curate.classifier import (
    ClassifierConfig,
    FastTextConfig,
    FastTextFilter,
    QualityClassifier,
    QualityFilter,
    QualityFilterConfig,
    feature_row,
    fit_logistic_regression,
    hashed_features,
    held_out_accuracy,
    logistic_loss,
    pareto_keep,
    train_quality_classifier,
)
from gptlab.curate.document import Document
from gptlab.runtime import GptlabError

SUBJECTS = ["the committee", "my neighbour", "a young engineer", "the old library", "our teacher", "the city council",
            "the river", "a small company", "the scientists", "her brother"]
VERBS = ["reviewed", "described", "built", "visited", "explained", "questioned", "repaired", "painted", "measured"]
OBJECTS = ["the new bridge", "a careful plan", "the history of the town", "an unusual result", "the garden",
           "the results of the survey", "a letter to the editor", "the museum's collection", "the budget"]
ENDINGS = ["last week", "with great care", "before the winter", "after a long debate", "in the morning",
           "for the first time", "despite the rain"]
SPAM = ["cheap", "free", "casino", "bonus", "click", "here", "buy", "now", "best", "price", "deal", "win", "login",
        "cart", "home", "contact", "privacy", "policy", "terms", "copyright", "subscribe", "download", "discount"]
SEPARATORS = [" | ", ", ", " ", " !!! ", " >> ", " - "]


def prose(generator: random.Random) -> str:
    sentences = [f"{generator.choice(SUBJECTS)} {generator.choice(VERBS)} {generator.choice(OBJECTS)} "
                 f"{generator.choice(ENDINGS)}." for _ in range(generator.randint(2, 5))]
    return " ".join(sentence[0].upper() + sentence[1:] for sentence in sentences)


def spam(generator: random.Random) -> str:
    """Keyword lists and boilerplate, sharing some of prose's nouns so single words alone do not decide."""
    words = [generator.choice(SPAM + ["bridge", "garden", "museum", "budget", "town"]) for _ in range(generator.randint(6, 20))]
    separator = generator.choice(SEPARATORS)
    return separator.join(word.upper() if generator.random() < 0.2 else word for word in words)


def dataset(seed: int, size: int) -> tuple[list[str], list[str]]:
    generator = random.Random(seed)
    return [prose(generator) for _ in range(size)], [spam(generator) for _ in range(size)]


# The features.

def test_feature_row_counts_words_and_bigrams_sublinearly_and_normalises():
    indices, values = feature_row("Buy now! Buy now!", ClassifierConfig())
    assert len(indices) == 6 and list(indices) == sorted(indices)  # buy, now, !, "buy now", "now !", "! buy"
    expected = np.sort(np.array([1 + np.log(2)] * 5 + [1.0]))
    assert np.sort(values) == pytest.approx(expected / np.linalg.norm(expected))
    assert np.linalg.norm(values) == pytest.approx(1.0)


def test_feature_row_is_case_insensitive_and_empty_text_has_no_features():
    config = ClassifierConfig()
    assert np.array_equal(feature_row("Hello World", config)[0], feature_row("hello world", config)[0])
    indices, values = feature_row("", config)
    assert len(indices) == 0 and len(values) == 0


def test_hashed_features_stack_feature_rows():
    config = ClassifierConfig(buckets=64)
    texts = ["one two three", "", "two two four!"]
    matrix = hashed_features(texts, config)
    assert matrix.shape == (3, 64)
    for row, text in enumerate(texts):
        indices, values = feature_row(text, config)
        assert np.array_equal(matrix[row].indices, indices) and np.allclose(matrix[row].data, values)


# The logistic regression, against references.

def small_problem(seed: int = 0, rows: int = 30, columns: int = 8):
    generator = np.random.default_rng(seed)
    features = scipy.sparse.random(rows, columns, density=0.5, format="csr", random_state=seed)
    labels = (generator.random(rows) < 0.5).astype(float)
    sample_weights = generator.uniform(0.5, 2.0, rows)
    return features, labels, sample_weights


def test_logistic_loss_gradient_matches_central_differences():
    features, labels, sample_weights = small_problem()
    parameters = np.random.default_rng(1).normal(size=features.shape[1] + 1)
    _, gradient = logistic_loss(parameters, features, labels, sample_weights, 0.1)
    step = 1e-6
    numeric = []
    for index in range(len(parameters)):
        shift = np.zeros_like(parameters)
        shift[index] = step
        numeric.append((logistic_loss(parameters + shift, features, labels, sample_weights, 0.1)[0]
                        - logistic_loss(parameters - shift, features, labels, sample_weights, 0.1)[0]) / (2 * step))
    assert gradient == pytest.approx(np.array(numeric), abs=1e-8)


def reference_loss(parameters, dense, labels, sample_weights, l2):
    """The same objective written plainly: weighted mean of ln(1 + e^(-y z)), y in {-1, +1}, plus (l2/2)|w|^2."""
    weights, bias = parameters[:-1], parameters[-1]
    signs = 2 * labels - 1
    margins = signs * (dense @ weights + bias)
    return float(np.sum(sample_weights * np.log1p(np.exp(-margins))) / np.sum(sample_weights) + l2 / 2 * weights @ weights)


def test_fit_matches_minimising_the_plain_loss_without_a_gradient():
    features, labels, sample_weights = small_problem()
    fit = fit_logistic_regression(features, labels, l2=0.01, sample_weights=sample_weights, tolerance=1e-10)
    reference = scipy.optimize.minimize(reference_loss, np.zeros(features.shape[1] + 1), method="BFGS",
                                        args=(features.toarray(), labels, sample_weights, 0.01), options={"gtol": 1e-9})
    assert fit.converged
    assert fit.loss == pytest.approx(reference.fun, rel=1e-9)
    assert np.append(fit.weights, fit.bias) == pytest.approx(reference.x, abs=1e-4)


def test_fit_ends_where_the_gradient_vanishes():
    features, labels, sample_weights = small_problem(seed=3, rows=200, columns=50)
    fit = fit_logistic_regression(features, labels, l2=1e-3, sample_weights=sample_weights, tolerance=1e-7)
    _, gradient = logistic_loss(np.append(fit.weights, fit.bias), features, labels, sample_weights, 1e-3)
    assert fit.converged and np.abs(gradient).max() < 1e-6  # gradients start near 0.5


def test_fit_matches_scikit_learn_balanced_logistic_regression():
    linear_model = pytest.importorskip("sklearn.linear_model")
    positives, negatives = dataset(seed=5, size=60)
    config = ClassifierConfig(buckets=512, l2=1e-2, tolerance=1e-10)
    classifier = train_quality_classifier(positives, negatives[:40], config=config)
    features = hashed_features(positives + negatives[:40], config)
    labels = np.array([1] * 60 + [0] * 40)
    # sklearn minimises C * sum(class weight * loss) + |w|^2 / 2; ours divides that by C * n: C = 1 / (n * l2)
    reference = linear_model.LogisticRegression(C=1 / (len(labels) * config.l2), class_weight="balanced", tol=1e-12,
                                                max_iter=10_000).fit(features, labels)
    assert classifier.weights == pytest.approx(reference.coef_[0], abs=1e-5)
    assert classifier.bias == pytest.approx(reference.intercept_[0], abs=1e-5)


# The trained classifier.

@pytest.fixture(scope="module")
def trained() -> QualityClassifier:
    positives, negatives = dataset(seed=0, size=200)
    return train_quality_classifier(positives, negatives)


def test_trained_classifier_separates_held_out_examples(trained):
    positives, negatives = dataset(seed=1, size=100)
    scores = trained.scores(positives + negatives)
    accuracy = np.mean(np.concatenate([scores[:100] >= 0.5, scores[100:] < 0.5]))
    assert accuracy > 0.9
    assert trained.training["converged"] and trained.training["positives"] == 200


def test_score_is_the_sigmoid_of_the_weighted_features(trained):
    texts = dataset(seed=2, size=5)[0] + ["", "win win win"]
    features = hashed_features(texts, trained.config)
    direct = expit(features.toarray() @ trained.weights + trained.bias)
    assert [trained.score(text) for text in texts] == pytest.approx(direct, rel=1e-12)
    assert trained.scores(texts) == pytest.approx(direct, rel=1e-12)


def test_save_and_load_give_identical_scores(trained, tmp_path):
    path = tmp_path / "quality.npz"
    trained.save(path)
    loaded = QualityClassifier.load(path)
    texts = sum(dataset(seed=3, size=10), [])
    assert [loaded.score(text) for text in texts] == [trained.score(text) for text in texts]
    assert loaded.config == trained.config and loaded.training == trained.training


def test_load_explains_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(GptlabError, match="not found"):
        QualityClassifier.load(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(GptlabError, match="not a gptlab quality classifier"):
        QualityClassifier.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", weights=np.zeros(4), metadata=np.array('{"format": "other", "version": 1}'))
    with pytest.raises(GptlabError, match="format 'other'"):
        QualityClassifier.load(tmp_path / "other.npz")


def test_training_needs_both_classes():
    with pytest.raises(GptlabError, match="got 2 positive and 0 negative"):
        train_quality_classifier(["a b", "c d"], [])


@pytest.mark.parametrize("negatives", [["a b", "c d"], ["a b", "c d", "e f"], ["a b"]])
def test_training_refuses_classes_that_one_holds_the_other(negatives):
    with pytest.raises(GptlabError, match=r"also a (negative|positive) one \(\d texts in both\): a classifier cannot tell"):
        train_quality_classifier(["a b", "c d"], negatives)


def test_held_out_accuracy_separates_real_classes_and_finds_a_coin_at_chance():
    """Spam against prose is learned; prose against other prose is not, and reads as chance."""
    positives, negatives = dataset(seed=4, size=60)
    learned = held_out_accuracy(positives, negatives)
    assert learned["held_out_examples"] == 24 and learned["held_out_accuracy"] > learned["chance_bound"]
    assert learned["chance_bound"] == pytest.approx(0.5 + 2 * 0.25 * (2 / 12) ** 0.5)
    more_prose = dataset(seed=5, size=60)[0]
    coin = held_out_accuracy(positives, more_prose)
    assert coin["held_out_accuracy"] < coin["chance_bound"]
    assert held_out_accuracy(positives[:20], negatives[:20]) is None  # 4 per class held out: too few to judge


# The filter and GPT-3's Pareto rule.

def constant_classifier(score_logit: float = 0.0) -> QualityClassifier:
    config = ClassifierConfig(buckets=16)
    return QualityClassifier(config, np.zeros(16), score_logit)  # every text scores sigmoid(score_logit)


def test_quality_filter_keeps_a_score_at_the_threshold_and_records_it():
    document = Document(id="a", text="anything")
    assert QualityFilter(QualityFilterConfig(threshold=0.5), constant_classifier()).reject(document) is None
    assert document.metadata["quality_score"] == 0.5
    assert QualityFilter(QualityFilterConfig(threshold=0.6), constant_classifier()).reject(document) == "quality below 0.6"


def test_quality_filter_loads_its_classifier_and_drops_spam(trained, tmp_path):
    trained.save(tmp_path / "quality.npz")
    stage = QualityFilter(QualityFilterConfig(path=str(tmp_path / "quality.npz")))
    positives, negatives = dataset(seed=4, size=20)
    documents = [Document(id=f"p{index}", text=text) for index, text in enumerate(positives)]
    documents += [Document(id=f"n{index}", text=text) for index, text in enumerate(negatives)]
    kept = list(stage.run(documents))
    assert sum(document.id.startswith("p") for document in kept) >= 18
    assert stage.stats.reasons["quality below 0.5"] >= 18


def test_pareto_rule_is_reproducible_per_document_id():
    decisions = [pareto_keep(0.3, f"doc{index}") for index in range(200)]
    assert decisions == [pareto_keep(0.3, f"doc{index}") for index in range(200)]
    assert decisions != [pareto_keep(0.3, f"doc{index}", seed=1) for index in range(200)]
    stage = QualityFilter(QualityFilterConfig(rule="pareto"), constant_classifier(-1.0))
    documents = [Document(id=f"doc{index}", text="x") for index in range(200)]
    first = [document.id for document in stage.run(documents)]
    assert first == [document.id for document in stage.run(documents)]


@pytest.mark.parametrize("score", [0.1, 0.5, 0.9])
def test_pareto_rule_keeps_with_gpt3s_probability(score):
    kept = np.mean([pareto_keep(score, f"doc{index}") for index in range(4000)])
    assert kept == pytest.approx((2 - score) ** -9, abs=0.03)  # P(Lomax(9) > 1 - s); binomial std <= 0.008


@pytest.mark.parametrize("overrides, field", [({"rule": "random"}, "rule"), ({"threshold": 1.5}, "threshold"),
                                              ({"pareto_shape": 0}, "pareto_shape")])
def test_quality_filter_config_names_the_bad_field(overrides, field):
    with pytest.raises(GptlabError, match=field):
        QualityFilterConfig(**overrides)


def test_quality_filter_needs_a_path_or_a_classifier():
    with pytest.raises(GptlabError, match="path is empty"):
        QualityFilter(QualityFilterConfig())


# fastText: a tiny supervised model trained here.

@pytest.fixture(scope="module")
def fasttext_model(tmp_path_factory) -> str:
    fasttext = pytest.importorskip("fasttext")
    folder = tmp_path_factory.mktemp("fasttext")
    generator = random.Random(0)
    lines = []
    for _ in range(300):
        lines.append("__label__clean " + prose(generator).lower())
        lines.append("__label__toxic " + spam(generator).lower())
    generator.shuffle(lines)
    (folder / "train.txt").write_text("\n".join(lines) + "\n")
    model = fasttext.train_supervised(input=str(folder / "train.txt"), epoch=10, lr=0.5, dim=8, thread=1, seed=0, verbose=0)
    model.save_model(str(folder / "model.bin"))
    return str(folder / "model.bin")


def test_fasttext_filter_drops_what_the_model_scores_as_the_bad_label(fasttext_model):
    stage = FastTextFilter(FastTextConfig(path=fasttext_model, label="__label__toxic"))
    generator = random.Random(7)
    documents = [Document(id=f"clean{index}", text=prose(generator).lower().replace(". ", ".\n")) for index in range(10)]
    documents += [Document(id=f"toxic{index}", text=spam(generator).lower()) for index in range(10)]
    kept = list(stage.run(documents))
    assert [document.id for document in kept] == [f"clean{index}" for index in range(10)]
    assert stage.stats.reasons == {"fasttext_toxic at or above 0.5": 10}
    assert all(document.metadata["fasttext_toxic"] < 0.5 for document in kept)
    assert documents[-1].metadata["fasttext_toxic"] >= 0.5


def test_fasttext_filter_keeps_scores_above_when_asked(fasttext_model):
    stage = FastTextFilter(FastTextConfig(path=fasttext_model, label="__label__clean", keep_if="above", name="clean"))
    assert stage.name == "clean" and stage.stats.name == "clean"
    assert stage.reject(Document(id="a", text=prose(random.Random(1)).lower())) is None
    assert stage.reject(Document(id="b", text="cheap casino bonus click here")) == "clean below 0.5"


def test_fasttext_filter_survives_pickling_for_worker_processes(fasttext_model):
    stage = FastTextFilter(FastTextConfig(path=fasttext_model, label="__label__toxic"))
    copy = pickle.loads(pickle.dumps(stage))
    text = "free bonus for the new bridge"
    assert copy.score(text) == stage.score(text)


def test_fasttext_filter_explains_a_missing_file_a_bad_file_and_an_unknown_label(fasttext_model, tmp_path):
    with pytest.raises(GptlabError, match="not found.*never downloads"):
        FastTextFilter(FastTextConfig(path=str(tmp_path / "missing.bin"), label="__label__toxic"))
    (tmp_path / "junk.bin").write_bytes(b"junk")
    with pytest.raises(GptlabError, match="not a fastText model"):
        FastTextFilter(FastTextConfig(path=str(tmp_path / "junk.bin"), label="__label__toxic"))
    with pytest.raises(GptlabError, match="no label '__label__nsfw'.*__label__toxic"):
        FastTextFilter(FastTextConfig(path=fasttext_model, label="__label__nsfw"))


def test_fasttext_filter_says_what_to_install_without_fasttext(fasttext_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "fasttext", None)  # import fasttext now raises ImportError
    with pytest.raises(GptlabError, match="needs the fasttext-wheel package, from gptlab's 'curate' extra: make install-curate"):
        FastTextFilter(FastTextConfig(path=fasttext_model, label="__label__toxic"))


def test_fasttext_config_names_the_bad_field():
    with pytest.raises(GptlabError, match="keep_if"):
        FastTextConfig(path="m.bin", label="__label__toxic", keep_if="sideways")
    with pytest.raises(GptlabError, match="label is empty"):
        FastTextConfig(path="m.bin", label="")
