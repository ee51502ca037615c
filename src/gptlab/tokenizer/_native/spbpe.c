/* gptlab.tokenizer._spbpe: SentencePiece BPE encoding in C. Same ids as the `sentencepiece` library.
 *
 * What it owns: turning an already normalised string ("▁" for spaces, the dummy prefix added) into ids,
 * exactly as the library's bpe::Model::SampleEncode (alpha 0, src/bpe_model.cc) and then
 * SentencePieceProcessor::PopulateSentencePieceText (src/sentencepiece_processor.cc) do:
 *   1. Symbols are code points, except that user-defined pieces are matched first (longest match) and
 *      frozen: they never merge (normalizer::PrefixMatcher).
 *   2. Merges: an agenda (max-heap) of adjacent pairs whose concatenation is a NORMAL, USER_DEFINED or
 *      UNUSED piece (the library's `pieces_`, model_interface.cc); the highest score merges first, the
 *      leftmost on ties; stale pairs are recognised by their length, as the library does.
 *   3. UNUSED pieces are split back into the two symbols last seen forming them (`rev_merge`), recursively.
 *   4. A piece with no id: its UTF-8 bytes as <0xNN> pieces (byte fallback), else the unknown id, with a
 *      run of unknown pieces given one unknown id.
 * Faster, exactly: when no merge piece holds a "▁" right after another character (every piece is
 * "▁*" then no "▁"), no merge can join a character to the "▁" after it, so the text is cut there into
 * words that are encoded apart (the same comparator restricted to a word gives the same merges) and each
 * call caches the ids of the words it has seen. Models whose pieces end in "▁" instead
 * (treat_whitespace_as_suffix) are cut after each run of "▁". Words are also cut around any ASCII character
 * that no multi-character piece holds (a newline in most models): it never merges. Models with UNUSED
 * pieces, or with "▁" inside pieces, run the whole-string algorithm (the library's `rev_merge` spans the
 * whole string; splitting it per word is believed equal but not proven here).
 * The GIL is released while merging, so Python threads encode in parallel.
 * Not here: normalisation (sp_normalize.py), special tokens and decoding (sentencepiece.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytes_map.h"

enum { KIND_NORMAL = 1, KIND_UNKNOWN = 2, KIND_CONTROL = 3, KIND_USER_DEFINED = 4, KIND_UNUSED = 5, KIND_BYTE = 6 };
enum { SPLIT_NONE = 0, SPLIT_BEFORE_SPACE = 1, SPLIT_AFTER_SPACE = 2 };
#define CACHE_BYTES (64u << 20)  /* a call's word cache is emptied when it grows past this */
#define CACHED_WORD_MAX 256      /* longer words rarely repeat: not cached */
#define MAX_TEXT_BYTES INT32_MAX /* symbol links are int32, as in the library */

/* ------------------------------------------------------------------ hashing (the map: bytes_map.h) */

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        h = (h ^ word) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t word = 0;
    memcpy(&word, p, n);
    h = (h ^ word) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

/* ------------------------------------------------------------------ the model */

/* Each piece string maps to (reserved id + 1) << 32 | (merge id + 1), 0 meaning none: the library keeps
 * CONTROL/UNKNOWN/BYTE pieces (`reserved_id_map_`) apart from the pieces merges can form (`pieces_`),
 * and PieceToId looks in the reserved map first. */
typedef struct {
    PyObject_HEAD
    BytesMap pieces;
    float *scores;
    uint8_t *kinds;
    size_t n_pieces;
    uint32_t unk_id;
    int byte_fallback;
    int split; /* SPLIT_*: how the text may be cut into words */
    uint8_t isolated[128];      /* ASCII characters in no multi-character merge piece: words end around them */
    uint32_t byte_ids[256];
    BytesMap user;              /* user-defined symbols, matched before single characters */
    uint8_t user_first[256];    /* bytes a user-defined symbol starts with */
    size_t *user_lengths;       /* their distinct byte lengths, longest first */
    size_t n_user_lengths;
    PyObject **id_objects;      /* a PyLong per id, made once */
} Encoder;

static inline uint64_t piece_value(const Encoder *e, const uint8_t *p, size_t n) {
    const Entry *hit = map_find(&e->pieces, p, n, hash_bytes(p, n));
    return hit ? hit->value : 0;
}

/* PieceToId: the reserved id, else the merge id, else unknown. */
static inline uint32_t id_of_value(const Encoder *e, uint64_t value) {
    if (value >> 32) return (uint32_t)(value >> 32) - 1;
    if ((uint32_t)value) return (uint32_t)value - 1;
    return e->unk_id;
}

static inline int is_space(const uint8_t *p, const uint8_t *end) {
    return end - p >= 3 && p[0] == 0xE2 && p[1] == 0x96 && p[2] == 0x81; /* "▁" U+2581 */
}

/* Bytes in the UTF-8 character starting with `lead` (string_util::OneCharLen). */
static inline size_t char_length(uint8_t lead) { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[lead >> 4]; }

/* PrefixMatcher::PrefixMatch: the longest user-defined symbol at s (frozen), else one character. */
static inline size_t symbol_length(const Encoder *e, const uint8_t *s, size_t n, uint8_t *freeze) {
    if (e->n_user_lengths && e->user_first[s[0]]) {
        for (size_t k = 0; k < e->n_user_lengths; k++) {
            size_t length = e->user_lengths[k];
            if (length <= n && map_find(&e->user, s, length, hash_bytes(s, length))) {
                *freeze = 1;
                return length;
            }
        }
    }
    *freeze = 0;
    size_t length = char_length(s[0]);
    return length < n ? length : n;
}

/* ------------------------------------------------------------------ BPE on one span */

typedef struct { uint32_t start, length; int32_t prev, next; uint8_t freeze; } Symbol;
/* key: the score's order-preserving bits above (UINT32_MAX - left), so the largest key is the highest
 * score and then the leftmost pair (the library's SymbolPairComparator). */
typedef struct { uint64_t key; uint32_t right, size; } Pair;

/* Per-call state: output ids, scratch space, the word cache and the UNUSED pieces' splits. */
typedef struct {
    U32Vec out, word, cached_ids, splits;
    Symbol *symbols;
    size_t symbols_cap;
    Pair *heap;
    size_t heap_n, heap_cap;
    BytesMap cache, rev_merge;
} Work;

static int work_init(Work *w) {
    memset(w, 0, sizeof *w);
    return map_init(&w->cache, 1024) || map_init(&w->rev_merge, 16) ? -1 : 0;
}

static void work_free(Work *w) {
    free(w->out.data);
    free(w->word.data);
    free(w->cached_ids.data);
    free(w->splits.data);
    free(w->symbols);
    free(w->heap);
    map_free(&w->cache);
    map_free(&w->rev_merge);
}

static inline uint32_t score_order(float score) {
    uint32_t bits;
    memcpy(&bits, &score, 4);
    return bits & 0x80000000u ? ~bits : bits | 0x80000000u;
}

static int heap_push(Work *w, Pair pair) {
    if (w->heap_n == w->heap_cap && grow((void **)&w->heap, &w->heap_cap, w->heap_n + 1, sizeof(Pair))) return -1;
    size_t i = w->heap_n++;
    while (i && w->heap[(i - 1) / 2].key < pair.key) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = pair;
    return 0;
}

static Pair heap_pop(Work *w) {
    Pair top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && w->heap[child + 1].key > w->heap[child].key) child++;
        if (w->heap[child].key <= last.key) break;
        w->heap[i] = w->heap[child];
        i = child;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* Remember how an UNUSED piece was formed; the last pair seen wins, as with the library's `rev_merge`. */
static int note_unused(Work *w, const uint8_t *s, const Symbol *left, const Symbol *right) {
    size_t length = left->length + right->length;
    uint64_t hash = hash_bytes(s + left->start, length);
    Entry *hit = map_find(&w->rev_merge, s + left->start, length, hash);
    if (!hit) {
        if (!map_insert(&w->rev_merge, s + left->start, length, hash, w->splits.n)) return -1;
        if (grow((void **)&w->splits.data, &w->splits.cap, w->splits.n + 3, sizeof(uint32_t))) return -1;
        w->splits.n += 3;
        hit = &w->rev_merge.entries[w->rev_merge.n - 1];
    }
    uint32_t *split = w->splits.data + hit->value;
    split[0] = left->start;
    split[1] = left->length;
    split[2] = right->length;
    return 0;
}

/* MaybeAddNewSymbolPair: queue the pair (left, right) if their concatenation is a piece merges can form. */
static int maybe_add_pair(const Encoder *e, Work *w, const uint8_t *s, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return 0;
    const Symbol *a = &w->symbols[left], *b = &w->symbols[right];
    if (a->freeze || b->freeze) return 0;
    uint32_t size = a->length + b->length;
    uint32_t merge = (uint32_t)piece_value(e, s + a->start, size);
    if (!merge) return 0;
    Pair pair = {((uint64_t)score_order(e->scores[merge - 1]) << 32) | (UINT32_MAX - (uint32_t)left), (uint32_t)right, size};
    if (heap_push(w, pair)) return -1;
    return e->kinds[merge - 1] == KIND_UNUSED ? note_unused(w, s, a, b) : 0;
}

/* PopulateSentencePieceText for one piece: bytes for an unknown piece (byte fallback), else its id, a run of
 * unknown pieces giving one unknown id. `base`: where this text's ids start in `to`. */
static int emit(const Encoder *e, U32Vec *to, size_t base, uint32_t id, const uint8_t *p, size_t n) {
    if (id == e->unk_id) {
        if (e->byte_fallback) {
            for (size_t i = 0; i < n; i++)
                if (u32_push(to, e->byte_ids[p[i]])) return -1;
            return 0;
        }
        if (to->n > base && to->data[to->n - 1] == e->unk_id) return 0;
    }
    return u32_push(to, id);
}

/* The library's `resegment`: an UNUSED piece is replaced by the two symbols that formed it, recursively. */
static int resegment(const Encoder *e, Work *w, const uint8_t *s, uint32_t start, uint32_t length, U32Vec *to, size_t base) {
    uint32_t id = id_of_value(e, piece_value(e, s + start, length));
    if (e->kinds[id] == KIND_UNUSED) {
        const Entry *hit = map_find(&w->rev_merge, s + start, length, hash_bytes(s + start, length));
        if (hit) {
            uint32_t left_start = w->splits.data[hit->value], left_length = w->splits.data[hit->value + 1];
            uint32_t right_length = w->splits.data[hit->value + 2];
            if (resegment(e, w, s, left_start, left_length, to, base)) return -1;
            return resegment(e, w, s, left_start + left_length, right_length, to, base);
        }
    }
    return emit(e, to, base, id, s + start, length);
}

/* Split s[0:n) into symbols and queue every adjacent pair; returns the symbol count, -1 out of memory. */
static int32_t start_symbols(const Encoder *e, Work *w, const uint8_t *s, size_t n) {
    if (grow((void **)&w->symbols, &w->symbols_cap, n, sizeof(Symbol))) return -1;
    int32_t count = 0;
    for (size_t i = 0; i < n; count++) {
        Symbol *symbol = &w->symbols[count];
        symbol->start = (uint32_t)i;
        symbol->length = (uint32_t)symbol_length(e, s + i, n - i, &symbol->freeze);
        i += symbol->length;
        symbol->prev = count - 1;
        symbol->next = i < n ? count + 1 : -1;
    }
    w->heap_n = 0;
    map_clear(&w->rev_merge);
    w->splits.n = 0;
    for (int32_t i = 1; i < count; i++)
        if (maybe_add_pair(e, w, s, i - 1, i)) return -1;
    return count;
}

/* SampleEncode (alpha 0) on s[0:n), its ids appended to `to`. */
static int encode_span(const Encoder *e, Work *w, const uint8_t *s, size_t n, U32Vec *to, size_t base) {
    if (!n) return 0;
    if (start_symbols(e, w, s, n) < 0) return -1;
    Symbol *symbols = w->symbols;
    while (w->heap_n) {
        Pair top = heap_pop(w);
        int32_t left = (int32_t)(UINT32_MAX - (uint32_t)top.key), right = (int32_t)top.right;
        Symbol *a = &symbols[left], *b = &symbols[right];
        if (!a->length || !b->length || a->length + b->length != top.size) continue; /* stale */
        a->length += b->length;
        a->next = b->next;
        if (b->next >= 0) symbols[b->next].prev = left;
        b->length = 0;
        if (maybe_add_pair(e, w, s, a->prev, left) || maybe_add_pair(e, w, s, left, a->next)) return -1;
    }
    for (int32_t i = 0; i != -1; i = symbols[i].next)
        if (resegment(e, w, s, symbols[i].start, symbols[i].length, to, base)) return -1;
    return 0;
}

/* ------------------------------------------------------------------ words */

/* Where the word starting at i ends: before the next "▁" that follows another character
 * (SPLIT_BEFORE_SPACE) or after the next run of "▁" (SPLIT_AFTER_SPACE), and on both sides of an ASCII
 * character no multi-character piece holds (a newline, usually), which can never merge. */
static size_t word_end(const Encoder *e, const uint8_t *s, size_t i, size_t n) {
    const uint8_t *end = s + n, *p = s + i;
    if (*p < 0x80 && e->isolated[*p]) return i + 1;
    if (e->split == SPLIT_BEFORE_SPACE)
        while (is_space(p, end)) p += 3;
    while (p < end && !(*p < 0x80 ? e->isolated[*p] : is_space(p, end))) p++;
    if (e->split == SPLIT_AFTER_SPACE)
        while (is_space(p, end)) p += 3;
    return (size_t)(p - s);
}

/* Append a word's ids (from the cache or encoded now) to w->out; a run of unknown ids across the cut
 * still gives one unknown id. */
static int encode_word(const Encoder *e, Work *w, const uint8_t *s, size_t n, size_t base) {
    const uint32_t *ids;
    size_t k;
    uint64_t hash = hash_bytes(s, n);
    const Entry *hit = n <= CACHED_WORD_MAX ? map_find(&w->cache, s, n, hash) : NULL;
    if (hit) {
        ids = w->cached_ids.data + (hit->value >> 32);
        k = (uint32_t)hit->value;
    } else {
        w->word.n = 0;
        if (encode_span(e, w, s, n, &w->word, 0)) return -1;
        ids = w->word.data;
        k = w->word.n;
        if (n <= CACHED_WORD_MAX) {
            if (w->cache.keys.n + w->cached_ids.n * 4 > CACHE_BYTES) {
                map_clear(&w->cache);
                w->cached_ids.n = 0;
            }
            if (!map_insert(&w->cache, s, n, hash, ((uint64_t)w->cached_ids.n << 32) | k)) return -1;
            if (u32_push_n(&w->cached_ids, ids, k)) return -1;
        }
    }
    if (k && !e->byte_fallback && ids[0] == e->unk_id && w->out.n > base && w->out.data[w->out.n - 1] == e->unk_id) {
        ids++;
        k--;
    }
    return u32_push_n(&w->out, ids, k);
}

/* Encode one normalised text, its ids appended to w->out. -1: out of memory. */
static int encode_text(const Encoder *e, Work *w, const uint8_t *s, size_t n) {
    size_t base = w->out.n;
    if (e->split == SPLIT_NONE) return encode_span(e, w, s, n, &w->out, base);
    for (size_t i = 0; i < n;) {
        size_t end = word_end(e, s, i, n);
        if (encode_word(e, w, s + i, end - i, base)) return -1;
        i = end;
    }
    return 0;
}

/* ------------------------------------------------------------------ building the model */

/* Which cut keeps merges exact: no merge piece holds a character then "▁" (cut before "▁" runs), or none
 * holds "▁" then a character (cut after them); SPLIT_NONE when neither, or when UNUSED pieces exist. */
static int choose_split(const Encoder *e) {
    int before = 1, after = 1;
    for (size_t k = 0; k < e->pieces.n; k++) {
        const Entry *entry = &e->pieces.entries[k];
        if (!(uint32_t)entry->value) continue; /* reserved pieces never merge */
        if (e->kinds[(uint32_t)entry->value - 1] == KIND_UNUSED) return SPLIT_NONE;
        const uint8_t *p = e->pieces.keys.data + entry->key_offset, *end = p + entry->key_length;
        int previous_space = -1; /* -1: no character yet */
        while (p < end) {
            int space = is_space(p, end);
            if (previous_space == 0 && space) before = 0;
            if (previous_space == 1 && !space) after = 0;
            previous_space = space;
            p += space ? 3 : char_length(*p);
        }
    }
    return before ? SPLIT_BEFORE_SPACE : after ? SPLIT_AFTER_SPACE : SPLIT_NONE;
}

/* isolated[c]: no merge piece of two or more characters holds the ASCII character c, so c never merges. */
static void find_isolated(Encoder *e) {
    memset(e->isolated, 1, sizeof e->isolated);
    for (size_t k = 0; k < e->pieces.n; k++) {
        const Entry *entry = &e->pieces.entries[k];
        const uint8_t *p = e->pieces.keys.data + entry->key_offset;
        if (!(uint32_t)entry->value || entry->key_length <= char_length(p[0])) continue; /* reserved, or one character */
        for (size_t i = 0; i < entry->key_length; i++)
            if (p[i] < 0x80) e->isolated[p[i]] = 0;
    }
}

/* Index the user-defined symbols: their first bytes and distinct lengths, longest first. */
static int index_user_symbol(Encoder *e, const uint8_t *p, size_t n) {
    uint64_t hash = hash_bytes(p, n);
    if (map_find(&e->user, p, n, hash)) return 0;
    if (!map_insert(&e->user, p, n, hash, 0)) return -1;
    e->user_first[p[0]] = 1;
    size_t k = 0;
    while (k < e->n_user_lengths && e->user_lengths[k] > n) k++;
    if (k < e->n_user_lengths && e->user_lengths[k] == n) return 0;
    size_t *lengths = realloc(e->user_lengths, (e->n_user_lengths + 1) * sizeof(size_t));
    if (!lengths) return -1;
    memmove(lengths + k + 1, lengths + k, (e->n_user_lengths - k) * sizeof(size_t));
    lengths[k] = n;
    e->user_lengths = lengths;
    e->n_user_lengths++;
    return 0;
}

/* Add piece `id` to the maps; ValueError for an empty or repeated piece, as the library refuses them. */
static int add_piece(Encoder *e, uint32_t id, PyObject *text) {
    Py_ssize_t n;
    const uint8_t *p = (const uint8_t *)PyUnicode_AsUTF8AndSize(text, &n);
    if (!p) return -1;
    if (!n) return PyErr_Format(PyExc_ValueError, "piece %u is empty", id), -1;
    int kind = e->kinds[id], mergeable = kind == KIND_NORMAL || kind == KIND_USER_DEFINED || kind == KIND_UNUSED;
    uint64_t hash = hash_bytes(p, (size_t)n), value = mergeable ? (uint64_t)id + 1 : ((uint64_t)id + 1) << 32;
    Entry *entry = map_find(&e->pieces, p, (size_t)n, hash);
    if (entry && (mergeable ? (uint32_t)entry->value != 0 : (entry->value >> 32) != 0))
        return PyErr_Format(PyExc_ValueError, "piece %R (id %u) is already defined", text, id), -1;
    if (entry) entry->value |= value;
    else if (!map_insert(&e->pieces, p, (size_t)n, hash, value)) return PyErr_NoMemory(), -1;
    if (kind == KIND_USER_DEFINED && index_user_symbol(e, p, (size_t)n)) return PyErr_NoMemory(), -1;
    return 0;
}

/* Scores as the library's float, kinds 1..6. */
static int read_scores_kinds(Encoder *e, PyObject *scores, PyObject *kinds) {
    for (size_t i = 0; i < e->n_pieces; i++) {
        double score = PyFloat_AsDouble(PyList_GET_ITEM(scores, (Py_ssize_t)i));
        long kind = PyLong_AsLong(PyList_GET_ITEM(kinds, (Py_ssize_t)i));
        if (PyErr_Occurred()) return -1;
        if (kind < KIND_NORMAL || kind > KIND_BYTE)
            return PyErr_Format(PyExc_ValueError, "piece %zu has kind %ld; kinds are 1 (normal) to 6 (byte)", i, kind), -1;
        e->scores[i] = (float)score == 0.0f ? 0.0f : (float)score; /* -0.0 ties with 0.0, as float compares */
        e->kinds[i] = (uint8_t)kind;
    }
    return 0;
}

/* byte_ids[b]: PieceToId("<0xNN>"); with byte fallback all 256 must be BYTE pieces, as the library checks. */
static int find_byte_ids(Encoder *e) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        e->byte_ids[b] = id_of_value(e, piece_value(e, (const uint8_t *)name, 6));
        if (e->byte_fallback && e->kinds[e->byte_ids[b]] != KIND_BYTE)
            return PyErr_Format(PyExc_ValueError, "byte_fallback is on but there is no byte piece %s", name), -1;
    }
    return 0;
}

static void Encoder_dealloc(Encoder *self) {
    if (self->id_objects)
        for (size_t i = 0; i < self->n_pieces; i++) Py_XDECREF(self->id_objects[i]);
    free(self->id_objects);
    free(self->scores);
    free(self->kinds);
    free(self->user_lengths);
    map_free(&self->pieces);
    map_free(&self->user);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Encoder(pieces: list[str], scores: list[float], kinds: list[int], byte_fallback: bool, unk_id: int,
 *         split_words: bool = True): split_words False always runs the whole-string algorithm (to compare). */
static int Encoder_init(Encoder *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"pieces", "scores", "kinds", "byte_fallback", "unk_id", "split_words", NULL};
    PyObject *pieces, *scores, *kinds;
    int byte_fallback, split_words = 1;
    long unk_id;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!pl|p", names, &PyList_Type, &pieces, &PyList_Type, &scores,
                                     &PyList_Type, &kinds, &byte_fallback, &unk_id, &split_words))
        return -1;
    if (self->scores) return PyErr_SetString(PyExc_RuntimeError, "Encoder is already initialized"), -1;
    Py_ssize_t n = PyList_GET_SIZE(pieces);
    if (PyList_GET_SIZE(scores) != n || PyList_GET_SIZE(kinds) != n)
        return PyErr_Format(PyExc_ValueError, "pieces, scores and kinds differ in length (%zd, %zd, %zd)", n,
                            PyList_GET_SIZE(scores), PyList_GET_SIZE(kinds)), -1;
    if (n >= UINT32_MAX / 2) return PyErr_SetString(PyExc_ValueError, "too many pieces"), -1;
    self->n_pieces = (size_t)n;
    self->scores = malloc((size_t)n * sizeof(float) + 1);
    self->kinds = malloc((size_t)n + 1);
    self->id_objects = calloc((size_t)n + 1, sizeof(PyObject *));
    if (!self->scores || !self->kinds || !self->id_objects) return PyErr_NoMemory(), -1;
    if (map_init(&self->pieces, (size_t)n) || map_init(&self->user, 16)) return PyErr_NoMemory(), -1;
    if (read_scores_kinds(self, scores, kinds)) return -1;
    if (unk_id < 0 || unk_id >= n || self->kinds[unk_id] != KIND_UNKNOWN)
        return PyErr_Format(PyExc_ValueError, "unk_id %ld is not the id of an unknown-kind piece", unk_id), -1;
    self->unk_id = (uint32_t)unk_id;
    self->byte_fallback = byte_fallback;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = PyList_GET_ITEM(pieces, i);
        if (!PyUnicode_Check(text)) return PyErr_SetString(PyExc_TypeError, "pieces must be str"), -1;
        if (add_piece(self, (uint32_t)i, text)) return -1;
        if (!(self->id_objects[i] = PyLong_FromSsize_t(i))) return -1;
    }
    if (find_byte_ids(self)) return -1;
    self->split = split_words ? choose_split(self) : SPLIT_NONE;
    find_isolated(self);
    return 0;
}

/* ------------------------------------------------------------------ Python glue */

static int require_ready(Encoder *self) {
    if (!self->scores) return PyErr_SetString(PyExc_RuntimeError, "Encoder is not initialized"), -1;
    return 0;
}

static PyObject *ids_to_list(const Encoder *e, const uint32_t *ids, size_t n) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *value = e->id_objects[ids[i]];
        Py_INCREF(value);
        PyList_SET_ITEM(list, (Py_ssize_t)i, value);
    }
    return list;
}

/* The UTF-8 of a str, refusing texts whose symbol indices would not fit an int32. */
static const uint8_t *text_utf8(PyObject *text, size_t *n) {
    if (!PyUnicode_Check(text)) return PyErr_Format(PyExc_TypeError, "expected str, got %.100s", Py_TYPE(text)->tp_name), NULL;
    Py_ssize_t length;
    const char *s = PyUnicode_AsUTF8AndSize(text, &length);
    if (s && (size_t)length > MAX_TEXT_BYTES) return PyErr_SetString(PyExc_ValueError, "text is over 2 GiB: encode it in parts"), NULL;
    *n = (size_t)length;
    return (const uint8_t *)s;
}

static PyObject *Encoder_encode(Encoder *self, PyObject *text) {
    size_t n;
    const uint8_t *s;
    if (require_ready(self) || !(s = text_utf8(text, &n))) return NULL;
    Work w;
    if (work_init(&w)) return work_free(&w), PyErr_NoMemory();
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = encode_text(self, &w, s, n);
    Py_END_ALLOW_THREADS
    PyObject *result = failed ? PyErr_NoMemory() : ids_to_list(self, w.out.data, w.out.n);
    work_free(&w);
    return result;
}

/* Encode each str of a list with one word cache; the GIL is free while encoding. */
static PyObject *Encoder_encode_many(Encoder *self, PyObject *texts) {
    if (require_ready(self)) return NULL;
    if (!PyList_Check(texts)) return PyErr_Format(PyExc_TypeError, "expected a list of str");
    PyObject *held = PySequence_Tuple(texts); /* the list may change while the GIL is free */
    if (!held) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(held);
    const uint8_t **starts = PyMem_Calloc((size_t)count + 1, sizeof(uint8_t *));
    size_t *lengths = PyMem_Calloc((size_t)count + 1, sizeof(size_t)), *ends = PyMem_Calloc((size_t)count + 1, sizeof(size_t));
    PyObject *result = NULL;
    Work w;
    int ready = 0, failed = 0;
    if (!starts || !lengths || !ends) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++)
        if (!(starts[k] = text_utf8(PyTuple_GET_ITEM(held, k), &lengths[k]))) goto done;
    ready = 1;
    if (work_init(&w)) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < count && !failed; k++) {
        failed = encode_text(self, &w, starts[k], lengths[k]);
        ends[k] = w.out.n;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
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
    if (ready) work_free(&w);
    Py_DECREF(held);
    PyMem_Free(starts);
    PyMem_Free(lengths);
    PyMem_Free(ends);
    return result;
}

static PyObject *Encoder_split_mode(Encoder *self, void *closure) {
    static const char *modes[] = {"none", "before_space", "after_space"};
    return require_ready(self) ? NULL : PyUnicode_FromString(modes[self->split]);
}

static PyMethodDef Encoder_methods[] = {
    {"encode", (PyCFunction)Encoder_encode, METH_O, "encode(normalized: str) -> list[int]: SentencePiece BPE on a normalised string."},
    {"encode_many", (PyCFunction)Encoder_encode_many, METH_O,
     "encode_many(texts: list[str]) -> list[list[int]]: encode each normalised text, sharing one word cache."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Encoder_getset[] = {
    {"split_mode", (getter)Encoder_split_mode, NULL,
     "how texts are cut into words: 'before_space', 'after_space', or 'none' (the whole-string algorithm)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gptlab.tokenizer._spbpe.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Compiled SentencePiece BPE encoder for one model's pieces (ids identical to the sentencepiece library).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Encoder_init,
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_methods = Encoder_methods,
    .tp_getset = Encoder_getset,
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_spbpe", "gptlab's compiled SentencePiece BPE encoder (see spbpe.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__spbpe(void) {
    if (PyType_Ready(&EncoderType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (!module) return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(module, "Encoder", (PyObject *)&EncoderType)) {
        Py_DECREF(&EncoderType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
