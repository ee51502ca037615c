/* gptlab.tokenizer._sptrain: SentencePiece-style BPE piece learning in C.
 *
 * learn(...) returns exactly what the readable reference
 * gptlab.tokenizer.sp_train.learn_pieces returns for a PieceRules (same pieces,
 * same order, same early stop); tests/tokenizer/test_sp_train_native.py proves it.
 *
 * Each step merges the valid pair with the highest count (weighted by word
 * counts); ties go to the shorter piece, then the smaller text (code points),
 * then the smaller (left, right) ids, as the reference's heap tuples order them.
 * A merged text that is already a symbol ("aaa" from "a"+"aa" after "aa"+"a")
 * reuses that symbol's id and is not a new piece.
 *
 * Which pairs may merge needs no Unicode here: Python hands each starting
 * character's traits (blocked: never in a longer piece; space: the "▁";
 * script: its script id, -1 for none), and a merged symbol's traits follow from
 * its halves. left + right is valid when neither is blocked, right holds no
 * "▁", the length fits, and the script left ends with equals the one right
 * starts with (either may be -1: any).
 *
 * Data: words are runs of symbol ids in one array, rewritten in place; a hash
 * table maps each pair to its count and the words it was seen in (a list never
 * pruned, checked on use); a binary heap of (count, pair) is invalidated lazily:
 * a popped entry whose count is out of date goes back with the current count.
 * Merging a pair re-counts only the words that hold it. The loop runs without the GIL.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX
#define BLOCKED 1u /* holds a character no longer piece may hold (a digit with split_digits, a tab) */
#define HAS_SPACE 2u /* holds "▁": may only start a piece */

typedef struct {
    uint32_t start, len; /* code points text[start : start + len] */
    int32_t first, last; /* the script it starts and ends with; -1: none (only "▁" and combining marks) */
    uint32_t flags;
} Symbol;

typedef struct {
    uint32_t left, right;
    int64_t count;
    uint32_t *words, n_words, cap_words; /* words it was seen in (possibly no longer) */
    uint64_t pushed; /* the merge step that last queued it */
} Pair;

typedef struct {
    int64_t count;
    uint32_t len, pair;
} Entry;

typedef struct {
    Symbol *symbols; size_t n_symbols, cap_symbols;
    uint32_t *text; size_t n_text, cap_text;
    uint32_t *ids, *word_start, *word_len; int64_t *word_count; uint64_t *word_seen; size_t n_words;
    Pair *pairs; size_t n_pairs, cap_pairs;
    uint32_t *pair_slots; size_t pair_mask; /* pair index + 1; 0 is empty */
    uint32_t *text_slots; size_t text_mask, n_texts; /* merged symbol id + 1; 0 is empty */
    Entry *heap; size_t n_heap, cap_heap;
    uint32_t *fresh; size_t n_fresh, cap_fresh; /* pairs holding the new symbol, this step */
    uint32_t max_length;
    uint64_t step; /* merges done; stamps the pairs queued in a step */
    uint32_t *pieces; size_t n_pieces, cap_pieces; /* symbol ids of the new pieces, in order */
} Learner;

static int reserve(void *address, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t cap_new = *cap ? *cap : 16;
    while (cap_new < need)
        cap_new *= 2;
    void *grown = realloc(*(void **)address, cap_new * size);
    if (!grown)
        return -1;
    *(void **)address = grown;
    *cap = cap_new;
    return 0;
}

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* ---------------------------------------------------------------- symbols and their texts */

static inline uint32_t char_at(const Learner *l, const Symbol *a, const Symbol *b, uint32_t i)
{
    return i < a->len ? l->text[a->start + i] : l->text[b->start + i - a->len];
}

/* <0, 0, >0 as the text of pair p sorts against that of pair q (equal lengths). */
static int pair_text_cmp(const Learner *l, const Pair *p, const Pair *q, uint32_t len)
{
    const Symbol *pa = &l->symbols[p->left], *pb = &l->symbols[p->right];
    const Symbol *qa = &l->symbols[q->left], *qb = &l->symbols[q->right];
    for (uint32_t i = 0; i < len; i++) {
        uint32_t x = char_at(l, pa, pb, i), y = char_at(l, qa, qb, i);
        if (x != y)
            return x < y ? -1 : 1;
    }
    return 0;
}

static uint64_t text_hash(const uint32_t *text, uint32_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (uint32_t i = 0; i < len; i++)
        h = (h ^ text[i]) * 1099511628211ULL;
    return mix(h);
}

static int grow_texts(Learner *l)
{
    size_t n_slots = (l->text_mask + 1) * 2;
    uint32_t *slots = calloc(n_slots, sizeof(uint32_t));
    if (!slots)
        return -1;
    for (size_t i = 0; i <= l->text_mask; i++) {
        uint32_t id = l->text_slots[i];
        if (!id)
            continue;
        const Symbol *s = &l->symbols[id - 1];
        size_t slot = text_hash(l->text + s->start, s->len) & (n_slots - 1);
        while (slots[slot])
            slot = (slot + 1) & (n_slots - 1);
        slots[slot] = id;
    }
    free(l->text_slots);
    l->text_slots = slots;
    l->text_mask = n_slots - 1;
    return 0;
}

/* The symbol spelling left + right: an existing one, or a new one (*created set). NONE when out of memory. */
static uint32_t merged_symbol(Learner *l, uint32_t left, uint32_t right, int *created)
{
    Symbol a = l->symbols[left], b = l->symbols[right];
    uint32_t len = a.len + b.len;
    if (reserve(&l->text, &l->cap_text, l->n_text + len, sizeof(uint32_t)) < 0)
        return NONE;
    uint32_t *text = l->text + l->n_text; /* written at the arena's end; kept only if new */
    memcpy(text, l->text + a.start, a.len * sizeof(uint32_t));
    memcpy(text + a.len, l->text + b.start, b.len * sizeof(uint32_t));
    size_t slot = text_hash(text, len) & l->text_mask;
    for (; l->text_slots[slot]; slot = (slot + 1) & l->text_mask) {
        const Symbol *s = &l->symbols[l->text_slots[slot] - 1];
        if (s->len == len && !memcmp(l->text + s->start, text, len * sizeof(uint32_t))) {
            *created = 0;
            return l->text_slots[slot] - 1;
        }
    }
    if (reserve(&l->symbols, &l->cap_symbols, l->n_symbols + 1, sizeof(Symbol)) < 0)
        return NONE;
    uint32_t id = (uint32_t)l->n_symbols++;
    l->symbols[id] = (Symbol){
        .start = (uint32_t)l->n_text, .len = len, .flags = a.flags | b.flags,
        .first = a.first >= 0 ? a.first : b.first, .last = b.last >= 0 ? b.last : a.last,
    };
    l->n_text += len;
    l->text_slots[slot] = id + 1;
    if (++l->n_texts * 2 > l->text_mask && grow_texts(l) < 0)
        return NONE;
    *created = 1;
    return id;
}

/* PieceRules on left + right, from the halves' traits (both are valid pieces or characters). */
static inline int mergeable(const Learner *l, uint32_t left, uint32_t right)
{
    const Symbol *a = &l->symbols[left], *b = &l->symbols[right];
    if ((a->flags | b->flags) & BLOCKED || b->flags & HAS_SPACE || a->len + b->len > l->max_length)
        return 0;
    return a->last < 0 || b->first < 0 || a->last == b->first;
}

/* ---------------------------------------------------------------- pairs */

static inline size_t pair_slot(const Learner *l, uint32_t left, uint32_t right)
{
    return mix(((uint64_t)left << 32 | right) + 0x9e3779b97f4a7c15ULL) & l->pair_mask;
}

static int grow_pairs(Learner *l)
{
    size_t n_slots = (l->pair_mask + 1) * 2;
    uint32_t *slots = calloc(n_slots, sizeof(uint32_t));
    if (!slots)
        return -1;
    free(l->pair_slots);
    l->pair_slots = slots;
    l->pair_mask = n_slots - 1;
    for (size_t i = 0; i < l->n_pairs; i++) {
        size_t slot = pair_slot(l, l->pairs[i].left, l->pairs[i].right);
        while (slots[slot])
            slot = (slot + 1) & l->pair_mask;
        slots[slot] = (uint32_t)i + 1;
    }
    return 0;
}

/* The index of pair (left, right), added with count 0 if new; NONE when out of memory. */
static uint32_t get_pair(Learner *l, uint32_t left, uint32_t right)
{
    size_t slot = pair_slot(l, left, right);
    for (; l->pair_slots[slot]; slot = (slot + 1) & l->pair_mask) {
        const Pair *p = &l->pairs[l->pair_slots[slot] - 1];
        if (p->left == left && p->right == right)
            return l->pair_slots[slot] - 1;
    }
    if (reserve(&l->pairs, &l->cap_pairs, l->n_pairs + 1, sizeof(Pair)) < 0)
        return NONE;
    uint32_t index = (uint32_t)l->n_pairs++;
    l->pairs[index] = (Pair){.left = left, .right = right, .pushed = UINT64_MAX};
    l->pair_slots[slot] = index + 1;
    if (l->n_pairs * 2 > l->pair_mask && grow_pairs(l) < 0)
        return NONE;
    return index;
}

static int note_word(Pair *p, uint32_t word)
{
    if (p->n_words && p->words[p->n_words - 1] == word)
        return 0;
    size_t cap = p->cap_words;
    if (reserve(&p->words, &cap, (size_t)p->n_words + 1, sizeof(uint32_t)) < 0)
        return -1;
    p->cap_words = (uint32_t)cap;
    p->words[p->n_words++] = word;
    return 0;
}

/* ---------------------------------------------------------------- the heap: best entry on top */

static inline int better(const Learner *l, const Entry *x, const Entry *y)
{
    if (x->count != y->count)
        return x->count > y->count;
    if (x->len != y->len)
        return x->len < y->len;
    const Pair *p = &l->pairs[x->pair], *q = &l->pairs[y->pair];
    int order = pair_text_cmp(l, p, q, x->len);
    if (order)
        return order < 0;
    if (p->left != q->left)
        return p->left < q->left;
    return p->right < q->right;
}

static int heap_push(Learner *l, uint32_t pair)
{
    if (reserve(&l->heap, &l->cap_heap, l->n_heap + 1, sizeof(Entry)) < 0)
        return -1;
    const Pair *p = &l->pairs[pair];
    Entry e = {p->count, l->symbols[p->left].len + l->symbols[p->right].len, pair};
    size_t i = l->n_heap++;
    while (i > 0 && better(l, &e, &l->heap[(i - 1) / 2])) {
        l->heap[i] = l->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    l->heap[i] = e;
    return 0;
}

static Entry heap_pop(Learner *l)
{
    Entry top = l->heap[0], last = l->heap[--l->n_heap];
    size_t i = 0, n = l->n_heap;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n)
            break;
        if (child + 1 < n && better(l, &l->heap[child + 1], &l->heap[child]))
            child++;
        if (!better(l, &l->heap[child], &last))
            break;
        l->heap[i] = l->heap[child];
        i = child;
    }
    if (n)
        l->heap[i] = last;
    return top;
}

/* ---------------------------------------------------------------- counting and merging */

/* Add `weight` to every valid pair of word w. Note w under every pair (`note_all`, the first count) or
 * under those holding `symbol` (after a merge; they are queued for the heap too). */
static int count_word(Learner *l, size_t w, int64_t weight, uint32_t symbol, int note_all)
{
    const uint32_t *ids = l->ids + l->word_start[w];
    for (uint32_t i = 0; i + 1 < l->word_len[w]; i++) {
        if (!mergeable(l, ids[i], ids[i + 1]))
            continue;
        uint32_t index = get_pair(l, ids[i], ids[i + 1]);
        if (index == NONE)
            return -1;
        Pair *p = &l->pairs[index];
        p->count += weight;
        if (note_all || (symbol != NONE && (ids[i] == symbol || ids[i + 1] == symbol))) {
            if (note_word(p, (uint32_t)w) < 0)
                return -1;
            if (!note_all && p->pushed != l->step) {
                p->pushed = l->step;
                if (reserve(&l->fresh, &l->cap_fresh, l->n_fresh + 1, sizeof(uint32_t)) < 0)
                    return -1;
                l->fresh[l->n_fresh++] = index;
            }
        }
    }
    return 0;
}

/* Rewrite the words holding pair `index` with `symbol`, re-counting them; queue the pairs holding `symbol`. */
static int merge(Learner *l, uint32_t index, uint32_t symbol)
{
    Pair *p = &l->pairs[index];
    uint32_t left = p->left, right = p->right, *words = p->words, n_words = p->n_words;
    p->words = NULL, p->n_words = p->cap_words = 0; /* taken: the pair is gone from every word after this */
    l->n_fresh = 0;
    int status = 0;
    for (uint32_t k = 0; k < n_words && status == 0; k++) {
        uint32_t w = words[k];
        if (l->word_seen[w] == l->step)
            continue;
        l->word_seen[w] = l->step;
        uint32_t *ids = l->ids + l->word_start[w], n = l->word_len[w], out = 0;
        uint32_t i = 0;
        while (i + 1 < n && !(ids[i] == left && ids[i + 1] == right))
            i++;
        if (i + 1 >= n) /* lost the pair in an earlier merge */
            continue;
        status = count_word(l, w, -l->word_count[w], NONE, 0);
        for (i = 0; i < n; out++) {
            if (i + 1 < n && ids[i] == left && ids[i + 1] == right) {
                ids[out] = symbol;
                i += 2;
            } else {
                ids[out] = ids[i++];
            }
        }
        l->word_len[w] = out;
        if (status == 0)
            status = count_word(l, w, l->word_count[w], symbol, 0);
    }
    free(words);
    l->pairs[index].count = 0;
    for (size_t k = 0; k < l->n_fresh && status == 0; k++)
        if (l->pairs[l->fresh[k]].count > 0)
            status = heap_push(l, l->fresh[k]);
    return status;
}

static int learn_loop(Learner *l, size_t n_pieces)
{
    for (size_t w = 0; w < l->n_words; w++)
        if (count_word(l, w, l->word_count[w], NONE, 1) < 0)
            return -1;
    for (size_t i = 0; i < l->n_pairs; i++)
        if (l->pairs[i].count > 0 && heap_push(l, (uint32_t)i) < 0)
            return -1;
    while (l->n_pieces < n_pieces && l->n_heap) {
        Entry top = heap_pop(l);
        int64_t current = l->pairs[top.pair].count;
        if (current != top.count) { /* stale: the count dropped since this entry was pushed */
            if (current > 0 && heap_push(l, top.pair) < 0)
                return -1;
            continue;
        }
        int created = 0;
        uint32_t symbol = merged_symbol(l, l->pairs[top.pair].left, l->pairs[top.pair].right, &created);
        if (symbol == NONE)
            return -1;
        if (created) {
            if (reserve(&l->pieces, &l->cap_pieces, l->n_pieces + 1, sizeof(uint32_t)) < 0)
                return -1;
            l->pieces[l->n_pieces++] = symbol;
        }
        l->step++;
        if (merge(l, top.pair, symbol) < 0)
            return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- Python interface */

static void learner_free(Learner *l)
{
    for (size_t i = 0; i < l->n_pairs; i++)
        free(l->pairs[i].words);
    free(l->symbols), free(l->text), free(l->ids), free(l->word_start), free(l->word_len);
    free(l->word_count), free(l->word_seen), free(l->pairs), free(l->pair_slots), free(l->text_slots);
    free(l->heap), free(l->fresh), free(l->pieces);
    free(l);
}

/* Words from the flat ids and the lengths; symbols from the characters and their traits. */
static int load(Learner *l, const Py_buffer *ids, const Py_buffer *lengths, const Py_buffer *counts, PyObject *chars, PyObject *traits)
{
    Py_ssize_t n_chars = PyList_GET_SIZE(chars);
    size_t n_ids = (size_t)ids->len / 4, n_words = (size_t)lengths->len / 4;
    if (PyList_GET_SIZE(traits) != n_chars * 3 || (size_t)counts->len / 8 != n_words || n_ids >= NONE || (size_t)n_chars >= NONE) {
        PyErr_SetString(PyExc_ValueError, "learn: traits must hold 3 ints per character and counts one int64 per word");
        return -1;
    }
    if (reserve(&l->symbols, &l->cap_symbols, (size_t)n_chars + 1, sizeof(Symbol)) < 0
        || reserve(&l->text, &l->cap_text, (size_t)n_chars + 1, sizeof(uint32_t)) < 0)
        return (PyErr_NoMemory(), -1);
    for (Py_ssize_t i = 0; i < n_chars; i++) {
        PyObject *c = PyList_GET_ITEM(chars, i);
        if (!PyUnicode_Check(c) || PyUnicode_GET_LENGTH(c) != 1) {
            PyErr_SetString(PyExc_ValueError, "learn: chars must be one-character strings");
            return -1;
        }
        long flags = PyLong_AsLong(PyList_GET_ITEM(traits, 3 * i));
        long script = PyLong_AsLong(PyList_GET_ITEM(traits, 3 * i + 1));
        long last = PyLong_AsLong(PyList_GET_ITEM(traits, 3 * i + 2));
        if (PyErr_Occurred())
            return -1;
        l->text[i] = PyUnicode_READ_CHAR(c, 0);
        l->symbols[i] = (Symbol){.start = (uint32_t)i, .len = 1, .first = (int32_t)script, .last = (int32_t)last, .flags = (uint32_t)flags};
    }
    l->n_symbols = l->n_text = (size_t)n_chars;
    l->n_words = n_words;
    l->ids = malloc((n_ids + 1) * sizeof(uint32_t));
    l->word_start = malloc((n_words + 1) * sizeof(uint32_t));
    l->word_len = malloc((n_words + 1) * sizeof(uint32_t));
    l->word_count = malloc((n_words + 1) * sizeof(int64_t));
    l->word_seen = calloc(n_words + 1, sizeof(uint64_t));
    l->pair_slots = calloc(1024, sizeof(uint32_t)), l->pair_mask = 1023;
    l->text_slots = calloc(1024, sizeof(uint32_t)), l->text_mask = 1023;
    if (!l->ids || !l->word_start || !l->word_len || !l->word_count || !l->word_seen || !l->pair_slots || !l->text_slots)
        return (PyErr_NoMemory(), -1);
    memcpy(l->ids, ids->buf, n_ids * sizeof(uint32_t));
    memcpy(l->word_len, lengths->buf, n_words * sizeof(uint32_t));
    memcpy(l->word_count, counts->buf, n_words * sizeof(int64_t));
    size_t at = 0;
    for (size_t w = 0; w < n_words; w++) {
        l->word_start[w] = (uint32_t)at;
        at += l->word_len[w];
        if (at > n_ids || l->word_count[w] <= 0) {
            PyErr_SetString(PyExc_ValueError, "learn: the lengths overrun the ids, or a count is not positive");
            return -1;
        }
    }
    for (size_t i = 0; i < n_ids; i++)
        if (l->ids[i] >= (uint32_t)n_chars) {
            PyErr_SetString(PyExc_ValueError, "learn: an id names no character");
            return -1;
        }
    return 0;
}

static PyObject *pieces_list(const Learner *l)
{
    PyObject *list = PyList_New((Py_ssize_t)l->n_pieces);
    for (size_t i = 0; list && i < l->n_pieces; i++) {
        const Symbol *s = &l->symbols[l->pieces[i]];
        PyObject *text = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, l->text + s->start, s->len);
        if (!text) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, text);
    }
    return list;
}

static PyObject *learn(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer ids, lengths, counts;
    PyObject *chars, *traits;
    Py_ssize_t n_pieces, max_length;
    if (!PyArg_ParseTuple(args, "y*y*y*O!O!nn:learn", &ids, &lengths, &counts, &PyList_Type, &chars, &PyList_Type, &traits,
                          &max_length, &n_pieces))
        return NULL;
    Learner *l = calloc(1, sizeof(Learner));
    PyObject *result = NULL;
    if (!l) {
        PyErr_NoMemory();
    } else if (load(l, &ids, &lengths, &counts, chars, traits) == 0) {
        l->max_length = max_length > 0 && max_length < UINT32_MAX ? (uint32_t)max_length : UINT32_MAX;
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = learn_loop(l, n_pieces > 0 ? (size_t)n_pieces : 0);
        Py_END_ALLOW_THREADS
        result = status < 0 ? PyErr_NoMemory() : pieces_list(l);
    }
    if (l)
        learner_free(l);
    PyBuffer_Release(&ids), PyBuffer_Release(&lengths), PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"learn", learn, METH_VARARGS,
     "learn(ids, lengths, counts, chars, traits, max_length, n_pieces) -> list[str]\n\n"
     "Up to n_pieces new pieces in merge order; exactly gptlab.tokenizer.sp_train.learn_pieces with PieceRules.\n"
     "ids: uint32 character ids of the words, one after another; lengths: uint32 per word; counts: int64 per word;\n"
     "chars: the characters by id; traits: per character (flags: 1 blocked, 2 the space mark; first script; last script)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gptlab.tokenizer._sptrain",
    .m_doc = "SentencePiece-style BPE piece learning in C (see gptlab.tokenizer.sp_train.learn_pieces for the reference).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__sptrain(void)
{
    return PyModule_Create(&module);
}
