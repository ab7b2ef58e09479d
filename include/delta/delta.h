/*
 * delta.h - sparse weight deltas: the versioned container (docs/delta-format.md),
 * its writer (the trainer's `diff`), its validating reader, and the in-place,
 * all-or-nothing application to a running model's weights.
 *
 * Apply is independent of HTTP and of where weights live: the caller gives a
 * lookup callback that maps a checkpoint tensor name to its storage (model
 * weights, a SafeTensors mapping, plain test buffers). Two phases:
 *   delta_prepare: parse, validate every field, check fingerprint and base
 *     version, decompress, bound-check every position and check that the
 *     result would hash to the delta's per-tensor XXH3. Reads weights only,
 *     so it can run while the engine keeps serving.
 *   delta_commit: scatter the new values (saving the old ones), re-hash every
 *     updated tensor, restore everything on any mismatch. This is the only
 *     part that needs the engine paused. Afterwards the weights are either
 *     exactly at the target version or bit-identical to before.
 * The caller serializes prepare/commit against each other and against
 * readers of WeightVersion (one admin mutex).
 *
 * Device backends and quantized samplers: lookup returns the host BF16
 * master (what commit patches and hashes); the touched hook then gets each
 * updated tensor's touched element indices, to scatter those elements to the
 * device copy or re-quantize the blocks that contain them. A backend may
 * instead read the decoded update with delta_plan_tensor (before commit:
 * positions and new values) and scatter on the device itself.
 *
 * Not here: HTTP (server), checkpoint I/O (trainer/).
 */
#ifndef SAMPLER_DELTA_H
#define SAMPLER_DELTA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "dtype.h"
#include "safetensors.h"

#define DELTA_MAGIC "SMPLDELT"
#define DELTA_FORMAT_VERSION 1u
#define DELTA_HEADER_BYTES 64
#define DELTA_TRAILER_BYTES 8
#define DELTA_MAX_NAME 1024
#define DELTA_MAX_DIMS 8
/* Versions are at most 2^62 (the range of the sampler's --weight-version): they stay
 * exact in JSON's signed 64-bit integers, and a delta claiming more is refused (400). */
#define DELTA_VERSION_MAX (1ull << 62)
/* Header flags. VERSION_ONLY: the container has no tensor records on purpose
 * (a step that changed no bit moves only the version); a container without
 * records must set it, and one with records must not. Other bits: refused. */
#define DELTA_FLAG_VERSION_ONLY 1u
#define DELTA_FLAGS_KNOWN DELTA_FLAG_VERSION_ONLY

/* Encodings: SPARSE carries the new raw values of the changed elements;
 * SPARSE_XOR carries new XOR base (bit-exact too, compresses ~2x better
 * because steps mostly flip low mantissa bits); DENSE the whole new tensor. */
enum { DELTA_SPARSE = 0, DELTA_DENSE = 1, DELTA_SPARSE_XOR = 2 };

typedef struct DeltaHeader {
    uint32_t format_version;
    uint32_t flags;          /* DELTA_FLAG_*: VERSION_ONLY exactly when n_tensors == 0 */
    uint64_t fingerprint;    /* model lineage: XXH3 of the version-0 checkpoint (see doc) */
    uint64_t base_version;
    uint64_t target_version; /* > base_version, <= DELTA_VERSION_MAX */
    uint32_t n_tensors;
} DeltaHeader;

/* One tensor of a parsed container. Pointers point into the container buffer
 * (payload) or are owned by the DeltaFile (name). */
typedef struct DeltaEntry {
    char *name;              /* NUL-terminated copy */
    Dtype dtype;
    int encoding;            /* DELTA_SPARSE, DELTA_DENSE or DELTA_SPARSE_XOR */
    int ndim;
    int64_t shape[DELTA_MAX_DIMS];
    int64_t numel;
    int64_t n_changed;       /* elements whose bits differ from the base */
    uint64_t raw_bytes;      /* payload size after zstd decompression */
    uint64_t comp_bytes;
    uint64_t hash_after;     /* XXH3-64 of the whole tensor after the update */
    const uint8_t *payload;  /* [comp_bytes] zstd frame */
} DeltaEntry;

typedef struct DeltaFile {
    DeltaHeader h;
    int n;
    DeltaEntry *e;           /* [n] strictly sorted by name */
    uint64_t checksum;
} DeltaFile;

/* Validate the container structure (magic, version, flags, version bounds,
 * sizes, checksum, every record field against the container size, sorted
 * unique names). Does not decompress. The buffer must outlive the result.
 * 400 on any defect. */
int delta_parse(DeltaFile **out, const uint8_t *buf, size_t size, Err *err);
void delta_file_free(DeltaFile *f);

/* A decoded payload. pos is NULL for dense (every element). */
typedef struct DeltaDecoded {
    int64_t n;               /* values: n_changed (sparse) or numel (dense) */
    int64_t *pos;            /* [n] strictly increasing, < numel; sparse only */
    uint8_t *vals;           /* [n * dtype_size] natural little-endian layout: new values,
                                or XOR masks against the base while xor is set */
    int xor;                 /* vals are masks (SPARSE_XOR before delta_prepare resolves them) */
} DeltaDecoded;

/* Decompress and decode entry e, checking the zstd frame, every position
 * against e->numel, and that no XOR mask is zero. Allocations are bounded by
 * e->numel (which the caller has checked against the model) and the container. */
int delta_decode(const DeltaEntry *e, DeltaDecoded *out, Err *err);
void delta_decoded_free(DeltaDecoded *d);
/* Every check of a parsed container that needs no base weights: delta_decode
 * of every payload (what delta_prepare runs on each record before it compares
 * against the live weights). `trainer inspect` runs it. 400 (or 507) naming the
 * first bad tensor, in container order. */
int delta_check_payloads(const DeltaFile *f, int n_threads, Err *err);

/* ---- writer ---- */

typedef struct DeltaRecord {
    char *name;
    Dtype dtype;
    int encoding;
    int ndim;
    int64_t shape[DELTA_MAX_DIMS];
    int64_t numel, n_changed;
    uint64_t raw_bytes, hash_after;
    uint8_t *payload;        /* [comp_bytes] owned */
    size_t comp_bytes;
} DeltaRecord;

/* Diff one tensor bit by bit. Thread-safe. On success out->n_changed == 0
 * means "unchanged" (no payload; leave it out of the container). Sparse is
 * chosen when its uncompressed payload is smaller than the dense one; with
 * xor_values the sparse values are new XOR old (DELTA_SPARSE_XOR). */
int delta_encode_tensor(DeltaRecord *out, const char *name, Dtype dt, int ndim, const int64_t *shape,
                        const void *old_data, const void *new_data, int level, int xor_values, Err *err);
void delta_record_free(DeltaRecord *r);
/* Serialize a container (records sorted by name here). Returns a malloc'ed
 * buffer of *size bytes. */
uint8_t *delta_serialize(const DeltaHeader *h, DeltaRecord *recs, int n, size_t *size);

/* ---- model lineage and per-tensor hashes ---- */

/* What GET /admin/v1/weights reports. Names sorted (strcmp). */
typedef struct WeightVersion {
    uint64_t version;
    uint64_t fingerprint;
    int n;
    char **names;            /* [n] */
    uint64_t *hash;          /* [n] XXH3-64 of each tensor's bytes */
    Dtype *dtype;            /* [n] checkpoint dtype */
    int *ndim;               /* [n] */
    int64_t (*shape)[DELTA_MAX_DIMS]; /* [n] */
} WeightVersion;

/* Hash every tensor of a checkpoint; fingerprint computed from it (valid as
 * the lineage fingerprint when the checkpoint is version 0: the caller may
 * override version/fingerprint afterwards, e.g. from start-up flags). */
WeightVersion *weight_version_from_safetensors(const SafeTensors *st, int n_threads);
void weight_version_free(WeightVersion *wv);
/* Index of name, or -1. */
int weight_version_find(const WeightVersion *wv, const char *name);
/* {"version": N, "model_fingerprint": "hex16", "tensors": {name: "hex16"}}; malloc'ed. */
char *weight_version_json(const WeightVersion *wv);
/* The model fingerprint of a checkpoint (see docs/delta-format.md). */
uint64_t delta_fingerprint(const SafeTensors *st, const uint64_t *tensor_hash);
/* XXH3-64, seed 0, as used everywhere in the format. */
uint64_t delta_hash(const void *data, size_t n);

/* ---- apply ---- */

/* Storage of a weight tensor by checkpoint name, or NULL if the model has no
 * such tensor. Must return the same pointer while a plan is alive. */
typedef void *(*DeltaLookupFn)(void *ctx, const char *name, Dtype *dt, int64_t *numel);
/* Called during commit, after the weights verified, once per updated tensor:
 * idx lists the touched element indices ([n_idx] increasing), or is NULL when
 * every element was rewritten (dense; n_idx == numel). For derived copies of
 * the weights (quantized blocks, a device copy): it must recompute them from
 * data alone, so that running it again after a restore restores them too.
 * Returns 0, or <0 with err filled: then commit restores every weight, calls
 * the hook again for the tensors already done (now at their old values) and
 * fails with that error. */
typedef int (*DeltaTouchedFn)(void *ctx, const char *name, void *data, Dtype dt, int64_t numel,
                              const int64_t *idx, int64_t n_idx, Err *err);

typedef struct DeltaTarget {
    DeltaLookupFn lookup;
    void *ctx;
    DeltaTouchedFn touched;  /* optional */
    void *touched_ctx;
    int n_threads;           /* for decode and hashing; <=1: single-threaded */
    int skip_verify_after;   /* 1: skip commit's re-hash (prepare already checked it) */
} DeltaTarget;

typedef struct DeltaResult {
    int noop;                /* 1: the delta was already applied */
    uint64_t version;        /* version after the call (current version on error) */
    uint64_t fingerprint;
    int tensors_updated;
    int64_t elements_updated;
} DeltaResult;

typedef struct DeltaPlan DeltaPlan;

/* Phase 1 (no weight is written). Errors: 400 malformed or lying container,
 * 409 wrong base version or fingerprint (wv->version is the current one),
 * 422 the delta does not fit the model (missing tensor, dtype, size) or its
 * result would not match its hashes. On a replay (target == current and
 * matching hashes) succeeds with a no-op plan. */
int delta_prepare(DeltaPlan **out, const uint8_t *buf, size_t size, const DeltaTarget *tgt,
                  const WeightVersion *wv, Err *err);
/* Phase 2 (engine paused). Re-checks the base version, applies, verifies,
 * updates wv. On error every touched element is restored. */
int delta_commit(DeltaPlan *p, const DeltaTarget *tgt, WeightVersion *wv, DeltaResult *res, Err *err);
void delta_plan_free(DeltaPlan *p);
/* prepare + commit. */
int delta_apply(const uint8_t *buf, size_t size, const DeltaTarget *tgt, WeightVersion *wv,
                DeltaResult *res, Err *err);

/* Whole-tensor replacement (a full reload): one new tensor's bytes. */
typedef struct DeltaReplace {
    const char *name;
    const void *data;        /* [numel * dtype_size(dtype)] the new bytes (e.g. in a checkpoint mapping) */
    Dtype dtype;
    int ndim;
    const int64_t *shape;    /* [ndim] */
    int64_t numel;
} DeltaReplace;

/* Phase 1 of a reload (no weight is written; run it while serving): a plan
 * that moves wv->version to target_version and makes every listed tensor
 * equal to its new bytes, committed, verified and undone by delta_commit like
 * any delta (delta_replace.c). Tensors whose bytes equal the live ones leave
 * the plan; each other one holds min(n_changed * (8 + es), numel * es) bytes
 * (what differs, or the whole tensor), which after the commit's swap are the
 * overwritten values. Errors: 400 target_version not above wv->version or
 * above DELTA_VERSION_MAX, 422 a tensor does not fit the model (name, dtype,
 * shape, not patchable in place), 409 the new bytes changed while being read,
 * 507 out of memory. */
int delta_prepare_replace(DeltaPlan **out, const DeltaReplace *r, int n, uint64_t target_version,
                          const DeltaTarget *tgt, const WeightVersion *wv, Err *err);

/* For device backends: the decoded update of plan tensor i (0 <= i < n). */
int delta_plan_count(const DeltaPlan *p);
const char *delta_plan_tensor(const DeltaPlan *p, int i, Dtype *dt, int64_t *numel,
                              const DeltaDecoded **upd);
const DeltaHeader *delta_plan_header(const DeltaPlan *p);

/* POST /admin/v1/weights/delta in one call (no pause between the phases):
 * returns the HTTP status (200, or the error's 400/409/422/500/507) and sets
 * *json to the malloc'ed response body. */
int delta_http_post(const uint8_t *body, size_t n, const DeltaTarget *tgt, WeightVersion *wv, char **json);

/* HTTP bodies of the admin endpoints (malloc'ed JSON): 200 after an apply,
 * and the error body (409 carries current_version). */
char *delta_result_json(const DeltaResult *r);
char *delta_error_json(const Err *e, const WeightVersion *wv);

/* Lookup over a SafeTensors mapping (ctx = SafeTensors *). */
void *delta_lookup_safetensors(void *ctx, const char *name, Dtype *dt, int64_t *numel);
/* Lookup over a loaded model (ctx = Model *, via model_tensor; server/delta_model.c). */
void *delta_lookup_model(void *ctx, const char *name, Dtype *dt, int64_t *numel);
/* Touched hook over a loaded model (ctx = Model *): re-quantizes the touched
 * blocks of FP8/NVFP4 linears whose BF16 master is data (quant_*_requant);
 * BF16 weights need nothing. */
int delta_model_requant(void *ctx, const char *name, void *data, Dtype dt, int64_t numel, const int64_t *idx,
                        int64_t n_idx, Err *err);

/* Run fn(ctx, i) for i in [0, n) on up to n_threads threads, dynamically. */
void delta_par_for(int n, int n_threads, void (*fn)(void *ctx, int i), void *ctx);

/* Element helpers shared by the encoder and apply: constant-size copies the
 * compiler turns into single loads/stores. */
static inline int delta_elem_ne(const uint8_t *a, const uint8_t *b, int es) {
    switch (es) {
    case 1: return *a != *b;
    case 2: { uint16_t x, y; memcpy(&x, a, 2); memcpy(&y, b, 2); return x != y; }
    case 4: { uint32_t x, y; memcpy(&x, a, 4); memcpy(&y, b, 4); return x != y; }
    case 8: { uint64_t x, y; memcpy(&x, a, 8); memcpy(&y, b, 8); return x != y; }
    default: return memcmp(a, b, (size_t)es) != 0;
    }
}

static inline void delta_elem_cpy(uint8_t *d, const uint8_t *s, int es) {
    switch (es) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, (size_t)es);
    }
}

/* The fuzz target: parse and (on success) apply to a small built-in model, the
 * input as given and again with its checksum made valid. Aborts if a rejected
 * container changed a weight bit or an accepted one left the weights off its
 * recorded hashes; else returns how many of the (one or two) tries were
 * accepted. */
int delta_fuzz_one(const uint8_t *data, size_t size);
/* A valid container for the fuzzer's built-in model (seed corpus); malloc'ed. */
uint8_t *delta_fuzz_seed(size_t *size);

#endif
