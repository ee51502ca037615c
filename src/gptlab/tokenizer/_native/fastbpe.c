/* gptlab.tokenizer._fastbpe: the compiled encoder. Same ids as the pure-Python reference, faster.
 *
 * What it owns:
 *   1. Pre-tokenization for the GPT-2, GPT-4 (cl100k) and o200k split patterns, hand-written as scanners over
 *      UTF-8 (no regex engine): each returns where the piece starting at a position ends, exactly as the
 *      `regex` module matches the patterns in patterns.py. Character classes come from a table that
 *      native.py builds from the installed `regex` at first use (set_char_classes), so they follow its
 *      Unicode version exactly. "none" (no pre-split) makes the whole text one piece.
 *   2. BPE on a piece: merge the adjacent pair of lowest rank, all its occurrences left to right, until
 *      no pair has a rank (core.Tokenizer._encode_piece). Short pieces rescan the pairs after each merge;
 *      long ones use a heap of (rank, position) over a linked list, O(n log n).
 *   3. Lookups that skip BPE: every vocabulary token's own bytes map to its BPE result (computed once),
 *      and each call keeps a cache of the other pieces it has seen.
 *   4. Counting pieces for training (PieceCounter).
 * The GIL is released while scanning and merging, so Python threads encode in parallel.
 * Not here: special tokens (split off in Python before text gets here), custom patterns (split by
 * `regex` in Python, then encode_pieces), training merges (_fasttrain.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bytes_map.h"

enum { PATTERN_NONE = 0, PATTERN_GPT2 = 1, PATTERN_GPT4 = 2, PATTERN_O200K = 3 };

/* ------------------------------------------------------------------ character classes */

/* Bits of the class table; native.CHAR_CLASSES says which `regex` class sets each. */
enum { CLASS_LETTER = 1, CLASS_NUMBER = 2, CLASS_SPACE = 4, CLASS_UPPERISH = 8, CLASS_LOWERISH = 16 };
#define N_CODE_POINTS 0x110000

static PyObject *class_owner = NULL;      /* the bytes object holding the table, kept alive for good */
static const uint8_t *class_table = NULL; /* one byte of CLASS_* bits per code point */

static inline uint8_t unicode_class(uint32_t cp) { return cp < N_CODE_POINTS ? class_table[cp] : 0; }

/* A pattern number is valid, and the scanners it needs have their character classes. */
static int check_pattern(int pattern) {
    if (pattern < PATTERN_NONE || pattern > PATTERN_O200K) {
        PyErr_SetString(PyExc_ValueError, "pattern must be 0 to 3");
        return -1;
    }
    if (pattern != PATTERN_NONE && !class_table) {
        PyErr_SetString(PyExc_RuntimeError, "character classes are not set: load this module through gptlab.tokenizer.native.fastbpe()");
        return -1;
    }
    return 0;
}
#define SMALL_PIECE 96   /* pieces up to this many bytes use the rescanning BPE */
#define CACHE_BYTES (64u << 20)  /* a call's piece cache is emptied when it grows past this */
#define NO_RANK UINT32_MAX

/* ------------------------------------------------------------------ hashing */

static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0x100000001b3ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return mix64(h ^ w);
}

/* The bytes -> u64 map (bytes_map.h) holds token bytes -> ids span, a call's piece cache, and piece counts. */

/* ------------------------------------------------------------------ pre-tokenization */

typedef struct {
    const uint8_t *s;
    size_t n;
    int hit_end; /* the scanner looked past the end: more text could change this piece */
} Text;

static inline int char_at(Text *t, size_t i, uint32_t *cp, size_t *length) {
    if (i >= t->n) {
        t->hit_end = 1;
        return 0;
    }
    const uint8_t *s = t->s + i;
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        *length = 1;
    } else if (b < 0xE0) {
        *cp = ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
        *length = 2;
    } else if (b < 0xF0) {
        *cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        *length = 3;
    } else {
        *cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
              (s[3] & 0x3F);
        *length = 4;
    }
    return 1;
}

enum { KIND_LETTER, KIND_NUMBER, KIND_OTHER, KIND_SPACE, KIND_NEWLINE };

static inline int is_kind(uint32_t cp, int kind) {
    uint8_t c = unicode_class(cp);
    switch (kind) {
        case KIND_LETTER: return (c & CLASS_LETTER) != 0;
        case KIND_NUMBER: return (c & CLASS_NUMBER) != 0;
        case KIND_OTHER: return (c & (CLASS_LETTER | CLASS_NUMBER | CLASS_SPACE)) == 0; /* [^\s\p{L}\p{N}] */
        case KIND_SPACE: return (c & CLASS_SPACE) != 0;
        default: return cp == '\r' || cp == '\n';
    }
}

/* End of the longest run of `kind` starting at i (possessive: never gives characters back). */
static inline size_t run(Text *t, size_t i, int kind) {
    uint32_t cp;
    size_t length;
    while (char_at(t, i, &cp, &length) && is_kind(cp, kind)) i += length;
    return i;
}

enum { SPACES_GPT2, SPACES_GPT4, SPACES_O200K };

/* A whitespace run at i, for the patterns' last alternatives:
 *   \s++$            the run reaches the end of the text: all of it;
 *   \s*[\r\n]        (GPT-4, o200k) up to and including the run's last \r or \n; o200k tries this
 *                    before the end-of-text rule (its \s*[\r\n]+ comes first);
 *   \s+(?!\S)        a run of two or more before a non-space: all but its last character;
 *   \s               else one character. */
static size_t space_piece(Text *t, size_t i, int rules) {
    uint32_t cp;
    size_t length, last_start = i, after_newline = 0, j = i;
    while (char_at(t, j, &cp, &length) && is_kind(cp, KIND_SPACE)) {
        if (cp == '\r' || cp == '\n') after_newline = j + length;
        last_start = j;
        j += length;
    }
    if (rules == SPACES_O200K && after_newline) return after_newline;
    if (j >= t->n) return j;
    if (rules == SPACES_GPT4 && after_newline) return after_newline;
    if (last_start > i) return last_start;
    return j;
}

/* '(?:[sdmt]|ll|ve|re), case-insensitive for GPT-4 (where `regex` folds U+017F LONG S to s). 0: no match. */
static size_t contraction(Text *t, size_t i, int ignore_case) {
    uint32_t c1, c2;
    size_t l1, l2;
    if (!char_at(t, i + 1, &c1, &l1)) return 0;
    if (ignore_case) {
        if (c1 == 0x17F) return i + 1 + l1;
        if (c1 < 0x80) c1 |= 0x20; /* ASCII lower case; only letters are compared below */
    }
    if (c1 == 's' || c1 == 'd' || c1 == 'm' || c1 == 't') return i + 2;
    if (c1 != 'l' && c1 != 'v' && c1 != 'r') return 0;
    if (!char_at(t, i + 2, &c2, &l2)) return 0;
    if (ignore_case && c2 < 0x80) c2 |= 0x20;
    if ((c1 == 'l' && c2 == 'l') || ((c1 == 'v' || c1 == 'r') && c2 == 'e')) return i + 3;
    return 0;
}

/* '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s */
static size_t gpt2_piece(Text *t, size_t i) {
    uint32_t cp = 0, c1 = 0;
    size_t length, l1, end;
    char_at(t, i, &cp, &length);
    if (cp == '\'' && (end = contraction(t, i, 0))) return end;
    size_t start = i;
    if (cp == ' ') {
        if (!char_at(t, i + 1, &c1, &l1) || is_kind(c1, KIND_SPACE)) return space_piece(t, i, SPACES_GPT2);
        start = i + 1;
        cp = c1;
    }
    if (is_kind(cp, KIND_LETTER)) return run(t, start, KIND_LETTER);
    if (is_kind(cp, KIND_NUMBER)) return run(t, start, KIND_NUMBER);
    if (is_kind(cp, KIND_OTHER)) return run(t, start, KIND_OTHER);
    return space_piece(t, i, SPACES_GPT2);
}

/* '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+
 * |\s++$|\s*[\r\n]|\s+(?!\S)|\s */
static size_t gpt4_piece(Text *t, size_t i) {
    uint32_t cp = 0, c1 = 0;
    size_t length, l1, end;
    char_at(t, i, &cp, &length);
    if (cp == '\'' && (end = contraction(t, i, 1))) return end;
    if (is_kind(cp, KIND_LETTER)) return run(t, i, KIND_LETTER);
    int newline = cp == '\r' || cp == '\n';
    if (is_kind(cp, KIND_NUMBER)) {
        end = i + length;
        for (int k = 1; k < 3 && char_at(t, end, &c1, &l1) && is_kind(c1, KIND_NUMBER); k++) end += l1;
        return end;
    }
    int has_next = char_at(t, i + length, &c1, &l1);
    if (!newline && has_next && is_kind(c1, KIND_LETTER)) return run(t, i + length, KIND_LETTER);
    size_t start = SIZE_MAX;
    if (is_kind(cp, KIND_OTHER)) start = i;
    else if (cp == ' ' && has_next && is_kind(c1, KIND_OTHER)) start = i + 1;
    if (start != SIZE_MAX) return run(t, run(t, start, KIND_OTHER), KIND_NEWLINE);
    return space_piece(t, i, SPACES_GPT4);
}

/* o200k's letter rules backtrack, so they are written as the search `regex` does: first the longest
 * upper-case-ish run U*, then give characters back until a lower-case-ish run W+ can start. */
static inline int has_class(Text *t, size_t i, uint8_t mask, size_t *length) {
    uint32_t cp;
    return char_at(t, i, &cp, length) && (unicode_class(cp) & mask);
}

static size_t class_run(Text *t, size_t i, uint8_t mask) {
    size_t length;
    while (has_class(t, i, mask, &length)) i += length;
    return i;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)? after letters: where the piece ends. */
static size_t o200k_suffix(Text *t, size_t i) {
    uint32_t cp;
    size_t length;
    if (!char_at(t, i, &cp, &length) || cp != '\'') return i;
    size_t end = contraction(t, i, 1);
    return end ? end : i;
}

/* Start of the character before byte offset i (UTF-8 continuation bytes are 10xxxxxx). */
static inline size_t previous_char(const Text *t, size_t i) {
    do i--;
    while (i > 0 && (t->s[i] & 0xC0) == 0x80);
    return i;
}

/* [^\r\n\p{L}\p{N}]?U*W+suffix? and [^\r\n\p{L}\p{N}]?U+W*suffix? from i; 0 when neither matches. */
static size_t o200k_letters(Text *t, size_t i) {
    uint32_t cp;
    size_t length, prefix_end = 0;
    if (char_at(t, i, &cp, &length) && cp != '\r' && cp != '\n' && !(unicode_class(cp) & (CLASS_LETTER | CLASS_NUMBER)))
        prefix_end = i + length;
    size_t starts[2] = {prefix_end, i}; /* with the optional prefix first, then without it */
    int first = prefix_end ? 0 : 1;
    for (int k = first; k < 2; k++) { /* U*W+ */
        size_t p = starts[k];
        size_t u_end = class_run(t, p, CLASS_UPPERISH), w_length;
        for (size_t q = u_end;; q = previous_char(t, q)) {
            if (has_class(t, q, CLASS_LOWERISH, &w_length)) return o200k_suffix(t, class_run(t, q, CLASS_LOWERISH));
            if (q == p) break;
        }
    }
    for (int k = first; k < 2; k++) { /* U+W* */
        size_t p = starts[k];
        size_t u_end = class_run(t, p, CLASS_UPPERISH);
        if (u_end > p) return o200k_suffix(t, class_run(t, u_end, CLASS_LOWERISH));
    }
    return 0;
}

/* The o200k_base pattern (patterns.O200K_PATTERN):
 * [^\r\n\p{L}\p{N}]?U*W+suffix?|[^\r\n\p{L}\p{N}]?U+W*suffix?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*
 * |\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t o200k_piece(Text *t, size_t i) {
    uint32_t cp = 0, c1 = 0;
    size_t length, l1, end;
    if ((end = o200k_letters(t, i))) return end;
    char_at(t, i, &cp, &length);
    if (is_kind(cp, KIND_NUMBER)) {
        end = i + length;
        for (int k = 1; k < 3 && char_at(t, end, &c1, &l1) && is_kind(c1, KIND_NUMBER); k++) end += l1;
        return end;
    }
    size_t start = SIZE_MAX;
    if (is_kind(cp, KIND_OTHER)) start = i;
    else if (cp == ' ' && char_at(t, i + length, &c1, &l1) && is_kind(c1, KIND_OTHER)) start = i + 1;
    if (start != SIZE_MAX) {
        end = run(t, start, KIND_OTHER);
        while (char_at(t, end, &c1, &l1) && (c1 == '\r' || c1 == '\n' || c1 == '/')) end += l1;
        return end;
    }
    return space_piece(t, i, SPACES_O200K);
}

static inline size_t next_piece(Text *t, size_t i, int pattern) {
    if (pattern == PATTERN_GPT2) return gpt2_piece(t, i);
    if (pattern == PATTERN_GPT4) return gpt4_piece(t, i);
    if (pattern == PATTERN_O200K) return o200k_piece(t, i);
    t->hit_end = 1; /* no pre-split: the piece is everything, and more text would extend it */
    return t->n;
}

/* ------------------------------------------------------------------ the encoder */

typedef struct { uint64_t key; uint32_t rank, merged; } PairSlot;

typedef struct {
    PyObject_HEAD
    int pattern;
    uint32_t byte_ids[256];
    PairSlot *pairs; /* (left, right) -> (rank, merged id); key UINT64_MAX = empty */
    size_t pairs_mask;
    BytesMap tokens;  /* a vocabulary token's bytes -> span of its BPE ids in token_ids */
    U32Vec token_ids;
    PyObject **id_objects; /* an int object per id: lists of ids are filled without allocating ints */
    size_t n_id_objects;
} Encoder;

static inline uint64_t pair_key(uint32_t left, uint32_t right) { return ((uint64_t)left << 32) | right; }

static inline const PairSlot *pair_find(const Encoder *e, uint32_t left, uint32_t right) {
    uint64_t key = pair_key(left, right);
    for (size_t i = mix64(key) & e->pairs_mask;; i = (i + 1) & e->pairs_mask) {
        const PairSlot *slot = &e->pairs[i];
        if (slot->key == key) return slot;
        if (slot->key == UINT64_MAX) return NULL;
    }
}

static inline uint32_t pair_rank(const Encoder *e, uint32_t left, uint32_t right) {
    const PairSlot *slot = pair_find(e, left, right);
    return slot ? slot->rank : NO_RANK;
}

/* BPE in place on a short piece; returns the new length. Rescans all pairs after each merge. */
static size_t bpe_small(const Encoder *e, uint32_t *ids, size_t m) {
    while (m > 1) {
        uint32_t best = NO_RANK, left = 0, right = 0, merged = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            const PairSlot *slot = pair_find(e, ids[i], ids[i + 1]);
            if (slot && slot->rank < best) {
                best = slot->rank;
                left = ids[i];
                right = ids[i + 1];
                merged = slot->merged;
            }
        }
        if (best == NO_RANK) break;
        size_t w = 0;
        for (size_t i = 0; i < m;) {
            if (i + 1 < m && ids[i] == left && ids[i + 1] == right) {
                ids[w++] = merged;
                i += 2;
            } else {
                ids[w++] = ids[i++];
            }
        }
        m = w;
    }
    return m;
}

/* Min-heap of (rank << 32 | position): the lowest rank first, leftmost first among equals. */
typedef struct { uint64_t *data; size_t n, cap; } Heap;

static int heap_push(Heap *h, uint64_t value) {
    if (grow((void **)&h->data, &h->cap, h->n + 1, sizeof(uint64_t))) return -1;
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h->data[parent] <= value) break;
        h->data[i] = h->data[parent];
        i = parent;
    }
    h->data[i] = value;
    return 0;
}

static uint64_t heap_pop(Heap *h) {
    uint64_t top = h->data[0], last = h->data[--h->n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= h->n) break;
        if (child + 1 < h->n && h->data[child + 1] < h->data[child]) child++;
        if (h->data[child] >= last) break;
        h->data[i] = h->data[child];
        i = child;
    }
    if (h->n) h->data[i] = last;
    return top;
}

/* Append without ordering (the same struct as a plain list). */
static int list_push(Heap *h, uint64_t value) {
    if (grow((void **)&h->data, &h->cap, h->n + 1, sizeof(uint64_t))) return -1;
    h->data[h->n++] = value;
    return 0;
}

#define DEAD UINT32_MAX

/* BPE in place on a long piece, O(n log n): a linked list of tokens and a heap of candidate merges.
 * All occurrences of the lowest rank are merged left to right before any new pair is considered,
 * exactly like the rescanning version. Returns the new length, or SIZE_MAX when out of memory. */
static size_t bpe_long(const Encoder *e, uint32_t *ids, size_t m) {
    int64_t *next = malloc(m * sizeof(int64_t)), *prev = malloc(m * sizeof(int64_t));
    Heap heap = {0}, pending = {0}; /* pending: positions merged at the current rank, a plain list */
    size_t result = SIZE_MAX;
    if (!next || !prev) goto done;
    for (size_t i = 0; i < m; i++) {
        next[i] = i + 1 < m ? (int64_t)i + 1 : -1;
        prev[i] = (int64_t)i - 1;
    }
    for (size_t i = 0; i + 1 < m; i++) {
        uint32_t rank = pair_rank(e, ids[i], ids[i + 1]);
        if (rank != NO_RANK && heap_push(&heap, ((uint64_t)rank << 32) | i)) goto done;
    }
    while (heap.n) {
        uint32_t rank = (uint32_t)(heap.data[0] >> 32);
        pending.n = 0;
        while (heap.n && (uint32_t)(heap.data[0] >> 32) == rank) {
            size_t i = (size_t)(heap_pop(&heap) & 0xFFFFFFFFu);
            if (ids[i] == DEAD || next[i] < 0) continue;
            size_t j = (size_t)next[i];
            const PairSlot *slot = pair_find(e, ids[i], ids[j]);
            if (!slot || slot->rank != rank) continue; /* stale: a neighbour merged since */
            ids[i] = slot->merged;
            ids[j] = DEAD;
            next[i] = next[j];
            if (next[j] >= 0) prev[next[j]] = (int64_t)i;
            if (list_push(&pending, i)) goto done;
        }
        for (size_t k = 0; k < pending.n; k++) { /* new pairs around each merged token */
            size_t i = (size_t)pending.data[k];
            if (ids[i] == DEAD) continue;
            if (prev[i] >= 0) {
                uint32_t r = pair_rank(e, ids[prev[i]], ids[i]);
                if (r != NO_RANK && heap_push(&heap, ((uint64_t)r << 32) | (uint64_t)prev[i])) goto done;
            }
            if (next[i] >= 0) {
                uint32_t r = pair_rank(e, ids[i], ids[next[i]]);
                if (r != NO_RANK && heap_push(&heap, ((uint64_t)r << 32) | i)) goto done;
            }
        }
    }
    result = 0;
    for (size_t i = 0; i < m; i++)
        if (ids[i] != DEAD) ids[result++] = ids[i];
done:
    free(next);
    free(prev);
    free(heap.data);
    free(pending.data);
    return result;
}

/* Per-call state: the output ids, scratch space, and the cache of pieces already encoded. */
typedef struct {
    U32Vec out, scratch, cached_ids;
    BytesMap cache;
} Work;

static int work_init(Work *w) {
    memset(w, 0, sizeof *w);
    return map_init(&w->cache, 4096);
}

static void work_free(Work *w) {
    free(w->out.data);
    free(w->scratch.data);
    free(w->cached_ids.data);
    map_free(&w->cache);
}

/* Append the ids of one piece to w->out. Returns -1 when out of memory. */
static int encode_piece(const Encoder *e, Work *w, const uint8_t *p, size_t m) {
    if (m == 1) return u32_push_n(&w->out, &e->byte_ids[p[0]], 1);
    uint64_t hash = hash_bytes(p, m);
    const Entry *hit = map_find(&e->tokens, p, m, hash);
    if (hit) return u32_push_n(&w->out, e->token_ids.data + (hit->value >> 32), (uint32_t)hit->value);
    hit = map_find(&w->cache, p, m, hash);
    if (hit) return u32_push_n(&w->out, w->cached_ids.data + (hit->value >> 32), (uint32_t)hit->value);
    if (grow((void **)&w->scratch.data, &w->scratch.cap, m, sizeof(uint32_t))) return -1;
    uint32_t *ids = w->scratch.data;
    for (size_t i = 0; i < m; i++) ids[i] = e->byte_ids[p[i]];
    size_t k = m <= SMALL_PIECE ? bpe_small(e, ids, m) : bpe_long(e, ids, m);
    if (k == SIZE_MAX) return -1;
    if (u32_push_n(&w->out, ids, k)) return -1;
    if (m > 4096) return 0; /* long pieces rarely repeat: keep the cache small */
    if (w->cache.keys.n + w->cached_ids.n * 4 > CACHE_BYTES) {
        map_clear(&w->cache);
        w->cached_ids.n = 0;
    }
    uint64_t value = ((uint64_t)w->cached_ids.n << 32) | k;
    if (u32_push_n(&w->cached_ids, ids, k)) return -1;
    return map_insert(&w->cache, p, m, hash, value) ? 0 : -1;
}

/* Encode the pieces of s[0:n). With `final` false, stop before the first piece that more text could
 * change and return where that is; otherwise return n. SIZE_MAX: out of memory. */
static size_t encode_text(const Encoder *e, Work *w, const uint8_t *s, size_t n, int final) {
    Text t = {s, n, 0};
    size_t i = 0;
    while (i < n) {
        t.hit_end = 0;
        size_t end = next_piece(&t, i, e->pattern);
        if (t.hit_end && !final) return i;
        if (encode_piece(e, w, s + i, end - i)) return SIZE_MAX;
        i = end;
    }
    return n;
}

/* ------------------------------------------------------------------ Python glue */

static PyObject *ids_to_list(const Encoder *e, const uint32_t *ids, size_t n) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *value;
        if (ids[i] < e->n_id_objects) {
            value = e->id_objects[ids[i]];
            Py_INCREF(value);
        } else if (!(value = PyLong_FromUnsignedLong(ids[i]))) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, value);
    }
    return list;
}

/* Characters in s[0:n) (UTF-8 lead bytes), to turn a byte offset into a str index. */
static Py_ssize_t count_chars(const uint8_t *s, size_t n) {
    Py_ssize_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += (s[i] & 0xC0) != 0x80;
    return chars;
}

static int read_ids(PyObject *sequence, uint32_t *out, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        unsigned long value = PyLong_AsUnsignedLong(PyList_GET_ITEM(sequence, (Py_ssize_t)i));
        if (PyErr_Occurred()) return -1;
        if (value >= DEAD) {
            PyErr_Format(PyExc_ValueError, "%s: id %lu is too large", what, value);
            return -1;
        }
        out[i] = (uint32_t)value;
    }
    return 0;
}

static void Encoder_dealloc(Encoder *self) {
    for (size_t i = 0; i < self->n_id_objects; i++) Py_XDECREF(self->id_objects[i]);
    free(self->id_objects);
    free(self->pairs);
    map_free(&self->tokens);
    free(self->token_ids.data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Encoder(byte_ids: list[int] (256), merges: list[(left, right, merged)] in rank order,
 *         tokens: list[bytes] (the vocabulary, special tokens excluded), pattern: 0 none, 1 gpt2, 2 gpt4) */
static int Encoder_init(Encoder *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"byte_ids", "merges", "tokens", "pattern", NULL};
    PyObject *byte_ids, *merges, *tokens;
    int pattern;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!i", names, &PyList_Type, &byte_ids, &PyList_Type, &merges,
                                     &PyList_Type, &tokens, &pattern))
        return -1;
    if (self->pairs) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder is already initialized");
        return -1;
    }
    if (check_pattern(pattern)) return -1;
    if (PyList_GET_SIZE(byte_ids) != 256) {
        PyErr_SetString(PyExc_ValueError, "Encoder needs 256 byte ids");
        return -1;
    }
    self->pattern = pattern;
    if (read_ids(byte_ids, self->byte_ids, 256, "byte_ids")) return -1;

    size_t n_merges = (size_t)PyList_GET_SIZE(merges), capacity = 1024;
    while (capacity < 2 * n_merges + 2) capacity *= 2;
    self->pairs = malloc(capacity * sizeof(PairSlot));
    if (!self->pairs) return PyErr_NoMemory(), -1;
    for (size_t i = 0; i < capacity; i++) self->pairs[i].key = UINT64_MAX;
    self->pairs_mask = capacity - 1;
    for (size_t rank = 0; rank < n_merges; rank++) {
        PyObject *merge = PyList_GET_ITEM(merges, (Py_ssize_t)rank);
        unsigned long left, right, merged;
        if (!PyArg_ParseTuple(merge, "kkk", &left, &right, &merged)) return -1;
        if (left >= DEAD || right >= DEAD || merged >= DEAD) {
            PyErr_SetString(PyExc_ValueError, "merge ids must be below 2**32 - 1");
            return -1;
        }
        uint64_t key = pair_key((uint32_t)left, (uint32_t)right);
        size_t i = mix64(key) & self->pairs_mask;
        while (self->pairs[i].key != UINT64_MAX && self->pairs[i].key != key) i = (i + 1) & self->pairs_mask;
        if (self->pairs[i].key == key) continue; /* the first merge of a pair wins, as in the reference */
        self->pairs[i].key = key;
        self->pairs[i].rank = (uint32_t)rank;
        self->pairs[i].merged = (uint32_t)merged;
    }

    uint32_t max_id = 0;
    for (int b = 0; b < 256; b++) max_id = self->byte_ids[b] > max_id ? self->byte_ids[b] : max_id;
    for (size_t i = 0; i <= self->pairs_mask; i++)
        if (self->pairs[i].key != UINT64_MAX && self->pairs[i].merged > max_id) max_id = self->pairs[i].merged;
    if (!(self->id_objects = calloc((size_t)max_id + 1, sizeof(PyObject *)))) return PyErr_NoMemory(), -1;
    self->n_id_objects = (size_t)max_id + 1;
    for (size_t i = 0; i < self->n_id_objects; i++)
        if (!(self->id_objects[i] = PyLong_FromSize_t(i))) return -1;

    /* Every token's bytes -> its BPE ids (nearly always the token itself): such pieces skip BPE. */
    Py_ssize_t n_tokens = PyList_GET_SIZE(tokens);
    if (map_init(&self->tokens, (size_t)n_tokens)) return PyErr_NoMemory(), -1;
    U32Vec scratch = {0};
    for (Py_ssize_t k = 0; k < n_tokens; k++) {
        PyObject *token = PyList_GET_ITEM(tokens, k);
        if (!PyBytes_Check(token)) {
            free(scratch.data);
            PyErr_SetString(PyExc_TypeError, "tokens must be bytes");
            return -1;
        }
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(token);
        size_t m = (size_t)PyBytes_GET_SIZE(token);
        uint64_t hash = hash_bytes(p, m);
        if (m < 2 || map_find(&self->tokens, p, m, hash)) continue;
        if (grow((void **)&scratch.data, &scratch.cap, m, sizeof(uint32_t))) goto oom;
        for (size_t i = 0; i < m; i++) scratch.data[i] = self->byte_ids[p[i]];
        size_t length = m <= SMALL_PIECE ? bpe_small(self, scratch.data, m) : bpe_long(self, scratch.data, m);
        if (length == SIZE_MAX) goto oom;
        uint64_t value = ((uint64_t)self->token_ids.n << 32) | length;
        if (u32_push_n(&self->token_ids, scratch.data, length)) goto oom;
        if (!map_insert(&self->tokens, p, m, hash, value)) goto oom;
    }
    free(scratch.data);
    return 0;
oom:
    free(scratch.data);
    PyErr_NoMemory();
    return -1;
}

static int require_ready(Encoder *self) {
    if (!self->pairs) {
        PyErr_SetString(PyExc_RuntimeError, "Encoder is not initialized");
        return -1;
    }
    return 0;
}

/* Run encode_text without the GIL; the caller holds a reference to the str that owns s. */
static size_t encode_unlocked(Encoder *self, Work *w, const uint8_t *s, size_t n, int final) {
    size_t done;
    Py_BEGIN_ALLOW_THREADS
    done = encode_text(self, w, s, n, final);
    Py_END_ALLOW_THREADS
    return done;
}

/* Encode one str: with `final`, all of it -> list of ids; else -> (ids, chars), the ids of the pieces no
 * further text could change and how many characters of `text` they cover (the rest must be encoded
 * again with what follows). */
static PyObject *encode_one(Encoder *self, PyObject *text, int final) {
    Py_ssize_t n;
    const char *s;
    if (require_ready(self) || !(s = PyUnicode_AsUTF8AndSize(text, &n))) return NULL;
    Work w;
    if (work_init(&w)) return PyErr_NoMemory();
    PyObject *result = NULL;
    size_t done = encode_unlocked(self, &w, (const uint8_t *)s, (size_t)n, final);
    if (done == SIZE_MAX) {
        PyErr_NoMemory();
    } else {
        result = ids_to_list(self, w.out.data, w.out.n);
        if (result && !final) result = Py_BuildValue("(Nn)", result, count_chars((const uint8_t *)s, done));
    }
    work_free(&w);
    return result;
}

static PyObject *Encoder_encode(Encoder *self, PyObject *text) { return encode_one(self, text, 1); }
static PyObject *Encoder_encode_stable(Encoder *self, PyObject *text) { return encode_one(self, text, 0); }

enum { RETURN_FLAT, RETURN_LISTS, RETURN_PACKED };

/* Encode a list of str with one cache; each item is split by the pattern (`as_pieces` false) or is
 * already one piece (`as_pieces` true). Returns the concatenated ids (RETURN_FLAT), a list per item
 * (RETURN_LISTS), or (bytes of native uint32 ids, list of each item's count) (RETURN_PACKED). */
static PyObject *encode_list(Encoder *self, PyObject *items, int as_pieces, int mode) {
    if (require_ready(self)) return NULL;
    if (!PyList_Check(items)) return PyErr_Format(PyExc_TypeError, "expected a list of str");
    Py_ssize_t count = PyList_GET_SIZE(items);
    PyObject **held = PyMem_Calloc((size_t)count + 1, sizeof(PyObject *));
    const char **starts = PyMem_Calloc((size_t)count + 1, sizeof(char *));
    size_t *lengths = PyMem_Calloc((size_t)count + 1, sizeof(size_t)), *ends = PyMem_Calloc((size_t)count + 1, sizeof(size_t));
    PyObject *result = NULL;
    Work w;
    int work_ready = 0;
    if (!held || !starts || !lengths || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) { /* hold references: the list may change while the GIL is free */
        held[k] = PyList_GET_ITEM(items, k);
        Py_INCREF(held[k]);
        Py_ssize_t n;
        if (!PyUnicode_Check(held[k])) {
            PyErr_Format(PyExc_TypeError, "expected str, got %.100s", Py_TYPE(held[k])->tp_name);
            goto done;
        }
        if (!(starts[k] = PyUnicode_AsUTF8AndSize(held[k], &n))) goto done;
        lengths[k] = (size_t)n;
    }
    if (work_init(&w)) {
        PyErr_NoMemory();
        goto done;
    }
    work_ready = 1;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count && !failed; k++) {
        const uint8_t *s = (const uint8_t *)starts[k];
        if (as_pieces)
            failed = lengths[k] && encode_piece(self, &w, s, lengths[k]);
        else
            failed = encode_text(self, &w, s, lengths[k], 1) == SIZE_MAX;
        ends[k] = w.out.n;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (mode == RETURN_FLAT) {
        result = ids_to_list(self, w.out.data, w.out.n);
        goto done;
    }
    if (mode == RETURN_PACKED) {
        PyObject *counts = PyList_New(count);
        for (Py_ssize_t k = 0; counts && k < count; k++) {
            PyObject *n_ids = PyLong_FromSize_t(ends[k] - (k ? ends[k - 1] : 0));
            if (!n_ids) Py_CLEAR(counts);
            else PyList_SET_ITEM(counts, k, n_ids);
        }
        PyObject *ids = counts ? PyBytes_FromStringAndSize((const char *)w.out.data,
                                                           (Py_ssize_t)(w.out.n * sizeof(uint32_t))) : NULL;
        result = ids ? Py_BuildValue("(NN)", ids, counts) : NULL;
        if (!ids) Py_XDECREF(counts);
        goto done;
    }
    if (!(result = PyList_New(count))) goto done;
    for (Py_ssize_t k = 0; k < count; k++) {
        size_t begin = k ? ends[k - 1] : 0;
        PyObject *ids = ids_to_list(self, w.out.data + begin, ends[k] - begin);
        if (!ids) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, k, ids);
    }
done:
    if (work_ready) work_free(&w);
    if (held)
        for (Py_ssize_t k = 0; k < count; k++) Py_XDECREF(held[k]);
    PyMem_Free(held);
    PyMem_Free(starts);
    PyMem_Free(lengths);
    PyMem_Free(ends);
    return result;
}

static PyObject *Encoder_encode_pieces(Encoder *self, PyObject *pieces) {
    return encode_list(self, pieces, 1, RETURN_FLAT);
}
static PyObject *Encoder_encode_many(Encoder *self, PyObject *texts) { return encode_list(self, texts, 0, RETURN_LISTS); }
static PyObject *Encoder_encode_packed(Encoder *self, PyObject *texts) {
    return encode_list(self, texts, 0, RETURN_PACKED);
}

static PyMethodDef Encoder_methods[] = {
    {"encode", (PyCFunction)Encoder_encode, METH_O, "encode(text) -> list[int]: split by the pattern, then BPE."},
    {"encode_stable", (PyCFunction)Encoder_encode_stable, METH_O,
     "encode_stable(text) -> (ids, chars): only the pieces more text could not change."},
    {"encode_pieces", (PyCFunction)Encoder_encode_pieces, METH_O,
     "encode_pieces(pieces: list[str]) -> list[int]: BPE on each piece, ids concatenated."},
    {"encode_many", (PyCFunction)Encoder_encode_many, METH_O,
     "encode_many(texts: list[str]) -> list[list[int]]: encode each text, sharing one cache."},
    {"encode_packed", (PyCFunction)Encoder_encode_packed, METH_O,
     "encode_packed(texts: list[str]) -> (bytes of native uint32 ids back to back, list of each text's count)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gptlab.tokenizer._fastbpe.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Compiled byte-level BPE encoder for one vocabulary, merge list and split pattern.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_methods = Encoder_methods,
};

/* ------------------------------------------------------------------ counting pieces for training */

typedef struct {
    PyObject_HEAD
    int pattern;
    BytesMap counts; /* piece bytes -> occurrences */
    int ready;
} PieceCounter;

static void PieceCounter_dealloc(PieceCounter *self) {
    map_free(&self->counts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int PieceCounter_init(PieceCounter *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"pattern", NULL};
    int pattern;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i", names, &pattern) || check_pattern(pattern)) return -1;
    map_free(&self->counts);
    if (map_init(&self->counts, 1 << 16)) return PyErr_NoMemory(), -1;
    self->pattern = pattern;
    self->ready = 1;
    return 0;
}

/* Count the pieces of s[0:n); with `final` false stop before a piece more text could change. */
static size_t count_text(PieceCounter *self, const uint8_t *s, size_t n, int final) {
    Text t = {s, n, 0};
    size_t i = 0;
    while (i < n) {
        t.hit_end = 0;
        size_t end = next_piece(&t, i, self->pattern);
        if (t.hit_end && !final) return i;
        uint64_t hash = hash_bytes(s + i, end - i);
        Entry *e = map_find(&self->counts, s + i, end - i, hash);
        if (e)
            e->value++;
        else if (!map_insert(&self->counts, s + i, end - i, hash, 1))
            return SIZE_MAX;
        i = end;
    }
    return n;
}

/* add(text, final=True) -> chars counted (all of them when final). */
static PyObject *PieceCounter_add(PieceCounter *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"text", "final", NULL};
    PyObject *text;
    int final = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "U|p", names, &text, &final)) return NULL;
    if (!self->ready) return PyErr_Format(PyExc_RuntimeError, "PieceCounter is not initialized");
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    if (!s) return NULL;
    size_t done;
    Py_BEGIN_ALLOW_THREADS
    done = count_text(self, (const uint8_t *)s, (size_t)n, final);
    Py_END_ALLOW_THREADS
    if (done == SIZE_MAX) return PyErr_NoMemory();
    return PyLong_FromSsize_t(count_chars((const uint8_t *)s, done));
}

/* update(other): add another counter's counts (of the same pattern) to this one. */
static PyObject *PieceCounter_update(PieceCounter *self, PyObject *other) {
    if (!PyObject_TypeCheck(other, Py_TYPE(self)) || !self->ready || !((PieceCounter *)other)->ready)
        return PyErr_Format(PyExc_TypeError, "update() takes an initialized PieceCounter");
    const BytesMap *from = &((PieceCounter *)other)->counts;
    for (size_t k = 0; k < from->n; k++) {
        const Entry *e = &from->entries[k];
        const uint8_t *key = from->keys.data + e->key_offset;
        Entry *mine = map_find(&self->counts, key, e->key_length, e->hash);
        if (mine)
            mine->value += e->value;
        else if (!map_insert(&self->counts, key, e->key_length, e->hash, e->value))
            return PyErr_NoMemory();
    }
    Py_RETURN_NONE;
}

/* counts(as_bytes=False) -> dict[str, int] (or dict[bytes, int]) */
static PyObject *PieceCounter_counts(PieceCounter *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"as_bytes", NULL};
    int as_bytes = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p", names, &as_bytes)) return NULL;
    PyObject *result = PyDict_New();
    if (!result) return NULL;
    for (size_t k = 0; k < self->counts.n; k++) {
        const Entry *e = &self->counts.entries[k];
        const char *start = (const char *)self->counts.keys.data + e->key_offset;
        PyObject *key = as_bytes ? PyBytes_FromStringAndSize(start, (Py_ssize_t)e->key_length)
                                 : PyUnicode_DecodeUTF8(start, (Py_ssize_t)e->key_length, "strict");
        PyObject *value = key ? PyLong_FromUnsignedLongLong(e->value) : NULL;
        int failed = !value || PyDict_SetItem(result, key, value);
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (failed) {
            Py_DECREF(result);
            return NULL;
        }
    }
    return result;
}

static PyMethodDef PieceCounter_methods[] = {
    {"add", (PyCFunction)(void (*)(void))PieceCounter_add, METH_VARARGS | METH_KEYWORDS,
     "add(text, final=True) -> chars counted; with final false, pieces more text could change are left."},
    {"update", (PyCFunction)PieceCounter_update, METH_O, "update(other): add another counter's counts."},
    {"counts", (PyCFunction)(void (*)(void))PieceCounter_counts, METH_VARARGS | METH_KEYWORDS,
     "counts(as_bytes=False) -> dict[str, int] or dict[bytes, int]"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PieceCounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gptlab.tokenizer._fastbpe.PieceCounter",
    .tp_basicsize = sizeof(PieceCounter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Counts the pieces of texts split by a built-in pattern (for training).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PieceCounter_init,
    .tp_dealloc = (destructor)PieceCounter_dealloc,
    .tp_methods = PieceCounter_methods,
};

/* ------------------------------------------------------------------ module */

/* split(text, pattern) -> list[str]: the scanner's pieces (what the tests compare with `regex`). */
static PyObject *module_split(PyObject *module, PyObject *args) {
    PyObject *text;
    int pattern;
    if (!PyArg_ParseTuple(args, "Ui", &text, &pattern)) return NULL;
    if (check_pattern(pattern)) return NULL;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    if (!s) return NULL;
    PyObject *pieces = PyList_New(0);
    Text t = {(const uint8_t *)s, (size_t)n, 0};
    for (size_t i = 0; pieces && i < (size_t)n;) {
        size_t end = next_piece(&t, i, pattern);
        PyObject *piece = PyUnicode_DecodeUTF8(s + i, (Py_ssize_t)(end - i), "strict");
        if (!piece || PyList_Append(pieces, piece)) Py_CLEAR(pieces);
        Py_XDECREF(piece);
        i = end;
    }
    return pieces;
}

static PyObject *module_char_class(PyObject *module, PyObject *arg) {
    unsigned long cp = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred() || check_pattern(PATTERN_GPT2)) return NULL;
    return PyLong_FromLong(unicode_class((uint32_t)cp));
}

/* set_char_classes(table: bytes) -> None: once per process; again only with the same table, since
 * threads may be scanning with it while the GIL is released. */
static PyObject *module_set_char_classes(PyObject *module, PyObject *table) {
    if (!PyBytes_Check(table) || PyBytes_GET_SIZE(table) != N_CODE_POINTS)
        return PyErr_Format(PyExc_ValueError, "the class table must be bytes, one per code point (%d)", N_CODE_POINTS);
    if (class_owner) {
        int same = PyObject_RichCompareBool(class_owner, table, Py_EQ);
        if (same < 0) return NULL;
        if (!same) return PyErr_Format(PyExc_RuntimeError, "the character classes are already set to a different table");
        Py_RETURN_NONE;
    }
    Py_INCREF(table);
    class_owner = table;
    class_table = (const uint8_t *)PyBytes_AS_STRING(table);
    Py_RETURN_NONE;
}

static PyObject *module_has_char_classes(PyObject *module, PyObject *unused) {
    return PyBool_FromLong(class_table != NULL);
}

static PyMethodDef module_methods[] = {
    {"split", module_split, METH_VARARGS, "split(text, pattern) -> list[str]"},
    {"char_class", module_char_class, METH_O, "char_class(code_point) -> its CLASS_* bits"},
    {"set_char_classes", module_set_char_classes, METH_O, "set_char_classes(table: bytes) -> None, once per process"},
    {"has_char_classes", module_has_char_classes, METH_NOARGS, "has_char_classes() -> bool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_fastbpe", "gptlab's compiled BPE encoder (see fastbpe.c).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastbpe(void) {
    if (PyType_Ready(&EncoderType) < 0 || PyType_Ready(&PieceCounterType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (!module) return NULL;
    Py_INCREF(&EncoderType);
    Py_INCREF(&PieceCounterType);
    if (PyModule_AddObject(module, "Encoder", (PyObject *)&EncoderType) ||
        PyModule_AddObject(module, "PieceCounter", (PyObject *)&PieceCounterType) ||
        PyModule_AddIntConstant(module, "PATTERN_NONE", PATTERN_NONE) ||
        PyModule_AddIntConstant(module, "PATTERN_GPT2", PATTERN_GPT2) ||
        PyModule_AddIntConstant(module, "PATTERN_GPT4", PATTERN_GPT4) ||
        PyModule_AddIntConstant(module, "PATTERN_O200K", PATTERN_O200K) ||
        PyModule_AddIntConstant(module, "SMALL_PIECE", SMALL_PIECE) ||
        PyModule_AddIntConstant(module, "CLASS_LETTER", CLASS_LETTER) ||
        PyModule_AddIntConstant(module, "CLASS_NUMBER", CLASS_NUMBER) ||
        PyModule_AddIntConstant(module, "CLASS_SPACE", CLASS_SPACE) ||
        PyModule_AddIntConstant(module, "CLASS_UPPERISH", CLASS_UPPERISH) ||
        PyModule_AddIntConstant(module, "CLASS_LOWERISH", CLASS_LOWERISH)) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
