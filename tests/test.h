/*
 * test.h - the minimal C test harness: count assertions, print the plain
 * "N passed, N failed" line, exit non-zero on any failure. One binary per
 * concept (tests/test_<concept>.c), each a ctest.
 */
#ifndef SAMPLER_TEST_H
#define SAMPLER_TEST_H

#include <stdio.h>

static int t_pass, t_fail;

#define T_ASSERT(cond, ...)                                                    \
    do {                                                                       \
        if (cond) t_pass++;                                                    \
        else {                                                                 \
            t_fail++;                                                          \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
        }                                                                      \
    } while (0)

#define T_DONE() (printf("%d passed, %d failed\n", t_pass, t_fail), t_fail ? 1 : 0)

#endif
