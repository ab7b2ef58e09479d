/*
 * check.h - the two error regimes of the sampler.
 *
 * Start-up / configuration failures: CHECK* macros print file:line, the failed
 * expression and a message that says how to fix it, then exit(1).
 * Request paths (anything a client or a delta can reach): functions return an
 * int status (0 ok, <0 error) and fill an Err with file:line and a message;
 * they never exit and never leave shared state half-modified.
 * Invariants of our own code (not input checks): ASSERT aborts with file:line,
 * the expression and a message, in every build (a broken invariant is a bug
 * that must not run on; abort() leaves a core and a sanitizer stack).
 *
 * Not here: logging (log.h), CUDA checks (cuda_check.h).
 */
#ifndef SAMPLER_CHECK_H
#define SAMPLER_CHECK_H

#include <errno.h>
#include <stddef.h>
#include <string.h>

/* Error record for request paths. code follows HTTP semantics where it
 * reaches a client (400 bad input, 409 conflict, 413 too large, 500 bug). */
typedef struct Err {
    int code;
    const char *file;
    int line;
    char msg[512];
} Err;

/* with_errno: also print strerror(errno) (for libc calls that set it). */
void check_fail(const char *file, int line, const char *expr, int with_errno, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 5, 6)));
void assert_fail(const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
int err_set(Err *e, const char *file, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Fatal: start-up only. */
#define CHECK(cond, ...) \
    do { if (!(cond)) check_fail(__FILE__, __LINE__, #cond, 0, __VA_ARGS__); } while (0)
/* Fatal wrapper for libc/POSIX calls that return -1 (or NULL) and set errno. */
#define CHECK_SYS(expr, ...) \
    do { if ((expr) == -1) check_fail(__FILE__, __LINE__, #expr, 1, __VA_ARGS__); } while (0)
#define CHECK_PTR(expr, ...) \
    do { if ((expr) == NULL) check_fail(__FILE__, __LINE__, #expr, 1, __VA_ARGS__); } while (0)

/* Invariant (never an input check): active in all builds; cheap conditions only. */
#define ASSERT(cond, ...) \
    do { if (!(cond)) assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); } while (0)

/* Request path: record the error and return its (negative) status. */
#define ERR(e, code, ...) err_set((e), __FILE__, __LINE__, (code), __VA_ARGS__)
/* Request path: bail out of the current function with an error if cond fails. */
#define ENSURE(e, cond, code, ...) \
    do { if (!(cond)) return ERR((e), (code), __VA_ARGS__); } while (0)

/* Request-path allocation failures, counted per thread: an allocator on a
 * request path (Buf, the JSON library's hook, the tokenizer's decode) that
 * cannot allocate notes it here and fails without exiting; the request
 * compares alloc_failures() before and after what it builds and answers 503
 * instead of sending a response with something missing. */
void alloc_failure_note(void);
unsigned long alloc_failures(void);
/* malloc that notes a failure (the JSON library's allocator, json_set_alloc_funcs). */
void *alloc_noted(size_t n);

/* Allocation at load time: fatal on failure. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t sz);
/* xcalloc(1, bytes) for a large buffer that is streamed or walked at random (weights, KV
 * caches): the 2 MiB-aligned interior is asked for transparent huge pages (a hint, ignored
 * where THP is off), so a walk over scattered 4 KiB runs is not a TLB miss each, and every
 * page is touched here, at load time: otherwise the first steps that reach a KV block fault
 * its pages in (and the kernel zeroes a 2 MiB page) inside the forward pass. free() it. */
void *xcalloc_huge(size_t bytes);
char *xstrdup(const char *s);

#endif
