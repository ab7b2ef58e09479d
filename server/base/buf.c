/*
 * buf.c - growable byte buffer, base64 and constant-time comparison (buf.h).
 */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* 0, or -1 (noted in alloc_failures, b unchanged) when it cannot grow. */
static int buf_reserve(Buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        alloc_failure_note();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void buf_append(Buf *b, const void *s, size_t n) {
    if (buf_reserve(b, n) < 0) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void buf_puts(Buf *b, const char *s) { buf_append(b, s, strlen(s)); }

void buf_printf(Buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) { buf_append(b, tmp, (size_t)k); return; }
    if (buf_reserve(b, (size_t)k) < 0) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

void buf_free(Buf *b) {
    free(b->p);
    *b = (Buf){0};
}

size_t buf_utf8_floor(const char *s, size_t n) {
    size_t j = n, back = 0;
    while (j > 0 && back < 3 && ((unsigned char)s[j - 1] & 0xC0) == 0x80) j--, back++;
    if (j == 0) return n;
    unsigned char lead = (unsigned char)s[j - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return need > 1 && back + 1 < need ? j - 1 : n;
}

void buf_base64(Buf *b, const void *data, size_t n) {
    static const char T[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *d = data;
    if (buf_reserve(b, (n + 2) / 3 * 4) < 0) return;
    char *o = b->p + b->n;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
        *o++ = T[v >> 18]; *o++ = T[(v >> 12) & 63]; *o++ = T[(v >> 6) & 63]; *o++ = T[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0);
        *o++ = T[v >> 18]; *o++ = T[(v >> 12) & 63];
        *o++ = i + 1 < n ? T[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    b->n = (size_t)(o - b->p);
    b->p[b->n] = 0;
}

int secret_equal(const char *secret, const char *cand) {
    size_t ns = strlen(secret), nc = strlen(cand);
    unsigned char diff = (unsigned char)(ns != nc);
    /* Always walk the whole secret so timing depends on its length only. */
    for (size_t i = 0; i < ns; i++) diff |= (unsigned char)(secret[i] ^ (i < nc ? cand[i] : 0));
    return diff == 0;
}
