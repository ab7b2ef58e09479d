/*
 * fuzz_delta.c - libFuzzer target: the delta reader and all-or-nothing apply
 * (delta_fuzz_one: a built-in three-tensor model; each input is tried as
 * given and again with its checksum made valid, so mutations reach the
 * fields behind the checksum). Aborts if a rejected delta changed a weight
 * bit or an accepted one left the weights off their recorded hashes. Seed:
 * tests/fuzz/corpus/delta/seed.delta (delta_fuzz_seed's container).
 */
#include "delta.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    delta_fuzz_one(data, size); /* aborts on a violated invariant */
    return 0;                   /* libFuzzer reserves other values */
}
