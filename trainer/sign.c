/*
 * sign.c - `trainer sign step.delta --key-file K`: write step.delta.sig, the
 * HMAC-SHA256 signature (delta_sign.h) a sampler started with
 * --delta-key-file K checks before applying `--delta step.delta`. The delta
 * must parse (so a truncated file is not signed); the sidecar is written
 * atomically. `trainer push --key-file K` signs on the fly instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "delta.h"
#include "delta_sign.h"
#include "trainer.h"

int cmd_sign(int argc, char **argv) {
    const char *path = NULL, *key_file = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--key-file") == 0 && i + 1 < argc) key_file = argv[++i];
        else if (strcmp(a, "-o") == 0 && i + 1 < argc) out = argv[++i];
        else if (a[0] != '-' && !path) path = a;
        else CHECK(0, "trainer sign: unknown or incomplete argument '%s'", a);
    }
    CHECK(path && key_file, "usage: trainer sign step.delta --key-file K [-o step.delta.sig]");
    size_t size, nk;
    uint8_t *buf = read_file(path, &size), *key;
    DeltaFile *df;
    Err err = {0};
    CHECK(delta_parse(&df, buf, size, &err) == 0, "%s: %s (not signed)", path, err.msg);
    CHECK(delta_key_load(key_file, &key, &nk, &err) == 0, "--key-file: %s", err.msg);
    char sig[DELTA_SIG_CHARS + 2], dst[4096];
    CHECK(delta_sign(key, nk, buf, size, sig, &err) == 0, "%s: %s", path, err.msg);
    strcat(sig, "\n");
    if (!out) {
        snprintf(dst, sizeof dst, "%s.sig", path);
        out = dst;
    }
    write_file_atomic(out, sig, strlen(sig));
    printf("signed %s (version %llu -> %llu): %s", path, (unsigned long long)df->h.base_version,
           (unsigned long long)df->h.target_version, out);
    printf("\n");
    explicit_bzero(key, nk);
    free(key);
    delta_file_free(df);
    free(buf);
    return 0;
}
