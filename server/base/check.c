/*
 * check.c - fatal start-up checks, request-path error records, and the
 * load-time allocators. See check.h for the two error regimes.
 */
#include "check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

void check_fail(const char *file, int line, const char *expr, int with_errno, const char *fmt, ...) {
    int saved = errno;
    fprintf(stderr, "fatal: %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  (failed: %s", expr);
    if (with_errno && saved) fprintf(stderr, "; errno: %s", strerror(saved));
    fprintf(stderr, ")\n");
    exit(1);
}

void assert_fail(const char *file, int line, const char *expr, const char *fmt, ...) {
    fprintf(stderr, "invariant broken: %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  (failed: %s)\n", expr);
    fflush(stderr);
    abort();
}

int err_set(Err *e, const char *file, int line, int code, const char *fmt, ...) {
    if (e) {
        e->code = code;
        e->file = file;
        e->line = line;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -(code ? code : 1);
}

static _Thread_local unsigned long alloc_failed;

void alloc_failure_note(void) { alloc_failed++; }
unsigned long alloc_failures(void) { return alloc_failed; }

void *alloc_noted(size_t n) {
    void *p = malloc(n);
    if (!p) alloc_failed++;
    return p;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    CHECK(p != NULL, "out of memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    CHECK(p != NULL, "out of memory allocating %zu x %zu bytes", n, sz);
    return p;
}

void *xcalloc_huge(size_t bytes) {
    void *p = xcalloc(1, bytes);
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < bytes; i += 4096) ((volatile char *)p)[i] = 0; /* fault in now (calloc's zeros stay) */
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}
