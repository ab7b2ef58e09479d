/*
 * safetensors.h - read-only view of a Hugging Face safetensors checkpoint:
 * one file, or a directory with model.safetensors or sharded files listed in
 * model.safetensors.index.json. Files are memory-mapped MAP_PRIVATE (writes
 * to a mapping stay in this process: the sampler patches weights in place
 * without touching the files on disk), or, for the weights a server serves,
 * read into private anonymous memory (safetensors_open_private): a file
 * mapping follows later writes to its file (clean pages are re-read from it,
 * and truncating it unmaps even patched pages: SIGBUS), so serving from a
 * mapping would let a trainer overwriting the checkpoint in place change or
 * crash the served model.
 *
 * Every header field is validated before use: a truncated or lying file is
 * an error naming the file and the tensor, never a crash. This is a request
 * path (the delta reader and the fuzzers use it), so errors come back as Err.
 *
 * Not here: writing checkpoints (trainer/), model semantics (model.c).
 */
#ifndef SAMPLER_SAFETENSORS_H
#define SAMPLER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "dtype.h"

#define ST_MAX_DIMS 8

typedef struct StTensor {
    char *name;
    Dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    uint8_t *data;   /* [nbytes] into the mapping; may be unaligned for its dtype */
    size_t nbytes;
    int file;        /* index into SafeTensors.paths */
} StTensor;

typedef struct SafeTensors {
    int n_files;
    char **paths;    /* [n_files] */
    uint8_t **maps;  /* [n_files] mmap base (a file mapping or private anonymous memory) */
    size_t *sizes;   /* [n_files] file sizes */
    int n;
    StTensor *t;     /* [n] sorted by name */
} SafeTensors;

/* Open a .safetensors file or a model directory. 0 on success; on error,
 * returns <0, fills err and leaves *out NULL. */
int safetensors_open(SafeTensors **out, const char *path, Err *err);
/* How the reader opens each file it reads (the index, every shard): returns a
 * read-only fd >= 0, or <0 with err filled. The reload endpoint passes one
 * that refuses files resolving outside --reload-root; safetensors_open opens
 * paths as they are. */
typedef struct StOpener {
    int (*open)(void *ctx, const char *path, Err *err);
    void *ctx;
    int copy;  /* 1: read each file into private memory instead of mapping it */
} StOpener;
int safetensors_open_with(SafeTensors **out, const char *path, const StOpener *op, Err *err);
/* safetensors_open, each file read whole into private anonymous memory (its
 * size in RAM, the same as a fully touched mapping): later writes to the files
 * cannot reach the result; a file that changes size while read is an error. */
int safetensors_open_private(SafeTensors **out, const char *path, Err *err);
/* Parse one in-memory safetensors image (header + data). The buffer must
 * outlive the result; used by the fuzzer and the file opener. */
int safetensors_parse(SafeTensors *st, int file, uint8_t *buf, size_t size, const char *label, Err *err);
const StTensor *safetensors_get(const SafeTensors *st, const char *name);
void safetensors_free(SafeTensors *st);

#endif
