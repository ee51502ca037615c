/* gptlab.tokenizer._fasttrain: the BPE merge learner in C.
 *
 * learn_merges(word_counts, n_merges) returns exactly what the pure-Python
 * reference gptlab.tokenizer.train.learn_merges returns (same merges, same
 * order, same early stop); tests/tokenizer/test_fasttrain.py proves it. This
 * file owns only the merge step: counting pieces happens elsewhere.
 *
 * Algorithm (every merge costs time in proportion to what it changes, even
 * inside one very long word, e.g. a whole document when nothing pre-splits):
 *
 *   words   All words' bytes lie in one array of positions (Node). Each word
 *           is a doubly linked list over its positions (next/prev); merging
 *           the pair at p and q = next[p] writes the new token at p and
 *           unlinks q, so positions keep their left-to-right order.
 *   pairs   A hash table (open addressing on (left << 32) | right) maps each
 *           pair to its count (weighted by word counts) and to the list of
 *           positions where it was seen. The lists are never pruned: an entry
 *           is checked when the pair is merged (still left, right there?).
 *           A list is appended to in ascending position order, and only in
 *           the merge that created its newer token, so it stays sorted, and
 *           overlapping runs (a a a with (a, a)) merge left to right.
 *   heap    A 4-ary max-heap of (count, pair), invalidated lazily: a popped
 *           entry whose count is out of date is pushed again with the current
 *           count. Order: higher count first; on equal counts the greater
 *           (left bytes, right bytes), compared with memcmp on the token
 *           bytes kept in an arena (an entry carries the left token's first
 *           8 bytes, which settle most ties); on equal bytes (should two
 *           tokens spell the same string) the smaller ids, as Python's heap
 *           tuples do.
 *
 * A merge then visits its pair's listed positions: for each one still valid
 * it takes the word's count w off the neighbouring pairs (x, left) and
 * (right, y), adds w to (x, new) and (new, y), and relinks. The pairs with
 * the new token that end positive go on the heap. Counts so equal a full
 * recount of the rewritten words, as in the reference.
 *
 * Words with count 0 mirror a quirk of the reference: they never change a
 * count, but each byte pair found only in such words sits in its heap with
 * count 0 and is merged once every counted pair is used up, greatest pair
 * first. So they are left out of the words and replayed at the end.
 *
 * The merge loop runs without the GIL, on copies of the inputs.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SIZEOF_INT128__)
typedef unsigned __int128 count_t; /* a sum of < 2**32 counts < 2**63 each cannot overflow */
#define COUNT_CAN_OVERFLOW 0
#else
typedef uint64_t count_t; /* inputs whose pair counts could pass 2**64 are refused */
#define COUNT_CAN_OVERFLOW 1
#endif

#define NONE UINT32_MAX /* no neighbour / no pair */
#define DEAD UINT32_MAX /* symbol merged into its left neighbour */
#define CHUNK_WORDS (1u << 16)
#define PREFETCH_AHEAD 16
#if defined(__GNUC__)
#define PREFETCH(address) __builtin_prefetch(address, 1)
#else
#define PREFETCH(address) ((void)0)
#endif

typedef struct {
    count_t count;
    uint32_t left, right;
    uint32_t *occ; /* positions of the left symbol, ascending; some stale */
    uint32_t n_occ, cap_occ;
    uint32_t stamp; /* merge that last created this pair (see touched) */
} Pair;

typedef struct {
    count_t count;
    uint64_t prefix; /* of the left token: settles most ties without a memcmp */
    uint32_t pair;
} Entry;

typedef struct {
    uint64_t key;
    uint32_t pair; /* NONE when the slot is empty */
} Slot;

typedef struct {
    size_t off;
    uint64_t prefix; /* first 8 bytes, big-endian, zero-padded: a < b as numbers means a < b as bytes */
    uint32_t len;
} Token;

typedef struct {
    uint32_t left, right;
} Merge;

/* One position of one word: 16 bytes, so four share a cache line (a merge's visits are cache misses). */
typedef struct {
    uint32_t sym; /* token id, or DEAD */
    uint32_t prev, next;
    uint32_t word; /* index into weight[] */
} Node;

typedef struct Chunk {
    struct Chunk *next;
    size_t used, cap;
    uint32_t data[];
} Chunk;

typedef struct {
    /* words */
    Node *node;
    size_t n_pos;
    uint64_t *weight; /* each word's count */
    /* tokens: token i is bytes[tok[i].off .. + tok[i].len] */
    unsigned char *bytes;
    size_t n_bytes, cap_bytes;
    Token *tok;
    size_t n_tok, cap_tok;
    /* merges in order, as (left id, right id) */
    Merge *merges;
    size_t n_merges, cap_merges;
    /* pairs and their hash table */
    Pair *pairs;
    size_t n_pairs, cap_pairs;
    Slot *slots;
    size_t n_slots;
    int shift;
    /* heap */
    Entry *heap;
    size_t n_heap, cap_heap;
    /* arena for occurrence lists: only ever grows, freed at the end */
    Chunk *chunks;
    /* pairs created during the current merge, to push when positive */
    uint32_t *touched;
    size_t n_touched, cap_touched;
    uint32_t stamp;
    /* byte pairs seen in words with count 0 */
    unsigned char zero_pair[65536];
} Trainer;

/* Make room for `need` elements of `size` bytes in the array whose address is `address` (any
   pointer type: it is read and written with memcpy) and whose capacity is *cap. 0, or -1. */
static int reserve(void *address, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t grown = *cap ? *cap : 16;
    while (grown < need)
        grown *= 2;
    if (grown > SIZE_MAX / size)
        return -1;
    void *array;
    memcpy(&array, address, sizeof array);
    void *larger = realloc(array, grown * size);
    if (!larger)
        return -1;
    memcpy(address, &larger, sizeof larger);
    *cap = grown;
    return 0;
}

static uint32_t *arena_alloc(Trainer *t, size_t n)
{
    Chunk *head = t->chunks;
    if (head && head->cap - head->used >= n) {
        uint32_t *out = head->data + head->used;
        head->used += n;
        return out;
    }
    size_t cap = n > CHUNK_WORDS / 4 ? n : CHUNK_WORDS; /* big lists get a chunk of their own */
    Chunk *chunk = malloc(sizeof(Chunk) + cap * sizeof(uint32_t));
    if (!chunk)
        return NULL;
    chunk->used = n;
    chunk->cap = cap;
    if (head && cap == n) { /* keep the head's free space for small lists */
        chunk->next = head->next;
        head->next = chunk;
    } else {
        chunk->next = head;
        t->chunks = chunk;
    }
    return chunk->data;
}

/* ------------------------------------------------------------------ tokens */

static int tok_cmp(const Trainer *t, uint32_t a, uint32_t b)
{
    if (a == b)
        return 0;
    size_t la = t->tok[a].len, lb = t->tok[b].len;
    int c = memcmp(t->bytes + t->tok[a].off, t->bytes + t->tok[b].off, la < lb ? la : lb);
    if (c)
        return c;
    return (la > lb) - (la < lb); /* a prefix is smaller */
}

static uint64_t prefix_of(const unsigned char *s, size_t len)
{
    uint64_t key = 0;
    for (size_t i = 0; i < 8; i++)
        key = key << 8 | (i < len ? s[i] : 0);
    return key;
}

static uint32_t new_token(Trainer *t, uint32_t left, uint32_t right)
{
    Token l = t->tok[left], r = t->tok[right];
    if (t->n_tok >= NONE - 1 || reserve(&t->bytes, &t->cap_bytes, t->n_bytes + l.len + r.len, 1) < 0 ||
        reserve(&t->tok, &t->cap_tok, t->n_tok + 1, sizeof(Token)) < 0)
        return NONE;
    memcpy(t->bytes + t->n_bytes, t->bytes + l.off, l.len);
    memcpy(t->bytes + t->n_bytes + l.len, t->bytes + r.off, r.len);
    t->tok[t->n_tok].off = t->n_bytes;
    t->tok[t->n_tok].len = l.len + r.len;
    t->tok[t->n_tok].prefix = prefix_of(t->bytes + t->n_bytes, l.len + r.len);
    t->n_bytes += l.len + r.len;
    return (uint32_t)t->n_tok++;
}

static int add_merge(Trainer *t, uint32_t left, uint32_t right)
{
    if (reserve(&t->merges, &t->cap_merges, t->n_merges + 1, sizeof(Merge)) < 0)
        return -1;
    t->merges[t->n_merges].left = left;
    t->merges[t->n_merges++].right = right;
    return 0;
}

/* ------------------------------------------------------------------- pairs */

static inline size_t slot_of(const Trainer *t, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> t->shift);
}

static inline uint32_t find_pair(const Trainer *t, uint32_t left, uint32_t right)
{
    uint64_t key = (uint64_t)left << 32 | right;
    for (size_t i = slot_of(t, key);; i = (i + 1) & (t->n_slots - 1)) {
        if (t->slots[i].pair == NONE || t->slots[i].key == key)
            return t->slots[i].pair;
    }
}

static int rehash(Trainer *t, size_t n_slots)
{
    Slot *old = t->slots;
    size_t n_old = t->n_slots;
    Slot *slots = malloc(n_slots * sizeof(Slot));
    if (!slots)
        return -1;
    for (size_t i = 0; i < n_slots; i++)
        slots[i].pair = NONE;
    int bits = 0;
    while (((size_t)1 << bits) < n_slots)
        bits++;
    t->slots = slots;
    t->n_slots = n_slots;
    t->shift = 64 - bits;
    for (size_t i = 0; i < n_old; i++) {
        if (old[i].pair == NONE)
            continue;
        size_t j = slot_of(t, old[i].key);
        while (slots[j].pair != NONE)
            j = (j + 1) & (n_slots - 1);
        slots[j] = old[i];
    }
    free(old);
    return 0;
}

/* The index of pair (left, right), created with count 0 if new; NONE when out of memory. */
static uint32_t get_pair(Trainer *t, uint32_t left, uint32_t right)
{
    uint64_t key = (uint64_t)left << 32 | right;
    size_t i = slot_of(t, key);
    for (; t->slots[i].pair != NONE; i = (i + 1) & (t->n_slots - 1)) {
        if (t->slots[i].key == key)
            return t->slots[i].pair;
    }
    if (t->n_pairs >= NONE - 1 || reserve(&t->pairs, &t->cap_pairs, t->n_pairs + 1, sizeof(Pair)) < 0)
        return NONE;
    uint32_t index = (uint32_t)t->n_pairs++;
    Pair *pair = &t->pairs[index];
    memset(pair, 0, sizeof(Pair));
    pair->left = left;
    pair->right = right;
    t->slots[i].key = key;
    t->slots[i].pair = index;
    if (2 * t->n_pairs > t->n_slots && rehash(t, 2 * t->n_slots) < 0)
        return NONE; /* the pair is in; only the table could not grow */
    return index;
}

/* Count `w` more for pair (left, right) seen at `pos`; returns its index or NONE (out of memory). */
static uint32_t add_pair(Trainer *t, uint32_t left, uint32_t right, count_t w, uint32_t pos)
{
    uint32_t index = get_pair(t, left, right);
    if (index == NONE)
        return NONE;
    Pair *pair = &t->pairs[index];
    if (pair->n_occ == pair->cap_occ) {
        uint32_t cap = pair->cap_occ ? 2 * pair->cap_occ : 2;
        uint32_t *occ = arena_alloc(t, cap);
        if (!occ)
            return NONE;
        if (pair->n_occ)
            memcpy(occ, pair->occ, pair->n_occ * sizeof(uint32_t));
        pair->occ = occ; /* the old block is simply abandoned in the arena */
        pair->cap_occ = cap;
    }
    pair->occ[pair->n_occ++] = pos;
    pair->count += w;
    return index;
}

/* -------------------------------------------------------------------- heap */

/* Whether entry x pops before entry y (see the top comment for the order). */
static inline int before(const Trainer *t, const Entry *x, const Entry *y)
{
    if (x->count != y->count)
        return x->count > y->count;
    if (x->prefix != y->prefix) /* equal prefixes may still be different tokens ("a", "a\0") */
        return x->prefix > y->prefix;
    const Pair *a = &t->pairs[x->pair], *b = &t->pairs[y->pair];
    int c = tok_cmp(t, a->left, b->left);
    if (!c)
        c = tok_cmp(t, a->right, b->right);
    if (c)
        return c > 0;
    if (a->left != b->left)
        return a->left < b->left;
    return a->right < b->right;
}

/* A 4-ary heap: half the depth of a binary one, and the four children share cache lines. */
static void sift_down(Trainer *t, size_t i)
{
    Entry *h = t->heap;
    Entry moving = h[i];
    for (;;) {
        size_t first = 4 * i + 1, child = first;
        if (first >= t->n_heap)
            break;
        size_t end = first + 4 < t->n_heap ? first + 4 : t->n_heap;
        for (size_t c = first + 1; c < end; c++) {
            if (before(t, &h[c], &h[child]))
                child = c;
        }
        if (!before(t, &h[child], &moving))
            break;
        h[i] = h[child];
        i = child;
    }
    h[i] = moving;
}

static int heap_push(Trainer *t, count_t count, uint32_t pair)
{
    if (reserve(&t->heap, &t->cap_heap, t->n_heap + 1, sizeof(Entry)) < 0)
        return -1;
    Entry moving = {count, t->tok[t->pairs[pair].left].prefix, pair};
    size_t i = t->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 4;
        if (!before(t, &moving, &t->heap[parent]))
            break;
        t->heap[i] = t->heap[parent];
        i = parent;
    }
    t->heap[i] = moving;
    return 0;
}

static Entry heap_pop(Trainer *t)
{
    Entry top = t->heap[0];
    t->heap[0] = t->heap[--t->n_heap];
    if (t->n_heap)
        sift_down(t, 0);
    return top;
}

/* ------------------------------------------------------------------- merge */

/* A pair that was adjacent at a merged occurrence loses `w`; it exists, since it was counted. */
static inline void lose(Trainer *t, uint32_t left, uint32_t right, count_t w)
{
    t->pairs[find_pair(t, left, right)].count -= w;
}

/* A pair with the new token gains `w` at `pos`; remembered for the heap once per merge. */
static inline int gain(Trainer *t, uint32_t left, uint32_t right, count_t w, uint32_t pos)
{
    uint32_t index = add_pair(t, left, right, w, pos);
    if (index == NONE)
        return -1;
    if (t->pairs[index].stamp != t->stamp) {
        t->pairs[index].stamp = t->stamp;
        if (reserve(&t->touched, &t->cap_touched, t->n_touched + 1, sizeof(uint32_t)) < 0)
            return -1;
        t->touched[t->n_touched++] = index;
    }
    return 0;
}

static int merge(Trainer *t, uint32_t index)
{
    uint32_t left = t->pairs[index].left, right = t->pairs[index].right;
    uint32_t made = new_token(t, left, right);
    if (made == NONE || add_merge(t, left, right) < 0)
        return -1;
    /* Detach the list: gain() may move t->pairs, but never appends to this pair (it lacks `made`). */
    uint32_t *occ = t->pairs[index].occ, n_occ = t->pairs[index].n_occ;
    t->pairs[index].occ = NULL;
    t->pairs[index].n_occ = t->pairs[index].cap_occ = 0;
    t->stamp++;
    t->n_touched = 0;
    Node *node = t->node;

    for (uint32_t k = 0; k < n_occ; k++) {
        uint32_t p = occ[k];
        if (k + PREFETCH_AHEAD < n_occ) /* the positions are known ahead: hide the cache misses */
            PREFETCH(&node[occ[k + PREFETCH_AHEAD]]);
        if (node[p].sym != left) /* stale: merged away, or into something else */
            continue;
        uint32_t q = node[p].next;
        if (q == NONE || node[q].sym != right)
            continue;
        count_t w = t->weight[node[p].word];
        uint32_t a = node[p].prev, b = node[q].next;
        /* Neighbours see the symbols as they are now: an earlier occurrence in this word
           may already be `made`, which is what makes (a, a, a) -> (aa, a) come out right. */
        if (a != NONE) {
            lose(t, node[a].sym, left, w);
            if (gain(t, node[a].sym, made, w, a) < 0)
                return -1;
        }
        if (b != NONE) {
            lose(t, right, node[b].sym, w);
            if (gain(t, made, node[b].sym, w, p) < 0)
                return -1;
        }
        node[p].sym = made;
        node[q].sym = DEAD;
        node[p].next = b;
        if (b != NONE)
            node[b].prev = p;
    }
    t->pairs[index].count = 0; /* a left-to-right merge leaves no (left, right) anywhere */

    for (size_t k = 0; k < t->n_touched; k++) {
        uint32_t i = t->touched[k];
        if (t->pairs[i].count > 0 && heap_push(t, t->pairs[i].count, i) < 0)
            return -1;
    }
    return 0;
}

/* Runs without the GIL. Returns -1 when out of memory. */
static int train(Trainer *t, long long n_merges)
{
    t->n_slots = 0;
    if (rehash(t, 1 << 12) < 0)
        return -1;
    for (uint32_t p = 0; p + 1 < t->n_pos; p++) {
        const Node *n = &t->node[p];
        if (n->next != NONE && add_pair(t, n->sym, n[1].sym, t->weight[n->word], p) == NONE)
            return -1;
    }
    if (reserve(&t->heap, &t->cap_heap, t->n_pairs, sizeof(Entry)) < 0)
        return -1;
    for (uint32_t i = 0; i < t->n_pairs; i++) {
        t->heap[i].count = t->pairs[i].count;
        t->heap[i].prefix = t->tok[t->pairs[i].left].prefix;
        t->heap[i].pair = i;
    }
    t->n_heap = t->n_pairs;
    for (size_t i = (t->n_heap + 2) / 4; i-- > 0;) /* every entry with a child */
        sift_down(t, i);

    while ((long long)t->n_merges < n_merges && t->n_heap) {
        Entry top = heap_pop(t);
        count_t current = t->pairs[top.pair].count;
        if (current != top.count) { /* stale: the count dropped since the push */
            if (current > 0 && heap_push(t, current, top.pair) < 0)
                return -1;
            continue;
        }
        if (merge(t, top.pair) < 0)
            return -1;
    }
    /* The reference's count-0 heap entries: byte pairs that only words with count 0 hold. */
    for (int k = 65535; k >= 0 && (long long)t->n_merges < n_merges; k--) {
        if (t->zero_pair[k] && find_pair(t, (uint32_t)k >> 8, (uint32_t)k & 255) == NONE) {
            if (add_merge(t, (uint32_t)k >> 8, (uint32_t)k & 255) < 0)
                return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- Python */

static void trainer_free(Trainer *t)
{
    free(t->node);
    free(t->weight);
    free(t->bytes);
    free(t->tok);
    free(t->merges);
    free(t->pairs);
    free(t->slots);
    free(t->heap);
    free(t->touched);
    while (t->chunks) {
        Chunk *next = t->chunks->next;
        free(t->chunks);
        t->chunks = next;
    }
    free(t);
}

/* Check every entry, then copy the counted words (count > 0, length > 1) into t. */
static int load_words(Trainer *t, PyObject *dict)
{
    Py_ssize_t i = 0;
    PyObject *key, *value;
    size_t n_pos = 0;
#if COUNT_CAN_OVERFLOW
    uint64_t total = 0;
#endif
    while (PyDict_Next(dict, &i, &key, &value)) {
        if (!PyBytes_Check(key)) {
            PyErr_Format(PyExc_TypeError, "word_counts keys must be bytes, not %.100s", Py_TYPE(key)->tp_name);
            return -1;
        }
        if (!PyLong_Check(value)) {
            PyErr_Format(PyExc_TypeError, "word_counts values must be int, not %.100s", Py_TYPE(value)->tp_name);
            return -1;
        }
        int overflow = 0;
        long long count = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (count == -1 && PyErr_Occurred())
            return -1;
        if (overflow > 0) {
            PyErr_SetString(PyExc_OverflowError, "a word count does not fit in 64 bits");
            return -1;
        }
        if (overflow < 0 || count < 0) {
            PyErr_SetString(PyExc_ValueError, "word counts must not be negative");
            return -1;
        }
        size_t len = (size_t)PyBytes_GET_SIZE(key);
        if (len < 2)
            continue;
        if (count == 0) {
            const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(key);
            for (size_t j = 0; j + 1 < len; j++)
                t->zero_pair[s[j] << 8 | s[j + 1]] = 1;
            continue;
        }
#if COUNT_CAN_OVERFLOW
        if ((uint64_t)(len - 1) > (UINT64_MAX - total) / (uint64_t)count) {
            PyErr_SetString(PyExc_OverflowError, "pair counts would pass 2**64");
            return -1;
        }
        total += (uint64_t)(len - 1) * (uint64_t)count;
#endif
        n_pos += len;
        if (n_pos >= NONE) { /* positions are uint32 */
            PyErr_SetString(PyExc_OverflowError, "the words hold 2**32 bytes or more");
            return -1;
        }
    }
    t->node = malloc((n_pos ? n_pos : 1) * sizeof(Node));
    t->weight = malloc((PyDict_GET_SIZE(dict) ? (size_t)PyDict_GET_SIZE(dict) : 1) * sizeof(uint64_t));
    if (!t->node || !t->weight) {
        PyErr_NoMemory();
        return -1;
    }
    size_t pos = 0;
    uint32_t word = 0;
    i = 0;
    while (PyDict_Next(dict, &i, &key, &value)) {
        size_t len = (size_t)PyBytes_GET_SIZE(key);
        long long count = PyLong_AsLongLong(value); /* checked above */
        if (len < 2 || count == 0)
            continue;
        const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(key);
        t->weight[word] = (uint64_t)count;
        for (size_t j = 0; j < len; j++, pos++) {
            Node *n = &t->node[pos];
            n->word = word;
            n->sym = s[j];
            n->prev = j ? (uint32_t)pos - 1 : NONE;
            n->next = j + 1 < len ? (uint32_t)pos + 1 : NONE;
        }
        word++; /* fewer words than positions, so it fits in 32 bits */
    }
    t->n_pos = pos;

    /* tokens 0..255 are the bytes */
    if (reserve(&t->bytes, &t->cap_bytes, 1024, 1) < 0 ||
        reserve(&t->tok, &t->cap_tok, 1024, sizeof(Token)) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    for (int b = 0; b < 256; b++) {
        t->bytes[b] = (unsigned char)b;
        t->tok[b].off = (size_t)b;
        t->tok[b].len = 1;
        t->tok[b].prefix = (uint64_t)b << 56;
    }
    t->n_bytes = t->n_tok = 256;
    return 0;
}

static PyObject *build_list(const Trainer *t)
{
    PyObject *list = PyList_New((Py_ssize_t)t->n_merges);
    if (!list)
        return NULL;
    for (size_t i = 0; i < t->n_merges; i++) {
        Token l = t->tok[t->merges[i].left], r = t->tok[t->merges[i].right];
        PyObject *merge = Py_BuildValue("(y#y#)", (const char *)t->bytes + l.off, (Py_ssize_t)l.len,
                                        (const char *)t->bytes + r.off, (Py_ssize_t)r.len);
        if (!merge) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, merge);
    }
    return list;
}

/* The merges as a list of (left bytes, right bytes). The cyclic GC is paused meanwhile: the tuples
   hold no cycles, and at 32K merges its passes over every object in the process cost more than the list. */
static PyObject *build_result(const Trainer *t)
{
#if PY_VERSION_HEX >= 0x030A0000
    int was_enabled = PyGC_Disable();
    PyObject *list = build_list(t);
    if (was_enabled)
        PyGC_Enable();
    return list;
#else
    return build_list(t);
#endif
}

static PyObject *learn_merges(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *names[] = {"word_counts", "n_merges", NULL};
    PyObject *word_counts, *n_object;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:learn_merges", names, &word_counts, &n_object))
        return NULL;
    PyObject *index = PyNumber_Index(n_object);
    if (!index)
        return NULL;
    int overflow = 0;
    long long n_merges = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (n_merges == -1 && PyErr_Occurred())
        return NULL;
    if (overflow)
        n_merges = overflow > 0 ? LLONG_MAX : -1;

    /* Any mapping works, as in the reference; a dict is read in place. */
    PyObject *dict;
    if (PyDict_Check(word_counts)) {
        dict = Py_NewRef(word_counts);
    } else if (PyObject_HasAttrString(word_counts, "keys")) {
        if (!(dict = PyObject_CallOneArg((PyObject *)&PyDict_Type, word_counts)))
            return NULL;
    } else {
        return PyErr_Format(PyExc_TypeError, "word_counts must be a mapping, not %.100s", Py_TYPE(word_counts)->tp_name);
    }
    Trainer *t = calloc(1, sizeof(Trainer));
    if (!t) {
        Py_DECREF(dict);
        return PyErr_NoMemory();
    }
    int status = load_words(t, dict);
    Py_DECREF(dict);
    if (status < 0) {
        trainer_free(t);
        return NULL;
    }
    if (n_merges > 0) {
        Py_BEGIN_ALLOW_THREADS
        status = train(t, n_merges);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = status < 0 ? PyErr_NoMemory() : build_result(t);
    trainer_free(t);
    return result;
}

static PyMethodDef methods[] = {
    {"learn_merges", (PyCFunction)(void (*)(void))learn_merges, METH_VARARGS | METH_KEYWORDS,
     "learn_merges(word_counts, n_merges) -> list[tuple[bytes, bytes]]\n\n"
     "Up to n_merges BPE merges learned from distinct words (bytes) and their counts; exactly\n"
     "gptlab.tokenizer.train.learn_merges, in C. Token ids 0..255 are the bytes, merge i makes\n"
     "id 256 + i; stops early when no pair occurs any more."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gptlab.tokenizer._fasttrain",
    .m_doc = "The BPE merge learner in C (see gptlab.tokenizer.train.learn_merges for the reference).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fasttrain(void)
{
    return PyModule_Create(&module);
}
