/*
 * fuzz_safetensors.c - libFuzzer target: the safetensors header/offset
 * validator on arbitrary bytes. Any crash, overread (ASan) or UB fails.
 */
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1); /* exact size: ASan catches overreads */
    memcpy(copy, data, size);
    SafeTensors st = {0};
    Err e = {0};
    if (safetensors_parse(&st, 0, copy, size, "fuzz", &e) == 0) {
        for (int i = 0; i < st.n; i++) {
            volatile uint8_t sink = 0;
            if (st.t[i].nbytes) sink ^= st.t[i].data[0] ^ st.t[i].data[st.t[i].nbytes - 1];
            (void)sink;
        }
    }
    for (int i = 0; i < st.n; i++) free(st.t[i].name);
    free(st.t);
    free(copy);
    return 0;
}
