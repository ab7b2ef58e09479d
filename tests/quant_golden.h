/*
 * quant_golden.h - read the raw little-endian golden files that
 * scripts/make_quant_goldens.py writes under tests/data/quant/ (shared by the
 * tests/test_quant_*.c binaries; not a test itself).
 */
#ifndef SAMPLER_QUANT_GOLDEN_H
#define SAMPLER_QUANT_GOLDEN_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QG_DIR "tests/data/quant/"

/* Whole file into a malloc'd buffer; *n bytes. Exits when missing: the
 * goldens are committed, so a missing file is a broken checkout. */
static inline void *qg_read(const char *name, size_t *n) {
    char path[512];
    snprintf(path, sizeof path, QG_DIR "%s", name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "missing golden %s (run from the repo root; regenerate with "
                        "python3 scripts/make_quant_goldens.py)\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(sz ? (size_t)sz : 1);
    if (!p || fread(p, 1, (size_t)sz, f) != (size_t)sz) { fprintf(stderr, "short read %s\n", path); exit(2); }
    fclose(f);
    *n = (size_t)sz;
    return p;
}

/* Read and insist on the expected size in bytes. */
static inline void *qg_read_n(const char *name, size_t want) {
    size_t n;
    void *p = qg_read(name, &n);
    if (n != want) { fprintf(stderr, "golden %s: %zu bytes, expected %zu\n", name, n, want); exit(2); }
    return p;
}

static inline uint32_t qg_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Deterministic test data (xorshift64*, Box-Muller). */
static uint64_t qg_rng = 0x9e3779b97f4a7c15ull;
static inline double qg_uniform(void) {
    qg_rng ^= qg_rng >> 12; qg_rng ^= qg_rng << 25; qg_rng ^= qg_rng >> 27;
    return ((qg_rng * 2685821657736338717ull) >> 11) * 0x1.0p-53;
}
static inline double qg_normal(void) {
    double u = qg_uniform(), v = qg_uniform();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

#endif
