/*
 * fuzz_delta.c - libFuzzer driver for the delta reader and apply path
 * (delta_fuzz_one in server/delta_fuzz.c). Not part of the ctest suite
 * (tests/test_delta.c runs the same target over mutated seeds); build and
 * run by hand with clang:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude tests/fuzz/fuzz_delta.c \
 *     server/delta_*.c server/check.c server/dtype.c server/safetensors.c \
 *     $(pkg-config --cflags --libs libzstd libxxhash jansson) -lpthread -o /tmp/fuzz_delta
 *   mkdir -p /tmp/corpus && /tmp/fuzz_delta -seed_corpus_from_delta=1 /tmp/corpus -max_total_time=60
 *
 * (server/delta_model.c is left out: it needs model.c.) The first run writes
 * the built-in seed container into the corpus directory.
 */
#include <stdio.h>
#include <stdlib.h>

#include "delta.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    int want = 0;
    const char *dir = NULL;
    for (int i = 1; i < *argc; i++) {
        if (strcmp((*argv)[i], "-seed_corpus_from_delta=1") == 0) want = 1;
        else if ((*argv)[i][0] != '-' && !dir) dir = (*argv)[i];
    }
    if (want && dir) {
        size_t n;
        uint8_t *seed = delta_fuzz_seed(&n);
        char path[4096];
        snprintf(path, sizeof path, "%s/seed.delta", dir);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(seed, 1, n, f);
            fclose(f);
        }
        free(seed);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return delta_fuzz_one(data, size); }
