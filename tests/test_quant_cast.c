/*
 * test_quant_cast.c - FP8 E4M3 casts bit-exact against PyTorch, E2M1
 * against Model Optimizer's _cast_fp4, on random, tie, edge and special
 * inputs (tests/data/quant/cast_*, scripts/make_quant_goldens.py).
 */
#include <math.h>

#include "quant.h"
#include "quant_golden.h"
#include "test.h"

static void test_encode(void) {
    size_t nb;
    float *x = qg_read("cast_in.f32", &nb);
    size_t n = nb / 4;
    uint8_t *e4 = qg_read_n("cast_e4m3.u8", n);
    uint8_t *e2 = qg_read_n("cast_e2m1.u8", n);
    int bad4 = 0, bad2 = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t a = quant_f32_to_e4m3(x[i]), c = quant_f32_to_e2m1(x[i]);
        if (a != e4[i] && bad4++ < 5) fprintf(stderr, "e4m3(%a [0x%08x]) = 0x%02x, torch 0x%02x\n", x[i], qg_bits(x[i]), a, e4[i]);
        if (c != e2[i] && bad2++ < 5) fprintf(stderr, "e2m1(%a) = 0x%x, modelopt 0x%x\n", x[i], c, e2[i]);
    }
    T_ASSERT(n > 50000, "%zu cast inputs", n);
    T_ASSERT(bad4 == 0, "%d e4m3 mismatches of %zu", bad4, n);
    T_ASSERT(bad2 == 0, "%d e2m1 mismatches of %zu", bad2, n);
    free(x); free(e4); free(e2);
}

/* Every byte decodes to torch's f32 bits (NaN payloads included). */
static void test_decode(void) {
    float *d4 = qg_read_n("e4m3_all.f32", 1024);
    float *d2 = qg_read_n("e2m1_all.f32", 64);
    int bad4 = 0, bad2 = 0;
    for (int i = 0; i < 256; i++) {
        if (qg_bits(quant_e4m3_to_f32((uint8_t)i)) != qg_bits(d4[i]) && bad4++ < 5)
            fprintf(stderr, "e4m3 0x%02x -> 0x%08x, torch 0x%08x\n", i, qg_bits(quant_e4m3_to_f32((uint8_t)i)), qg_bits(d4[i]));
    }
    /* Model Optimizer's table has +0 for code 8; we decode it as -0 (IEEE): equal values. */
    for (int i = 0; i < 16; i++) bad2 += quant_e2m1_to_f32((uint8_t)i) != d2[i];
    T_ASSERT(bad4 == 0, "%d e4m3 decode mismatches", bad4);
    T_ASSERT(bad2 == 0, "%d e2m1 decode mismatches", bad2);
    /* Round trip: every non-NaN byte survives decode + encode. */
    int rt = 0;
    for (int i = 0; i < 256; i++) {
        if ((i & 0x7f) != 0x7f) rt += quant_f32_to_e4m3(quant_e4m3_to_f32((uint8_t)i)) != i;
    }
    T_ASSERT(rt == 0, "%d round-trip failures", rt);
    free(d4); free(d2);
}

int main(void) {
    test_encode();
    test_decode();
    return T_DONE();
}
