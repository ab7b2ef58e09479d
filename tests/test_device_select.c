/*
 * test_device_select.c - the start-up device choice without a GPU.
 *
 * Binary/device matching follows NVIDIA's compatibility rules (CUDA C++
 * Programming Guide, "Binary Compatibility" and "Feature Set Compiler
 * Targets"): sm_80 SASS runs on every 8.x device; arch-specific sm_90a,
 * sm_100a, sm_103a SASS runs only on exactly 9.0, 10.0, 10.3. In sampler-cpu
 * the CUDA entry points are absent, so device_select must choose the CPU.
 */
#include <string.h>

#include "device_select.h"
#include "test.h"

static void check_pair(int bin, int major, int minor, const char *want_in_msg) {
    Err err = {0};
    int rc = device_check_binary(bin, major, minor, &err);
    if (!want_in_msg) {
        T_ASSERT(rc == 0, "sm%d binary on %d.%d refused: %s", bin, major, minor, err.msg);
        return;
    }
    T_ASSERT(rc != 0, "sm%d binary on %d.%d accepted", bin, major, minor);
    T_ASSERT(strstr(err.msg, want_in_msg) != NULL, "sm%d on %d.%d: message '%s' lacks '%s'", bin, major, minor,
             err.msg, want_in_msg);
}

int main(void) {
    /* matches */
    check_pair(80, 8, 0, NULL);
    check_pair(80, 8, 6, NULL);
    check_pair(80, 8, 9, NULL);
    check_pair(90, 9, 0, NULL);
    check_pair(100, 10, 0, NULL);
    check_pair(103, 10, 3, NULL);
    /* mismatches name the binary that fits */
    check_pair(80, 9, 0, "run sampler-sm90");
    check_pair(90, 8, 0, "run sampler-sm80");
    check_pair(90, 10, 0, "run sampler-sm100");
    check_pair(100, 10, 3, "run sampler-sm103");
    check_pair(103, 10, 0, "run sampler-sm100");
    check_pair(100, 9, 0, "run sampler-sm90");
    /* devices no binary targets */
    check_pair(90, 7, 5, "sampler-cpu");
    check_pair(100, 12, 0, "sampler-cpu");
    T_ASSERT(device_binary_for(12, 0) == NULL, "sm_120 has no binary");
    T_ASSERT(device_binary_for(9, 0) && !strcmp(device_binary_for(9, 0), "sampler-sm90"), "sm_90");

    Precision p;
    T_ASSERT(precision_parse("bf16", &p) == 0 && p == PREC_BF16, "bf16");
    T_ASSERT(precision_parse("fp8", &p) == 0 && p == PREC_FP8, "fp8");
    T_ASSERT(precision_parse("nvfp4", &p) == 0 && p == PREC_NVFP4, "nvfp4");
    T_ASSERT(precision_parse("fp16", &p) != 0 && precision_parse(NULL, &p) != 0, "unknown precisions refused");

    /* This test binary has no CUDA code: always the CPU backend. */
    DeviceChoice d;
    Err err = {0};
    T_ASSERT(device_select(&d, 0, PREC_BF16, &err) == 0 && d.gpu == 0 && d.binary_sm == 0, "cpu chosen: %s",
             err.msg);
    T_ASSERT(device_select(&d, 1, PREC_FP8, &err) == 0 && d.gpu == 0 && d.precision == PREC_FP8, "forced cpu");
    return T_DONE();
}
