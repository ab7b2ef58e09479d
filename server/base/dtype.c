/*
 * dtype.c - names and sizes of checkpoint element types (see dtype.h).
 */
#include "dtype.h"

static const struct { const char *name; int size; } g_dt[DT_COUNT] = {
    [DT_F32] = {"F32", 4},     [DT_F16] = {"F16", 2},         [DT_BF16] = {"BF16", 2},
    [DT_F8_E4M3] = {"F8_E4M3", 1}, [DT_F8_E5M2] = {"F8_E5M2", 1}, [DT_I64] = {"I64", 8},
    [DT_I32] = {"I32", 4},     [DT_I16] = {"I16", 2},         [DT_I8] = {"I8", 1},
    [DT_U8] = {"U8", 1},       [DT_BOOL] = {"BOOL", 1},       [DT_F64] = {"F64", 8},
};

int dtype_size(Dtype t) { return (t >= 0 && t < DT_COUNT) ? g_dt[t].size : 0; }

const char *dtype_name(Dtype t) { return (t >= 0 && t < DT_COUNT) ? g_dt[t].name : "?"; }

int dtype_from_name(const char *name, Dtype *out) {
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(name, g_dt[i].name) == 0) { *out = (Dtype)i; return 0; }
    return -1;
}
