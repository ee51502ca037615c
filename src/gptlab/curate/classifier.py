"""Model-based quality filters: a classifier the user trains on their own examples, and fastText models they provide.

    classifier = train_quality_classifier(reference_texts, crawl_texts)    # high quality vs the rest
    classifier.save("quality.npz")
    stage = QualityFilter(QualityFilterConfig(path="quality.npz"))        # drops "quality below 0.5"
    stage = FastTextFilter(FastTextConfig(path="toxic.bin", label="__label__toxic"))

The trained classifier is GPT-3's (Brown et al. 2020, appendix A) and the CS336 data assignment's: lower-cased
words and their bigrams hashed into `buckets` features, logistic regression on top. Here the regression is written
out: the L2-regularised mean log loss with its analytic gradient, minimised by scipy's L-BFGS on CSR matrices.
GPT-3's stochastic rule (keep a document if a Pareto(9) draw exceeds 1 - score) is `rule="pareto"`.

Format: an .npz with "weights" (float64, one per bucket) and "metadata", a JSON string holding the format name,
version, feature config, bias and a training summary. fastText models are the user's .bin files (Dolma's,
FineWeb-Edu-style, their own): gptlab never downloads one. Not here: the Gopher rules (gptlab.curate.quality).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import zipfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import mmh3
import numpy as np
import scipy.sparse
from scipy.special import expit

from gptlab.curate.document import Document, Filter
from gptlab.curate.minhash import utf8
from gptlab.runtime import GptlabError, atomic_write_bytes
from gptlab.runtime.optional import require
from gptlab.runtime.processes import one_blas_thread

FORMAT = "gptlab-quality-classifier"
VERSION = 1
TOKEN = re.compile(r"\w+|[^\w\s]+")  # runs of word characters, and runs of punctuation ("!!!" is a feature too)


@dataclass(frozen=True, kw_only=True)
class ClassifierConfig:
    """The features and the fit of a trained quality classifier (saved with it: scoring needs the same features)."""

    buckets: int = 2**18  # hashed features; collisions are rare at this size for a vocabulary of ~10^5 words
    word_ngrams: int = 2  # 1: words only; 2: words and bigrams (GPT-3); n: up to n-grams
    hash_seed: int = 0
    l2: float = 1e-4  # weight of (l2 / 2) * |w|^2 beside the mean log loss; the bias is not penalised
    balance_classes: bool = True  # weigh each class equally, however many examples each has
    max_iterations: int = 1000  # L-BFGS iterations
    tolerance: float = 1e-6  # stop when every gradient component is below this

    def __post_init__(self) -> None:
        for name in ("buckets", "word_ngrams", "max_iterations"):
            if getattr(self, name) < 1:
                raise GptlabError(f"ClassifierConfig.{name}={getattr(self, name)} must be at least 1")
        if self.l2 < 0 or self.tolerance <= 0:
            raise GptlabError(f"ClassifierConfig l2={self.l2}, tolerance={self.tolerance}: give l2 >= 0 and tolerance > 0")


def feature_row(text: str, config: ClassifierConfig) -> tuple[np.ndarray, np.ndarray]:
    """One text's features as (bucket indices ascending, values): sublinear counts 1 + ln(count), L2-normalised.

    Normalising keeps a long page's scores as confident as a short one's, as Spark's HashingTF + Normalizer did for
    GPT-3. Worked example with word_ngrams=2: "Buy now! Buy now!" -> tokens buy, now, !, buy, now, ! -> grams buy,
    now, !, "buy now", "now !", "! buy" (each but "! buy" twice), hashed with MurmurHash3 into buckets.
    """
    tokens = TOKEN.findall(text.lower())
    grams = list(tokens)
    for n in range(2, config.word_ngrams + 1):
        grams += [" ".join(tokens[start:start + n]) for start in range(len(tokens) - n + 1)]
    counts = Counter(mmh3.hash(utf8(gram), config.hash_seed, signed=False) % config.buckets for gram in grams)  # bytes: mmh3 5 crashes on lone surrogates
    indices = np.array(sorted(counts), dtype=np.int64)
    values = 1.0 + np.log(np.array([counts[index] for index in indices], dtype=np.float64))
    norm = math.sqrt(float(values @ values)) if len(values) else 1.0
    return indices, values / norm


def hashed_features(texts: Iterable[str], config: ClassifierConfig) -> scipy.sparse.csr_matrix:
    """Texts as a CSR matrix, one row per text, `config.buckets` columns."""
    rows = [feature_row(text, config) for text in texts]
    pointers = np.cumsum([0] + [len(indices) for indices, _ in rows])
    indices = np.concatenate([indices for indices, _ in rows]) if rows else np.zeros(0, np.int64)
    values = np.concatenate([values for _, values in rows]) if rows else np.zeros(0)
    return scipy.sparse.csr_matrix((values, indices, pointers), shape=(len(rows), config.buckets))


def logistic_loss(parameters: np.ndarray, features, labels: np.ndarray, sample_weights: np.ndarray,
                  l2: float) -> tuple[float, np.ndarray]:
    """The weighted mean log loss plus (l2 / 2)|w|^2, and its gradient, at parameters = (w, b).

    With z = Xw + b and p = sigmoid(z): loss_i = ln(1 + e^z) - y z, whose derivative in z is p - y, so
    dL/dw = X^T (s * (p - y)) / sum(s) + l2 w and dL/db = sum(s * (p - y)) / sum(s) for sample weights s.
    logaddexp and expit keep it finite for any z.
    """
    weights, bias = parameters[:-1], parameters[-1]
    logits = features @ weights + bias
    total = sample_weights.sum()
    loss = float(sample_weights @ (np.logaddexp(0.0, logits) - labels * logits)) / total + 0.5 * l2 * float(weights @ weights)
    residual = sample_weights * (expit(logits) - labels) / total
    gradient = np.empty_like(parameters)
    gradient[:-1] = features.T @ residual + l2 * weights
    gradient[-1] = residual.sum()
    return loss, gradient


@dataclass(frozen=True)
class LogisticFit:
    """A fitted logistic regression: its weights and bias, the regularised loss reached, and how L-BFGS ended."""

    weights: np.ndarray
    bias: float
    loss: float
    iterations: int
    converged: bool


def fit_logistic_regression(features, labels: np.ndarray, *, l2: float, sample_weights: np.ndarray | None = None,
                            max_iterations: int = 1000, tolerance: float = 1e-6) -> LogisticFit:
    """Minimise `logistic_loss` from zero with L-BFGS; the loss is convex, so its one minimum is the answer."""
    import scipy.optimize  # only training needs it; imported before the BLAS limit, which applies to loaded libraries

    labels = np.asarray(labels, dtype=np.float64)
    sample_weights = np.ones_like(labels) if sample_weights is None else np.asarray(sample_weights, dtype=np.float64)
    start = np.zeros(features.shape[1] + 1)
    with one_blas_thread():
        result = scipy.optimize.minimize(logistic_loss, start, args=(features, labels, sample_weights, l2), jac=True,
                                         method="L-BFGS-B", options={"maxiter": max_iterations, "gtol": tolerance,
                                                                     "ftol": 1e-13})
    return LogisticFit(weights=result.x[:-1].copy(), bias=float(result.x[-1]), loss=float(result.fun),
                       iterations=int(result.nit), converged=bool(result.success))


class QualityClassifier:
    """A trained classifier: `score(text)` is its probability that the text is like the positive examples."""

    def __init__(self, config: ClassifierConfig, weights: np.ndarray, bias: float, training: dict | None = None) -> None:
        if weights.shape != (config.buckets,):
            raise GptlabError(f"quality classifier weights have shape {weights.shape}, expected ({config.buckets},)")
        self.config, self.weights, self.bias, self.training = config, weights, float(bias), training or {}

    def score(self, text: str) -> float:
        indices, values = feature_row(text, self.config)
        return float(expit(self.bias + values @ self.weights[indices]))

    def scores(self, texts: Iterable[str]) -> np.ndarray:
        """Many texts at once (one sparse product); equal to `score` on each up to float rounding."""
        return expit(hashed_features(texts, self.config) @ self.weights + self.bias)

    def save(self, path: str | Path) -> None:
        metadata = {"format": FORMAT, "version": VERSION, "config": asdict(self.config), "bias": self.bias,
                    "training": self.training}
        buffer = io.BytesIO()
        np.savez_compressed(buffer, weights=self.weights, metadata=np.array(json.dumps(metadata)))
        atomic_write_bytes(path, buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> QualityClassifier:
        path = Path(path)
        if not path.is_file():
            raise GptlabError(f"quality classifier {path} not found: train one with `gptlab data train-quality` "
                              f"--out {str(path)!r}")
        try:
            with np.load(path, allow_pickle=False) as archive:
                metadata = json.loads(str(archive["metadata"]))
                weights = archive["weights"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise GptlabError(f"{path} is not a gptlab quality classifier ({error}): give a file saved by "
                              f"QualityClassifier.save") from None
        if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
            raise GptlabError(f"{path} holds format {metadata.get('format')!r} version {metadata.get('version')!r}; this "
                              f"gptlab reads {FORMAT!r} version {VERSION}: retrain and save it with this version")
        return cls(ClassifierConfig(**metadata["config"]), weights, metadata["bias"], metadata["training"])


def is_classifier_file(path: str | Path) -> bool:
    """Whether `path` is a file QualityClassifier.save wrote (any version): what `--force` may replace."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return json.loads(str(archive["metadata"])).get("format") == FORMAT
    except (OSError, ValueError, KeyError, AttributeError, zipfile.BadZipFile):
        return False


def train_quality_classifier(positives: Iterable[str], negatives: Iterable[str], *,
                             config: ClassifierConfig | None = None) -> QualityClassifier:
    """A classifier scoring texts like `positives` (e.g. pages cited by Wikipedia) near 1, like `negatives` near 0.

    With balance_classes, each class's examples weigh n / (2 n_class), so the classes count equally however
    unequal their sizes (scikit-learn's class_weight="balanced").
    """
    config = config or ClassifierConfig()
    positives, negatives = list(positives), list(negatives)
    if not positives or not negatives:
        raise GptlabError(f"training a quality classifier needs both classes: got {len(positives)} positive and "
                          f"{len(negatives)} negative examples")
    _check_distinct(positives, negatives)
    labels = np.concatenate([np.ones(len(positives)), np.zeros(len(negatives))])
    sample_weights = np.ones_like(labels)
    if config.balance_classes:
        total = len(labels)
        sample_weights = np.where(labels == 1, total / (2 * len(positives)), total / (2 * len(negatives)))
    features = hashed_features(positives + negatives, config)
    fit = fit_logistic_regression(features, labels, l2=config.l2, sample_weights=sample_weights,
                                  max_iterations=config.max_iterations, tolerance=config.tolerance)
    accuracy = float(np.mean((features @ fit.weights + fit.bias > 0) == (labels == 1)))
    training = {"positives": len(positives), "negatives": len(negatives), "loss": fit.loss, "iterations": fit.iterations,
                "converged": fit.converged, "training_accuracy": accuracy}
    return QualityClassifier(config, fit.weights, fit.bias, training)


def _check_distinct(positives: list[str], negatives: list[str]) -> None:
    """Refuse classes that cannot be told apart: every example of one is also an example of the other (the same
    files given twice), so the classifier would learn nothing and score everything near 0.5."""
    shared = set(positives) & set(negatives)
    for name, texts, other in (("positive", positives, "negative"), ("negative", negatives, "positive")):
        if shared >= set(texts):
            raise GptlabError(f"every {name} example is also a {other} one ({len(shared):,} texts in both): a classifier "
                              "cannot tell them apart; give --negatives that differ from the POSITIVES")


HELD_OUT_FRACTION = 0.2
MIN_HELD_OUT = 5  # held-out examples per class, at least: fewer give an accuracy too noisy to judge


def held_out_accuracy(positives: list[str], negatives: list[str], *, config: ClassifierConfig | None = None,
                      seed: int = 0) -> dict | None:
    """How well a classifier trained on the rest sorts a held-out fifth of each class: its balanced accuracy (the
    mean of the two classes' accuracies, 0.5 for a coin whatever the class sizes) and `chance_bound`, two standard
    deviations of a coin's balanced accuracy above 0.5. Below the bound, the classifier is indistinguishable from
    chance. None where a class has too few examples to hold any out.

        held_out_accuracy(prose, junk)  # {"held_out_accuracy": 0.97, "held_out_examples": 40, "chance_bound": 0.66}
    """
    rng = np.random.default_rng(seed)
    splits = []
    for texts in (positives, negatives):
        held = int(len(texts) * HELD_OUT_FRACTION)
        if held < MIN_HELD_OUT:
            return None
        order = rng.permutation(len(texts))
        splits.append(([texts[i] for i in order[held:]], [texts[i] for i in order[:held]]))
    (train_positives, held_positives), (train_negatives, held_negatives) = splits
    classifier = train_quality_classifier(train_positives, train_negatives, config=config)
    accuracy = (np.mean(classifier.scores(held_positives) >= 0.5) + np.mean(classifier.scores(held_negatives) < 0.5)) / 2
    spread = 0.25 * math.sqrt(1 / len(held_positives) + 1 / len(held_negatives))  # std of a coin's balanced accuracy
    return {"held_out_accuracy": float(accuracy), "held_out_examples": len(held_positives) + len(held_negatives),
            "chance_bound": 0.5 + 2 * spread}


RULES = ("threshold", "pareto")


@dataclass(frozen=True, kw_only=True)
class QualityFilterConfig:
    """Which trained classifier to apply and how its score decides.

    rule="threshold": keep a document scoring at least `threshold`. rule="pareto": GPT-3's rule, keep it when
    a draw from numpy's Pareto(pareto_shape) (a Lomax: P(draw > x) = (1 + x)^-shape) exceeds 1 - score, so some
    low-scoring documents survive for diversity: kept with probability (2 - score)^-9, 1 at score 1, 0.2% at 0.
    The draw is seeded by the document's id and `seed` (MurmurHash3), so reruns keep the same documents.
    """

    path: str = ""  # a classifier saved by QualityClassifier.save
    threshold: float = 0.5
    rule: str = "threshold"
    pareto_shape: float = 9.0  # GPT-3's alpha
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise GptlabError(f"QualityFilterConfig.rule={self.rule!r}: give one of {', '.join(RULES)}")
        if not 0.0 <= self.threshold <= 1.0:
            raise GptlabError(f"QualityFilterConfig.threshold={self.threshold} is not a probability: give 0 to 1")
        if self.pareto_shape <= 0:
            raise GptlabError(f"QualityFilterConfig.pareto_shape={self.pareto_shape} must be positive (GPT-3: 9)")


def pareto_keep(score: float, document_id: str, *, shape: float = 9.0, seed: int = 0) -> bool:
    """GPT-3's stochastic rule for one document: np.random.pareto(shape) > 1 - score, the draw seeded by its id."""
    generator = np.random.default_rng(mmh3.hash(utf8(document_id), seed, signed=False))
    return bool(generator.pareto(shape) > 1.0 - score)


class QualityFilter(Filter):
    """Scores each document with a trained classifier into metadata["quality_score"], and keeps it by the rule."""

    name = "quality"

    def __init__(self, config: QualityFilterConfig, classifier: QualityClassifier | None = None) -> None:
        super().__init__()
        self.config = config
        if classifier is None and not config.path:
            raise GptlabError("QualityFilterConfig.path is empty: give the .npz a trained classifier was saved to")
        self.classifier = classifier or QualityClassifier.load(config.path)

    def reject(self, document: Document) -> str | None:
        config = self.config
        score = self.classifier.score(document.text)
        document.metadata["quality_score"] = score
        if config.rule == "pareto":
            keep = pareto_keep(score, document.id, shape=config.pareto_shape, seed=config.seed)
            return None if keep else f"quality: not drawn by the Pareto({config.pareto_shape:g}) rule"
        return None if score >= config.threshold else f"quality below {config.threshold:g}"


KEEP_IF = ("below", "above")


@dataclass(frozen=True, kw_only=True)
class FastTextConfig:
    """A user's fastText classifier as a filter: which label's probability to read and which side to keep."""

    path: str  # a fastText .bin model; gptlab never downloads one
    label: str  # e.g. "__label__toxic", as the model names it
    threshold: float = 0.5
    keep_if: str = "below"  # "below": keep scores under threshold (harmful labels); "above": keep scores >= threshold
    name: str = ""  # the stage's name and its score's metadata key; default "fasttext_" + the label without __label__

    def __post_init__(self) -> None:
        if self.keep_if not in KEEP_IF:
            raise GptlabError(f"FastTextConfig.keep_if={self.keep_if!r}: give one of {', '.join(KEEP_IF)}")
        if not 0.0 <= self.threshold <= 1.0:
            raise GptlabError(f"FastTextConfig.threshold={self.threshold} is not a probability: give 0 to 1")
        if not self.label:
            raise GptlabError("FastTextConfig.label is empty: give the model's label to score, e.g. '__label__toxic'")


def load_fasttext_model(path: str | Path):
    """fastText's model from a .bin file, fasttext imported only now (it is optional)."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"fastText model {path} not found: download the .bin model you want and give its path "
                          f"(gptlab never downloads one)")
    fasttext = require("fasttext", extra="curate", purpose="a fastText classifier")
    with contextlib.redirect_stderr(io.StringIO()):  # load_model warns on every call that it returns a FastText object
        try:
            return fasttext.load_model(str(path))
        except ValueError as error:
            raise GptlabError(f"{path} is not a fastText model ({error}): give a .bin saved by fastText") from None


class FastTextFilter(Filter):
    """Scores each document with a fastText model, records the label's probability, and keeps one side of it.

    fastText classifies one line: newlines become spaces, and nothing else changes, so a model trained on
    lower-cased or tokenised text should get text curated the same way. Scores come from the model's low-level
    `f.predict`, because fasttext 0.9.2's Python `predict` fails under NumPy 2 (np.array(..., copy=False)).
    """

    def __init__(self, config: FastTextConfig) -> None:
        self.name = config.name or "fasttext_" + config.label.removeprefix("__label__")
        super().__init__()
        self.config = config
        self.model = load_fasttext_model(config.path)
        labels = self.model.get_labels()
        if config.label not in labels:
            raise GptlabError(f"fastText model {config.path} has no label {config.label!r}: its labels are {labels}")

    def __getstate__(self) -> dict:
        """Worker processes get the config and reload the model: fastText's model object cannot be pickled."""
        return {**self.__dict__, "model": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.model = load_fasttext_model(self.config.path)

    def score(self, text: str) -> float:
        line = text.replace("\r", " ").replace("\n", " ") + "\n"  # the newline fastText's own predict appends
        line_bytes = line.encode("utf-8", errors="replace")  # as bytes, a stray surrogate cannot fail the call
        probabilities = {label: probability for probability, label in self.model.f.predict(line_bytes, -1, 0.0, "strict")}
        return probabilities.get(self.config.label, 0.0)

    def reject(self, document: Document) -> str | None:
        config = self.config
        score = self.score(document.text)
        document.metadata[self.name] = score
        if config.keep_if == "below" and score >= config.threshold:
            return f"{self.name} at or above {config.threshold:g}"
        if config.keep_if == "above" and score < config.threshold:
            return f"{self.name} below {config.threshold:g}"
        return None
