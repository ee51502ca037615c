/* Growable arrays and a bytes -> u64 hash map, shared by the compiled encoders (fastbpe.c, spbpe.c).
 *
 * The map: open addressing with linear probing; slots hold entry index + 1 (0: empty); keys live in one
 * arena. Callers hash the keys themselves (each file keeps the hash that suits its keys) and pass the hash in.
 * Included once per extension: every function is static.
 */
#ifndef GPTLAB_BYTES_MAP_H
#define GPTLAB_BYTES_MAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint32_t *data; size_t n, cap; } U32Vec;
typedef struct { uint8_t *data; size_t n, cap; } ByteVec;

/* Make room for `need` items of `item` bytes (doubling); -1 when out of memory. */
static inline int grow(void **data, size_t *cap, size_t need, size_t item) {
    if (need <= *cap) return 0;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*data, cap2 * item);
    if (!p) return -1;
    *data = p;
    *cap = cap2;
    return 0;
}

static inline int u32_push(U32Vec *v, uint32_t x) {
    if (v->n == v->cap && grow((void **)&v->data, &v->cap, v->n + 1, sizeof(uint32_t))) return -1;
    v->data[v->n++] = x;
    return 0;
}

static inline int u32_push_n(U32Vec *v, const uint32_t *src, size_t k) {
    if (grow((void **)&v->data, &v->cap, v->n + k, sizeof(uint32_t))) return -1;
    memcpy(v->data + v->n, src, k * sizeof(uint32_t));
    v->n += k;
    return 0;
}

static inline int bytes_push_n(ByteVec *v, const uint8_t *src, size_t k) {
    if (grow((void **)&v->data, &v->cap, v->n + k, 1)) return -1;
    memcpy(v->data + v->n, src, k);
    v->n += k;
    return 0;
}

typedef struct { uint64_t hash, value; size_t key_offset, key_length; } Entry;
typedef struct {
    uint32_t *slots;
    size_t mask, n, cap;
    Entry *entries;
    ByteVec keys;
} BytesMap;

static inline int map_init(BytesMap *m, size_t expected) {
    size_t capacity = 64;
    while (capacity < 2 * expected) capacity *= 2;
    memset(m, 0, sizeof *m);
    if (!(m->slots = calloc(capacity, sizeof(uint32_t)))) return -1;
    m->mask = capacity - 1;
    return 0;
}

static inline void map_free(BytesMap *m) {
    free(m->slots);
    free(m->entries);
    free(m->keys.data);
    memset(m, 0, sizeof *m);
}

static inline void map_clear(BytesMap *m) {
    if (!m->n) return;
    memset(m->slots, 0, (m->mask + 1) * sizeof(uint32_t));
    m->n = 0;
    m->keys.n = 0;
}

static inline Entry *map_find(const BytesMap *m, const uint8_t *key, size_t length, uint64_t hash) {
    for (size_t i = hash & m->mask;; i = (i + 1) & m->mask) {
        uint32_t slot = m->slots[i];
        if (!slot) return NULL;
        Entry *e = &m->entries[slot - 1];
        if (e->hash == hash && e->key_length == length && memcmp(m->keys.data + e->key_offset, key, length) == 0) return e;
    }
}

static inline int map_rehash(BytesMap *m) {
    size_t capacity = (m->mask + 1) * 2;
    uint32_t *slots = calloc(capacity, sizeof(uint32_t));
    if (!slots) return -1;
    for (size_t k = 0; k < m->n; k++) {
        size_t i = m->entries[k].hash & (capacity - 1);
        while (slots[i]) i = (i + 1) & (capacity - 1);
        slots[i] = (uint32_t)(k + 1);
    }
    free(m->slots);
    m->slots = slots;
    m->mask = capacity - 1;
    return 0;
}

/* Insert a key known to be absent; NULL when out of memory. */
static inline Entry *map_insert(BytesMap *m, const uint8_t *key, size_t length, uint64_t hash, uint64_t value) {
    if (2 * (m->n + 1) > m->mask + 1 && map_rehash(m)) return NULL;
    if (m->n >= UINT32_MAX - 1) return NULL;
    if (grow((void **)&m->entries, &m->cap, m->n + 1, sizeof(Entry))) return NULL;
    size_t offset = m->keys.n;
    if (bytes_push_n(&m->keys, key, length)) return NULL;
    Entry *e = &m->entries[m->n];
    *e = (Entry){hash, value, offset, length};
    size_t i = hash & m->mask;
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = (uint32_t)(++m->n);
    return e;
}

#endif
