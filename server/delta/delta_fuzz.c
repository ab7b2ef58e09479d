/*
 * delta_fuzz.c - the fuzz target of the delta reader and apply path: a tiny
 * built-in model (three tensors of different dtypes), rebuilt on every call,
 * and a seed container that updates it with all three encodings. The target aborts if a rejected
 * container changed any weight bit, or an accepted one left the weights off
 * the hashes it recorded. Not a test by itself: tests/test_delta.c and a
 * libFuzzer driver call delta_fuzz_one.
 */
#include "delta.h"

#include <stdlib.h>

enum { NA = 16 * 8, NB = 5, NC = 7 };

typedef struct FuzzModel {
    uint16_t a[NA]; /* [16, 8] bf16 */
    float b[NB];    /* [5] f32 */
    uint8_t c[NC];  /* [7] u8 */
    StTensor t[3];
    SafeTensors st;
} FuzzModel;

static void fuzz_model_init(FuzzModel *m, int step) {
    uint32_t x = 12345u;
    for (int i = 0; i < NA; i++) {
        x = x * 1664525u + 1013904223u;
        m->a[i] = f32_to_bf16((float)((int)(x >> 16) - 32768) / 32768.0f);
    }
    for (int i = 0; i < NB; i++) m->b[i] = (float)i * 0.25f - 0.5f;
    for (int i = 0; i < NC; i++) m->c[i] = (uint8_t)(i * 37);
    if (step) { /* version 1: a few elements of a (sparse-xor), all of b (dense), one of c (sparse) */
        m->c[2] ^= 0x5;
        m->a[0] ^= 1;
        m->a[3] ^= 0x40;
        m->a[NA - 1] ^= 0x8000;
        for (int i = 0; i < NB; i++) m->b[i] += 1.0f;
    }
    StTensor t[3] = {
        {.name = "a.weight", .dtype = DT_BF16, .ndim = 2, .shape = {16, 8}, .numel = NA,
         .data = (uint8_t *)m->a, .nbytes = sizeof m->a},
        {.name = "b.bias", .dtype = DT_F32, .ndim = 1, .shape = {NB}, .numel = NB, .data = (uint8_t *)m->b,
         .nbytes = sizeof m->b},
        {.name = "c.mask", .dtype = DT_U8, .ndim = 1, .shape = {NC}, .numel = NC, .data = m->c, .nbytes = NC},
    };
    memcpy(m->t, t, sizeof t);
    m->st = (SafeTensors){.n = 3, .t = m->t};
}

uint8_t *delta_fuzz_seed(size_t *size) {
    static FuzzModel m0, m1;
    fuzz_model_init(&m0, 0);
    fuzz_model_init(&m1, 1);
    WeightVersion *wv = weight_version_from_safetensors(&m0.st, 1);
    DeltaRecord r[3];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        Err err;
        CHECK(delta_encode_tensor(&r[n], m0.t[i].name, m0.t[i].dtype, m0.t[i].ndim, m0.t[i].shape, m0.t[i].data,
                                  m1.t[i].data, 3, i == 0, &err) == 0, "%s", err.msg);
        if (r[n].n_changed) n++;
    }
    DeltaHeader h = {.fingerprint = wv->fingerprint, .base_version = 0, .target_version = 1};
    uint8_t *buf = delta_serialize(&h, r, n, size);
    for (int i = 0; i < n; i++) delta_record_free(&r[i]);
    weight_version_free(wv);
    return buf;
}

static uint64_t all_hash(const FuzzModel *m) {
    return delta_hash(m->a, sizeof m->a) ^ (delta_hash(m->b, sizeof m->b) * 3) ^ (delta_hash(m->c, NC) * 5);
}

/* 1 when the container was accepted, 0 when rejected; aborts on a violated invariant. */
static int fuzz_apply(const uint8_t *data, size_t size) {
    static FuzzModel m;
    fuzz_model_init(&m, 0);
    WeightVersion *wv = weight_version_from_safetensors(&m.st, 1);
    uint64_t before = all_hash(&m), fp = wv->fingerprint;
    DeltaTarget tgt = {.lookup = delta_lookup_safetensors, .ctx = &m.st};
    DeltaResult res;
    Err err;
    int rc = delta_apply(data, size, &tgt, wv, &res, &err);
    if (rc != 0) {
        if (all_hash(&m) != before || wv->version != 0 || wv->fingerprint != fp) abort();
    } else {
        for (int i = 0; i < 3; i++)
            if (delta_hash(m.t[i].data, m.t[i].nbytes) != wv->hash[i]) abort();
    }
    weight_version_free(wv);
    return rc == 0;
}

/* The input as given, and again with its checksum made valid so mutations
 * reach the fields behind it. */
int delta_fuzz_one(const uint8_t *data, size_t size) {
    int accepted = fuzz_apply(data, size);
    if (size >= DELTA_HEADER_BYTES + DELTA_TRAILER_BYTES) {
        uint8_t *c = malloc(size);
        if (!c) abort();
        memcpy(c, data, size);
        uint64_t h = delta_hash(c, size - 8);
        for (int i = 0; i < 8; i++) c[size - 8 + i] = (uint8_t)(h >> (8 * i));
        accepted += fuzz_apply(c, size);
        free(c);
    }
    return accepted;
}
