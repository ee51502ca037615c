"""MinHash signatures and LSH banding: the arithmetic of near-duplicate detection, one document at a time.

    text -> normalise -> word n-grams ("shingles") -> 64-bit mmh3 hash each -> a sorted set of shingle hashes
    shingle hashes -> num_hashes universal hashes h(x) = (a*x + b) mod (2^61 - 1) -> the minimum of each = signature
    signature (num_hashes,) -> bands x rows -> one 64-bit mmh3 key per band: equal keys put two documents in one bucket

The universal hashes take the low 32 bits of each shingle hash (so a*x stays within the exact uint64 arithmetic of
`universal_hash`); the exact Jaccard check in gptlab.curate.dedup compares all 64 bits.

Broder (1997) showed that for a random permutation of the shingle universe, P[min of A == min of B] = J(A, B), the
Jaccard similarity |A ∩ B| / |A ∪ B|; so the fraction of equal entries of two signatures estimates J with standard
error sqrt(J(1 - J)/num_hashes). Banding (Leskovec, Rajaraman & Ullman, Mining of Massive Datasets, ch. 3.4) cuts the
signature into b bands of r rows: two documents become candidates when all r rows of any band agree, which for
Jaccard s happens with probability 1 - (1 - s^r)^b, an S-curve rising steeply around (1/b)^(1/r). With the defaults
(b = 16, r = 8, so 128 hashes) the rise is at 0.71: a pair at s = 0.8 becomes a candidate with probability 0.947,
at s = 0.9 0.9999, at s = 0.5 only 0.061 (and those few are rejected by the exact check in gptlab.curate.dedup).

Not here: reading the corpus, buckets, verification and clusters (gptlab.curate.dedup).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

import mmh3
import numpy as np

from gptlab.runtime import GptlabError

MERSENNE = (1 << 61) - 1  # the prime modulus of the universal hashes: reduction mod 2^61 - 1 is a shift and an add
LOW_32 = (1 << 32) - 1
LOW_29 = (1 << 29) - 1
CHUNK = 512  # shingles per block of a signature: (num_hashes, CHUNK) uint64 blocks, 0.5 MB at 128 hashes
_PUNCTUATION = re.compile(r"[^\w\s]|_")  # after NFD this also takes the combining accents (they are not \w)
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True, kw_only=True)
class MinHashConfig:
    """Near-duplicate detection. num_hashes = bands * rows; see the module docstring for how bands and rows set
    which similarities become candidates, and `candidate_probability` to compute it."""

    ngram: int = 5  # words per shingle
    num_hashes: int = 128  # signature length: the estimate of J has standard error sqrt(J(1-J)/num_hashes)
    bands: int = 16  # LSH bands; rows per band = num_hashes // bands
    threshold: float = 0.8  # documents whose shingle sets have Jaccard >= threshold are near duplicates
    normalise: bool = True  # NFD, strip accents and punctuation, lowercase, collapse whitespace, before shingling
    seed: int = 0  # picks the universal hashes; the same seed gives the same signatures

    def __post_init__(self) -> None:
        for name in ("ngram", "num_hashes", "bands"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise GptlabError(f"minhash.{name}={getattr(self, name)!r} must be a positive integer")
        if self.num_hashes % self.bands:
            rows = max(1, round(self.num_hashes / self.bands))
            raise GptlabError(f"minhash.num_hashes={self.num_hashes} is not bands={self.bands} x rows: set num_hashes "
                              f"to {self.bands * rows} ({self.bands} bands of {rows} rows) or pick bands dividing it")
        if not 0.0 < self.threshold <= 1.0:
            raise GptlabError(f"minhash.threshold={self.threshold} is a Jaccard similarity: use a value in (0, 1], "
                              "e.g. 0.8")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= LOW_32:
            raise GptlabError(f"minhash.seed={self.seed!r} must be an integer in [0, 2^32 - 1]")

    @property
    def rows(self) -> int:
        return self.num_hashes // self.bands


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """P[a pair with Jaccard `similarity` shares at least one band bucket] = 1 - (1 - s^r)^b: one band agrees with
    probability s^r (each row is an independent min-hash that agrees with probability s), and the b bands are
    independent. E.g. b=16, r=8: 0.947 at s=0.8, 0.061 at s=0.5."""
    return 1.0 - (1.0 - similarity**rows) ** bands


def normalise_text(text: str) -> str:
    """NFD, then accents (combining marks), punctuation and symbols removed, lowercase, whitespace runs as one space,
    as the CS336 data assignment suggests: "Héllo,  WORLD!" -> "hello world"."""
    decomposed = unicodedata.normalize("NFD", text)
    return _WHITESPACE.sub(" ", _PUNCTUATION.sub("", decomposed).lower()).strip()


def utf8(text: str) -> bytes:
    """The text's UTF-8 bytes, lone surrogates (which JSON can carry) kept distinct rather than failing; we always hand
    mmh3 bytes, since mmh3 5.x crashes the interpreter on a str holding a lone surrogate."""
    return text.encode("utf-8", errors="surrogatepass")


def shingle_hashes(text: str, config: MinHashConfig) -> np.ndarray:
    """The document's set of word n-grams, as sorted unique 64-bit mmh3 hashes (uint64). A text of fewer than
    `ngram` words is one shingle of all its words; a text without words has none. With ngram=2:
    "a b c a b" -> {"a b", "b c", "c a"} -> 3 hashes."""
    words = (normalise_text(text) if config.normalise else text).split()
    if not words:
        return np.empty(0, dtype=np.uint64)
    count = max(1, len(words) - config.ngram + 1)
    grams = (" ".join(words[start:start + config.ngram]) for start in range(count))
    hashes = np.fromiter((mmh3.hash64(utf8(gram), signed=False)[0] for gram in grams), dtype=np.uint64, count=count)
    return np.unique(hashes)


def permutation_parameters(config: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    """The num_hashes universal hashes (a_i, b_i), a in [1, p), b in [0, p), p = 2^61 - 1, drawn from `seed`."""
    generator = np.random.default_rng(config.seed)
    a = generator.integers(1, MERSENNE, size=config.num_hashes, dtype=np.uint64)
    b = generator.integers(0, MERSENNE, size=config.num_hashes, dtype=np.uint64)
    return a, b


def workspace(num_hashes: int) -> np.ndarray:
    """Scratch space for `signature`, to reuse from document to document: fresh (num_hashes, shingles) temporaries
    for every document come from the allocator as new pages each time, which makes signatures ~4x slower."""
    return np.empty((3, num_hashes * CHUNK), dtype=np.uint64)


def universal_hash(x: np.ndarray, a: np.ndarray, b: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """(a_i * x_j + b_i) mod (2^61 - 1) for every i, j, exactly, in uint64: shape (len(a), len(x)). With `scratch`
    (from `workspace`, used when len(x) <= CHUNK) the result is a view into it, valid until the next call.

    x < 2^32 and a < 2^61, so a*x needs up to 93 bits and uint64 would silently wrap. We split a = a_hi*2^32 + a_lo:
    a_lo*x < 2^64 fits; a_hi*x < 2^61 fits, and its shift by 32 is reduced with 2^61 = 1 (mod p): writing
    t = a_hi*x = t1*2^29 + t0, t*2^32 = t1*2^61 + t0*2^32 = t1 + t0*2^32 (mod p). Every term is then below 2^61 + 8,
    their sum with b below 2^63, and one more fold plus one conditional subtraction lands in [0, p). About fifteen
    vectorised operations in place: 128 hashes of 500 shingles take ~0.4 ms, against ~12 ms for Python integers or
    for one mmh3 call per (shingle, seed)."""
    rows, columns = len(a), len(x)
    if scratch is None or scratch.shape[1] < rows * columns:
        scratch = np.empty((3, rows * columns), dtype=np.uint64)
    high, low, total = (scratch[index, :rows * columns].reshape(rows, columns) for index in range(3))
    np.multiply((a >> np.uint64(32))[:, None], x[None, :], out=high)  # the part of a*x multiplied by 2^32, < 2^61
    np.multiply((a & np.uint64(LOW_32))[:, None], x[None, :], out=low)  # < 2^64
    np.right_shift(high, np.uint64(29), out=total)  # t1
    high &= np.uint64(LOW_29)
    high <<= np.uint64(32)  # t0 * 2^32
    total += high
    np.right_shift(low, np.uint64(61), out=high)  # low = (low >> 61) * 2^61 + (low & p) = (low >> 61) + (low & p)
    total += high
    low &= np.uint64(MERSENNE)
    total += low
    total += b[:, None]
    np.right_shift(total, np.uint64(61), out=high)  # fold again: total is now <= p + 3
    total &= np.uint64(MERSENNE)
    total += high
    # subtract p where total >= p, without a comparison (np.where is ~6x slower): exactly there total + 1 reaches 2^61
    np.add(total, np.uint64(1), out=high)
    high >>= np.uint64(61)
    total += high
    total &= np.uint64(MERSENNE)
    return total


def signature(hashes: np.ndarray, a: np.ndarray, b: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """The MinHash signature (len(a),) uint64 of a set of shingle hashes: the minimum of each universal hash over the
    set, CHUNK shingles at a time. The permutations act on the low 32 bits of each shingle hash. An empty set gives
    p = 2^61 - 1 in every entry, above any real value (gptlab.curate.dedup never makes such a document a candidate).
    Pass `scratch=workspace(len(a))` when signing many documents."""
    result = np.full(len(a), MERSENNE, dtype=np.uint64)
    x = hashes & np.uint64(LOW_32)
    scratch = workspace(len(a)) if scratch is None else scratch
    for start in range(0, len(x), CHUNK):
        np.minimum(result, universal_hash(x[start:start + CHUNK], a, b, scratch).min(axis=1), out=result)
    return result


def band_keys(signature_values: np.ndarray, bands: int) -> np.ndarray:
    """One 64-bit key per band, the mmh3 hash of the band's rows' bytes: (bands,) uint64. Two documents share a
    bucket of band i when their keys i are equal, i.e. (but for a 2^-64 collision) when all of its rows agree."""
    rows = signature_values.reshape(bands, -1)
    return np.array([mmh3.hash64(rows[band].tobytes(), seed=band, signed=False)[0] for band in range(bands)],
                    dtype=np.uint64)


def jaccard(first: np.ndarray, second: np.ndarray) -> float:
    """|A ∩ B| / |A ∪ B| of two sorted unique hash arrays (0 when both are empty)."""
    common = np.intersect1d(first, second, assume_unique=True).size
    union = first.size + second.size - common
    return common / union if union else 0.0
