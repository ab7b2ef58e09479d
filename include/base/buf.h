/*
 * buf.h - a growable byte buffer for building HTTP bodies and decoded text,
 * plus base64 (RFC 4648, with padding) for binary fields in JSON.
 *
 * Request-path memory: a Buf grows with realloc; when that fails the append
 * is dropped (the Buf keeps what it had) and the failure is counted in
 * alloc_failures (check.h), never fatal: the request that built it checks
 * the count and fails with 503 instead of sending a truncated body. Not a string library: no formatting beyond
 * buf_printf, no UTF-8 awareness except buf_utf8_floor.
 */
#ifndef SAMPLER_BUF_H
#define SAMPLER_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct Buf {
    char *p;      /* [n] bytes, always NUL-terminated at p[n] once non-empty */
    size_t n, cap;
} Buf;

void buf_append(Buf *b, const void *s, size_t n);
void buf_puts(Buf *b, const char *s);
void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_free(Buf *b);
/* Largest k <= n such that s[0..k) does not end inside a UTF-8 sequence that
 * continues at s[k] (so s[0..k) is a prefix made of whole characters of s). */
size_t buf_utf8_floor(const char *s, size_t n);

/* Append the base64 encoding of data[0..n). */
void buf_base64(Buf *b, const void *data, size_t n);

/* Constant-time comparison of a secret with a candidate: 1 if equal. */
int secret_equal(const char *secret, const char *cand);

#endif
