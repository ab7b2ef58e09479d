/*
 * delta_format.c - the delta container on the wire (docs/delta-format.md):
 * validating parser, payload decoder, tensor diff/encoder and serializer.
 *
 * Every length read from a container is checked against the bytes left in it
 * before use; allocations are bounded by the container size or by a tensor
 * size the caller has checked against the model. Not here: applying (delta_apply.c).
 */
#include "delta.h"

#include <stdlib.h>
#include <xxhash.h>
#include <zstd.h>

uint64_t delta_hash(const void *data, size_t n) { return XXH3_64bits(data, n); }

/* ---- little-endian cursor ---- */

typedef struct Cur {
    const uint8_t *p;
    size_t left;
} Cur;

static int cur_take(Cur *c, size_t n, const uint8_t **out) {
    if (c->left < n) return -1;
    *out = c->p;
    c->p += n;
    c->left -= n;
    return 0;
}

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int cur_u(Cur *c, int n, uint64_t *v) {
    const uint8_t *p;
    if (cur_take(c, (size_t)n, &p)) return -1;
    *v = rd_le(p, n);
    return 0;
}

static void wr_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- parser ---- */

/* Smallest possible record: name_len(2) + 1-byte name + 4 type bytes + 6 u64 + 1-byte payload. */
#define MIN_RECORD (2 + 1 + 4 + 6 * 8 + 1)

static int parse_entry(Cur *c, DeltaEntry *e, int idx, Err *err) {
    uint64_t v;
    const uint8_t *p;
    ENSURE(err, cur_u(c, 2, &v) == 0, 400, "delta: tensor %d: truncated name length", idx);
    ENSURE(err, v >= 1 && v <= DELTA_MAX_NAME, 400, "delta: tensor %d: name length %llu outside [1, %d]",
           idx, (unsigned long long)v, DELTA_MAX_NAME);
    size_t nl = (size_t)v;
    ENSURE(err, cur_take(c, nl, &p) == 0, 400, "delta: tensor %d: name runs past the container", idx);
    ENSURE(err, memchr(p, 0, nl) == NULL, 400, "delta: tensor %d: name contains NUL", idx);
    e->name = xmalloc(nl + 1);
    memcpy(e->name, p, nl);
    e->name[nl] = 0;
    ENSURE(err, cur_take(c, 4, &p) == 0, 400, "delta: '%s': truncated type bytes", e->name);
    ENSURE(err, p[0] < DT_COUNT, 400, "delta: '%s': unknown dtype code %u", e->name, p[0]);
    e->dtype = (Dtype)p[0];
    ENSURE(err, p[1] == DELTA_SPARSE || p[1] == DELTA_DENSE || p[1] == DELTA_SPARSE_XOR, 400,
           "delta: '%s': unknown encoding %u",
           e->name, p[1]);
    e->encoding = p[1];
    ENSURE(err, p[2] <= DELTA_MAX_DIMS, 400, "delta: '%s': %u dims (max %d)", e->name, p[2], DELTA_MAX_DIMS);
    e->ndim = p[2];
    ENSURE(err, p[3] == 0, 400, "delta: '%s': reserved byte is %u, not 0", e->name, p[3]);
    uint64_t prod = 1;
    for (int i = 0; i < e->ndim; i++) {
        ENSURE(err, cur_u(c, 8, &v) == 0, 400, "delta: '%s': truncated shape", e->name);
        ENSURE(err, v < (1ull << 40), 400, "delta: '%s': shape[%d] = %llu too large", e->name, i,
               (unsigned long long)v);
        ENSURE(err, v == 0 || prod <= (1ull << 48) / v, 400, "delta: '%s': shape overflows", e->name);
        prod *= v;
        e->shape[i] = (int64_t)v;
    }
    uint64_t numel, nch, raw, comp, hash;
    ENSURE(err, cur_u(c, 8, &numel) == 0 && cur_u(c, 8, &nch) == 0 && cur_u(c, 8, &raw) == 0 &&
                    cur_u(c, 8, &comp) == 0 && cur_u(c, 8, &hash) == 0,
           400, "delta: '%s': truncated record", e->name);
    ENSURE(err, numel == prod && numel >= 1, 400, "delta: '%s': element count %llu != product of shape %llu",
           e->name, (unsigned long long)numel, (unsigned long long)prod);
    ENSURE(err, nch >= 1 && nch <= numel, 400, "delta: '%s': changed count %llu outside [1, %llu]", e->name,
           (unsigned long long)nch, (unsigned long long)numel);
    uint64_t es = (uint64_t)dtype_size(e->dtype);
    if (e->encoding == DELTA_DENSE)
        ENSURE(err, raw == numel * es, 400, "delta: '%s': dense payload of %llu bytes, tensor has %llu",
               e->name, (unsigned long long)raw, (unsigned long long)(numel * es));
    else
        ENSURE(err, raw >= nch * (1 + es) && raw <= nch * (10 + es), 400,
               "delta: '%s': sparse payload of %llu bytes cannot hold %llu changes", e->name,
               (unsigned long long)raw, (unsigned long long)nch);
    ENSURE(err, comp >= 1 && comp <= c->left, 400,
           "delta: '%s': payload of %llu bytes runs past the container (%zu left)", e->name,
           (unsigned long long)comp, c->left);
    cur_take(c, (size_t)comp, &e->payload);
    e->numel = (int64_t)numel;
    e->n_changed = (int64_t)nch;
    e->raw_bytes = raw;
    e->comp_bytes = comp;
    e->hash_after = hash;
    return 0;
}

int delta_parse(DeltaFile **out, const uint8_t *buf, size_t size, Err *err) {
    *out = NULL;
    ENSURE(err, size >= DELTA_HEADER_BYTES + DELTA_TRAILER_BYTES, 400,
           "delta: %zu bytes, shorter than header + checksum (%d)", size,
           DELTA_HEADER_BYTES + DELTA_TRAILER_BYTES);
    ENSURE(err, memcmp(buf, DELTA_MAGIC, 8) == 0, 400, "delta: bad magic (not a delta container)");
    uint64_t sum = rd_le(buf + size - 8, 8), got = XXH3_64bits(buf, size - 8);
    ENSURE(err, sum == got, 400, "delta: container checksum %016llx != computed %016llx (corrupt or truncated)",
           (unsigned long long)sum, (unsigned long long)got);
    DeltaHeader h = {0};
    h.format_version = (uint32_t)rd_le(buf + 8, 4);
    ENSURE(err, h.format_version == DELTA_FORMAT_VERSION, 400, "delta: format version %u, this reader knows %u",
           h.format_version, DELTA_FORMAT_VERSION);
    h.flags = (uint32_t)rd_le(buf + 12, 4);
    ENSURE(err, (h.flags & ~DELTA_FLAGS_KNOWN) == 0, 400, "delta: unknown flags %08x", h.flags & ~DELTA_FLAGS_KNOWN);
    h.fingerprint = rd_le(buf + 16, 8);
    h.base_version = rd_le(buf + 24, 8);
    h.target_version = rd_le(buf + 32, 8);
    ENSURE(err, h.target_version > h.base_version, 400, "delta: target version %llu not after base %llu",
           (unsigned long long)h.target_version, (unsigned long long)h.base_version);
    ENSURE(err, h.target_version <= DELTA_VERSION_MAX, 400,
           "delta: target version %llu is beyond the largest version 2^62 = %llu", (unsigned long long)h.target_version,
           (unsigned long long)DELTA_VERSION_MAX);
    h.n_tensors = (uint32_t)rd_le(buf + 40, 4);
    ENSURE(err, h.n_tensors > 0 || (h.flags & DELTA_FLAG_VERSION_ONLY), 400,
           "delta: no tensors, and the version_only flag is not set: a delta that moves only the version "
           "(%llu -> %llu) must say so (header flags bit 0; `trainer diff` sets it when nothing changed)",
           (unsigned long long)h.base_version, (unsigned long long)h.target_version);
    ENSURE(err, h.n_tensors == 0 || !(h.flags & DELTA_FLAG_VERSION_ONLY), 400,
           "delta: the version_only flag is set, but the delta has %u tensors", h.n_tensors);
    ENSURE(err, rd_le(buf + 44, 4) == 0 && rd_le(buf + 56, 8) == 0, 400, "delta: reserved header fields not 0");
    uint64_t body = rd_le(buf + 48, 8);
    size_t have = size - DELTA_HEADER_BYTES - DELTA_TRAILER_BYTES;
    ENSURE(err, body == have, 400, "delta: header says %llu body bytes, container holds %zu",
           (unsigned long long)body, have);
    ENSURE(err, h.n_tensors <= have / MIN_RECORD, 400, "delta: %u tensors cannot fit in %zu bytes", h.n_tensors,
           have);
    DeltaFile *f = xcalloc(1, sizeof *f);
    f->h = h;
    f->checksum = sum;
    f->e = xcalloc(h.n_tensors ? h.n_tensors : 1, sizeof(DeltaEntry));
    Cur c = {buf + DELTA_HEADER_BYTES, have};
    int rc = 0;
    for (uint32_t i = 0; i < h.n_tensors && rc == 0; i++) {
        f->n = (int)i + 1;
        rc = parse_entry(&c, &f->e[i], (int)i, err);
        if (rc == 0 && i > 0 && strcmp(f->e[i - 1].name, f->e[i].name) >= 0)
            rc = ERR(err, 400, "delta: tensor '%s' after '%s': names not strictly sorted", f->e[i].name,
                     f->e[i - 1].name);
    }
    if (rc == 0 && c.left != 0) rc = ERR(err, 400, "delta: %zu stray bytes after the last tensor", c.left);
    if (rc) {
        delta_file_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

void delta_file_free(DeltaFile *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->e[i].name);
    free(f->e);
    free(f);
}

/* ---- payload decoding ---- */

/* Value bytes are stored as planes (byte k of every value, then byte k+1):
 * the exponent bytes of nearby weights are alike and compress well. */
static void unplane(uint8_t *dst, const uint8_t *src, int64_t n, int es) {
    if (es == 1) { memcpy(dst, src, (size_t)n); return; }
    if (es == 2) { /* BF16/F16: the common case, kept vectorizable */
        for (int64_t i = 0; i < n; i++) {
            dst[2 * i] = src[i];
            dst[2 * i + 1] = src[n + i];
        }
        return;
    }
    for (int k = 0; k < es; k++) {
        const uint8_t *s = src + (size_t)k * (size_t)n;
        for (int64_t i = 0; i < n; i++) dst[(size_t)i * es + k] = s[i];
    }
}

static void plane(uint8_t *dst, const uint8_t *src, int64_t n, int es) {
    if (es == 1) { memcpy(dst, src, (size_t)n); return; }
    if (es == 2) {
        for (int64_t i = 0; i < n; i++) {
            dst[i] = src[2 * i];
            dst[n + i] = src[2 * i + 1];
        }
        return;
    }
    for (int k = 0; k < es; k++) {
        uint8_t *d = dst + (size_t)k * (size_t)n;
        for (int64_t i = 0; i < n; i++) d[i] = src[(size_t)i * es + k];
    }
}

int delta_decode(const DeltaEntry *e, DeltaDecoded *out, Err *err) {
    memset(out, 0, sizeof *out);
    unsigned long long fcs = ZSTD_getFrameContentSize(e->payload, e->comp_bytes);
    ENSURE(err, fcs == e->raw_bytes, 400, "delta: '%s': zstd frame declares %lld bytes, record says %llu",
           e->name, fcs >= ZSTD_CONTENTSIZE_ERROR ? -1ll : (long long)fcs, (unsigned long long)e->raw_bytes);
    ENSURE(err, ZSTD_findFrameCompressedSize(e->payload, e->comp_bytes) == e->comp_bytes, 400,
           "delta: '%s': payload is not exactly one zstd frame", e->name);
    int es = dtype_size(e->dtype);
    uint8_t *raw = malloc(e->raw_bytes);
    ENSURE(err, raw != NULL, 507, "delta: '%s': cannot allocate %llu bytes", e->name,
           (unsigned long long)e->raw_bytes);
    size_t got = ZSTD_decompress(raw, e->raw_bytes, e->payload, e->comp_bytes);
    if (ZSTD_isError(got) || got != e->raw_bytes) {
        free(raw);
        return ERR(err, 400, "delta: '%s': zstd: %s", e->name,
                   ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short frame");
    }
    int64_t n = e->encoding == DELTA_DENSE ? e->numel : e->n_changed;
    out->n = n;
    out->xor = e->encoding == DELTA_SPARSE_XOR;
    out->vals = malloc((size_t)n * (size_t)es);
    if (!out->vals) {
        free(raw);
        return ERR(err, 507, "delta: '%s': out of memory", e->name);
    }
    size_t vbytes = (size_t)n * (size_t)es, pbytes = (size_t)e->raw_bytes - vbytes;
    unplane(out->vals, raw + pbytes, n, es);
    for (int64_t k = 0; out->xor && k < n; k++) { /* a zero mask would claim a change that is none */
        uint8_t any = 0;
        for (int b = 0; b < es; b++) any |= out->vals[(size_t)k * (size_t)es + (size_t)b];
        if (!any) {
            free(raw);
            delta_decoded_free(out);
            return ERR(err, 400, "delta: '%s': XOR mask %lld is zero (no change)", e->name, (long long)k);
        }
    }
    if (e->encoding != DELTA_DENSE) {
        out->pos = malloc((size_t)n * sizeof(int64_t));
        if (!out->pos) {
            free(raw);
            delta_decoded_free(out);
            return ERR(err, 507, "delta: '%s': out of memory", e->name);
        }
        const uint8_t *p = raw, *end = raw + pbytes;
        uint64_t next = 0; /* smallest position the next one may take */
        for (int64_t i = 0; i < n; i++) {
            uint64_t gap = 0;
            int shift = 0, ok = 0;
            while (p < end && shift < 64) {
                uint8_t b = *p++;
                if (shift == 63 && b > 1) break;
                gap |= (uint64_t)(b & 0x7f) << shift;
                shift += 7;
                if (!(b & 0x80)) { ok = 1; break; }
            }
            if (!ok || gap >= (uint64_t)e->numel || next + gap >= (uint64_t)e->numel) {
                free(raw);
                delta_decoded_free(out);
                return ERR(err, 400, "delta: '%s': position %lld is malformed or beyond the %lld elements",
                           e->name, (long long)i, (long long)e->numel);
            }
            out->pos[i] = (int64_t)(next + gap);
            next = next + gap + 1;
        }
        if (p != end) {
            size_t stray = (size_t)(end - p);
            free(raw);
            delta_decoded_free(out);
            return ERR(err, 400, "delta: '%s': %zu stray bytes after the positions", e->name, stray);
        }
    }
    free(raw);
    return 0;
}

void delta_decoded_free(DeltaDecoded *d) {
    free(d->pos);
    free(d->vals);
    d->pos = NULL;
    d->vals = NULL;
}

typedef struct CheckJob {
    const DeltaFile *f;
    int *rc;   /* [n] */
    Err *err;  /* [n] */
} CheckJob;

static void check_one(void *ctx, int i) {
    CheckJob *j = ctx;
    DeltaDecoded d;
    j->rc[i] = delta_decode(&j->f->e[i], &d, &j->err[i]);
    if (j->rc[i] == 0) delta_decoded_free(&d);
}

int delta_check_payloads(const DeltaFile *f, int n_threads, Err *err) {
    CheckJob j = {f, xcalloc((size_t)f->n + 1, sizeof(int)), xcalloc((size_t)f->n + 1, sizeof(Err))};
    delta_par_for(f->n, n_threads, check_one, &j);
    int rc = 0;
    for (int i = 0; i < f->n && rc == 0; i++)
        if (j.rc[i]) {
            rc = j.rc[i];
            if (err) *err = j.err[i];
        }
    free(j.rc);
    free(j.err);
    return rc;
}

/* ---- encoder ---- */

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "scan_diffs maps the lowest set bit of a word to the lowest-addressed element"
#endif

/* The sparse payload under construction: gap varints and new values, in
 * buffers that grow with the changes found, up to the dense size (beyond
 * that the tensor goes dense, and only the count continues). */
typedef struct Sink {
    const uint8_t *a, *b;
    int xor_values;
    int es;
    int64_t nch, prev_next;
    uint64_t cap_bytes;     /* dense payload size: stop storing past it */
    uint8_t *pos, *vals;
    size_t npos, cap_pos, cap_vals;
    int full;
} Sink;

static void *grow(void *p, size_t *cap, size_t need) {
    size_t c = *cap ? *cap : 1 << 12;
    while (c < need) c *= 2;
    if (c == *cap) return p;
    p = realloc(p, c);
    CHECK_PTR(p, "out of memory encoding a delta");
    *cap = c;
    return p;
}

static void sink_add(Sink *s, int64_t i) {
    s->nch++;
    if (s->full) return;
    uint64_t g = (uint64_t)(i - s->prev_next);
    int vl = 1;
    for (uint64_t v = g; v >= 0x80; v >>= 7) vl++;
    size_t vbytes = (size_t)s->nch * (size_t)s->es;
    if ((uint64_t)(s->npos + (size_t)vl + vbytes) > s->cap_bytes) { /* dense is smaller */
        s->full = 1;
        return;
    }
    s->pos = grow(s->pos, &s->cap_pos, s->npos + (size_t)vl);
    s->vals = grow(s->vals, &s->cap_vals, vbytes);
    while (g >= 0x80) {
        s->pos[s->npos++] = (uint8_t)(g | 0x80);
        g >>= 7;
    }
    s->pos[s->npos++] = (uint8_t)g;
    uint8_t *v = s->vals + vbytes - (size_t)s->es;
    const size_t o = (size_t)i * (size_t)s->es;
    delta_elem_cpy(v, s->b + o, s->es);
    if (s->xor_values)
        for (int k = 0; k < s->es; k++) v[k] ^= s->a[o + (size_t)k];
    s->prev_next = i + 1;
}

/* Every element whose bits differ, ascending. Element sizes are 1, 2, 4 or
 * 8, so a 64-bit word holds 8/es whole elements: XOR 32-byte blocks, skip
 * equal ones, and walk the set lanes of the others. */
static void scan_diffs(const uint8_t *a, const uint8_t *b, int64_t n, int es, Sink *s) {
    const int64_t per = 8 / es;
    const int shift = es == 1 ? 3 : es == 2 ? 4 : es == 4 ? 5 : 6;
    const uint64_t lane = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
    int64_t i = 0;
    for (; i + 4 * per <= n; i += 4 * per) {
        uint64_t x[4], y[4], d[4];
        memcpy(x, a + i * es, 32);
        memcpy(y, b + i * es, 32);
        for (int w = 0; w < 4; w++) d[w] = x[w] ^ y[w];
        if ((d[0] | d[1] | d[2] | d[3]) == 0) continue;
        for (int w = 0; w < 4; w++)
            for (uint64_t dw = d[w]; dw;) {
                int l = __builtin_ctzll(dw) >> shift;
                sink_add(s, i + w * per + l);
                dw &= ~(lane << (l * 8 * es));
            }
    }
    for (; i < n; i++)
        if (delta_elem_ne(a + i * es, b + i * es, es)) sink_add(s, i);
}

int delta_encode_tensor(DeltaRecord *out, const char *name, Dtype dt, int ndim, const int64_t *shape,
                        const void *old_data, const void *new_data, int level, int xor_values, Err *err) {
    memset(out, 0, sizeof *out);
    int es = dtype_size(dt);
    ENSURE(err, (es == 1 || es == 2 || es == 4 || es == 8) && ndim >= 0 && ndim <= DELTA_MAX_DIMS, 400,
           "delta: '%s': bad dtype or ndim", name);
    ENSURE(err, strlen(name) >= 1 && strlen(name) <= DELTA_MAX_NAME, 400, "delta: '%s': bad name length", name);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= shape[i];
    ENSURE(err, numel >= 1, 400, "delta: '%s': empty tensor", name);
    const uint8_t *b = new_data;
    uint64_t dense_raw = (uint64_t)numel * (uint64_t)es;
    Sink s = {.a = old_data, .b = b, .es = es, .cap_bytes = dense_raw, .xor_values = xor_values};
    scan_diffs(old_data, b, numel, es, &s);
    out->n_changed = s.nch;
    if (s.nch == 0) return 0;
    out->name = xstrdup(name);
    out->dtype = dt;
    out->ndim = ndim;
    for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
    out->numel = numel;
    out->hash_after = XXH3_64bits(b, (size_t)dense_raw);
    uint64_t sparse_raw = s.npos + (uint64_t)s.nch * (uint64_t)es;
    uint8_t *raw;
    if (!s.full && sparse_raw < dense_raw) {
        out->encoding = xor_values ? DELTA_SPARSE_XOR : DELTA_SPARSE;
        out->raw_bytes = sparse_raw;
        raw = xmalloc(sparse_raw);
        memcpy(raw, s.pos, s.npos);
        plane(raw + s.npos, s.vals, s.nch, es);
    } else {
        out->encoding = DELTA_DENSE;
        out->raw_bytes = dense_raw;
        raw = xmalloc(dense_raw);
        plane(raw, b, numel, es);
    }
    free(s.pos);
    free(s.vals);
    size_t cap = ZSTD_compressBound(out->raw_bytes);
    out->payload = xmalloc(cap);
    size_t cs = ZSTD_compress(out->payload, cap, raw, out->raw_bytes, level);
    free(raw);
    if (ZSTD_isError(cs)) {
        delta_record_free(out);
        return ERR(err, 500, "delta: '%s': zstd: %s", name, ZSTD_getErrorName(cs));
    }
    out->comp_bytes = cs;
    return 0;
}

void delta_record_free(DeltaRecord *r) {
    free(r->name);
    free(r->payload);
    r->name = NULL;
    r->payload = NULL;
}

static int cmp_rec(const void *x, const void *y) {
    return strcmp(((const DeltaRecord *)x)->name, ((const DeltaRecord *)y)->name);
}

uint8_t *delta_serialize(const DeltaHeader *h, DeltaRecord *recs, int n, size_t *size) {
    if (n > 1) qsort(recs, (size_t)n, sizeof *recs, cmp_rec);
    size_t body = 0;
    for (int i = 0; i < n; i++) body += 2 + strlen(recs[i].name) + 4 + 8 * (size_t)recs[i].ndim + 40 + recs[i].comp_bytes;
    size_t total = DELTA_HEADER_BYTES + body + DELTA_TRAILER_BYTES;
    uint8_t *buf = xcalloc(1, total), *p = buf;
    memcpy(p, DELTA_MAGIC, 8);
    wr_le(p + 8, DELTA_FORMAT_VERSION, 4);
    wr_le(p + 12, h->flags, 4);
    wr_le(p + 16, h->fingerprint, 8);
    wr_le(p + 24, h->base_version, 8);
    wr_le(p + 32, h->target_version, 8);
    wr_le(p + 40, (uint64_t)n, 4);
    wr_le(p + 48, body, 8);
    p += DELTA_HEADER_BYTES;
    for (int i = 0; i < n; i++) {
        const DeltaRecord *r = &recs[i];
        size_t nl = strlen(r->name);
        wr_le(p, nl, 2);
        memcpy(p + 2, r->name, nl);
        p += 2 + nl;
        p[0] = (uint8_t)r->dtype;
        p[1] = (uint8_t)r->encoding;
        p[2] = (uint8_t)r->ndim;
        p += 4;
        for (int d = 0; d < r->ndim; d++, p += 8) wr_le(p, (uint64_t)r->shape[d], 8);
        uint64_t f[5] = {(uint64_t)r->numel, (uint64_t)r->n_changed, r->raw_bytes, r->comp_bytes, r->hash_after};
        for (int k = 0; k < 5; k++, p += 8) wr_le(p, f[k], 8);
        memcpy(p, r->payload, r->comp_bytes);
        p += r->comp_bytes;
    }
    wr_le(p, XXH3_64bits(buf, total - 8), 8);
    *size = total;
    return buf;
}
