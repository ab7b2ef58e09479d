/*
 * check_sections.h - gpu_check's steps: named sections run in order, each under
 * a watchdog, with the run's progress rewritten into its JSON before and after
 * every step. A check that dies part-way (a kernel fault that breaks the CUDA
 * context, a hang, a fatal exit) then leaves a JSON that names the step it died
 * in and holds every row measured before it, and tests/gpu/check.sh starts a
 * fresh process that skips what is done and the step that died
 * (bench/gpu_json.py resume) instead of losing every row after it.
 *
 * What it is: the table walker, the watchdog, the context check between steps
 * and the JSON's "sections" and "parts" objects:
 *   "parts": {"ops"|"models"|"bench": {"passed": P, "failed": F}},
 *   "sections": {"done": [NAME...], "skipped": [NAME...],
 *                "running": "NAME" | "ops@ROW" | null, "complete": true|false}
 * A step is a section, or one row of a section that walks a table
 * (check_row_begin; the ops section: "ops@ROW", ROW counted from 0 over
 * op_checks_row_count()).
 * What it is not: the checks and benches (gpu_check.c), the JSON's rows (the
 * caller's writer), the decision to resume (gpu_json.py resume reads the JSON
 * of every try). No CUDA here: tests/gpu/fake_gpu_check.c runs it on the CPU in
 * CI, through check.sh, with planted crashes, hangs and broken contexts.
 *
 * Exit statuses of a process using it: 0 every check passed, 1 a check failed
 * (the run completed), CHECK_EXIT_DIED a step died (watchdog or broken context:
 * the JSON's "running" names it). A crash or exit(1) inside a step leaves
 * "complete": false with "running" set, which is what check.sh reads.
 */
#ifndef SAMPLER_CHECK_SECTIONS_H
#define SAMPLER_CHECK_SECTIONS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK_EXIT_DIED 3

typedef struct CheckSection {
    const char *name; /* [a-z0-9_]+: the name --skip-sections takes */
    int part;         /* 1 ops, 2 models, 3 bench: the pass/fail counter its checks add to */
    int limit_s;      /* watchdog: past this the process stops (CHECK_EXIT_DIED) */
    void (*run)(void);
} CheckSection;

typedef struct CheckProgress {
    char running[48];   /* the step in progress, "" between steps */
    char done[2048];    /* comma list of the sections finished in this process */
    char skipped[2048]; /* comma list of the sections --skip-sections named */
    int complete;       /* every section done or skipped */
    int pass[4], fail[4]; /* by part (index 1..3), of the sections done */
    const int *n_pass, *n_fail; /* the checks' global counters */
    int cur_part, p0, f0;       /* the running section's part and the counters when it began */
} CheckProgress;

static CheckProgress check_progress;
/* The caller's: rewrite the JSON (atomically; NULL when there is none), and
 * say whether the device context still works (NULL: it always does). */
static void (*check_progress_write)(void);
static int (*check_context_ok)(const char *after);

/* 1 if the comma list has name as one of its items. */
static int check_list_has(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, name, n)) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

static void check_list_add(char *list, size_t cap, const char *name) {
    size_t l = strlen(list);
    snprintf(list + l, cap - l, "%s%s", l ? "," : "", name);
}

/* The JSON's "parts" and "sections" members (no braces around them, no
 * trailing comma), for the caller's writer. Names are [a-z0-9_@]. */
static void check_progress_json(FILE *f) {
    static const char *parts[] = {"", "ops", "models", "bench"};
    fprintf(f, "\"parts\": {");
    const CheckProgress *g = &check_progress;
    for (int i = 1; i <= 3; i++) { /* with what the running section has counted so far */
        int cur = i == g->cur_part && g->n_pass;
        fprintf(f, "%s\"%s\": {\"passed\": %d, \"failed\": %d}", i > 1 ? ", " : "", parts[i],
                g->pass[i] + (cur ? *g->n_pass - g->p0 : 0), g->fail[i] + (cur ? *g->n_fail - g->f0 : 0));
    }
    fprintf(f, "},\n \"sections\": {");
    const char *lists[] = {check_progress.done, check_progress.skipped}, *keys[] = {"done", "skipped"};
    for (int k = 0; k < 2; k++) {
        fprintf(f, "\"%s\": [", keys[k]);
        int first = 1;
        for (const char *p = lists[k]; *p;) {
            const char *e = strchr(p, ',');
            size_t l = e ? (size_t)(e - p) : strlen(p);
            fprintf(f, "%s\"%.*s\"", first ? "" : ", ", (int)l, p);
            first = 0;
            p = e ? e + 1 : p + l;
        }
        fprintf(f, "], ");
    }
    if (check_progress.running[0]) fprintf(f, "\"running\": \"%s\", ", check_progress.running);
    else fprintf(f, "\"running\": null, ");
    fprintf(f, "\"complete\": %s}", check_progress.complete ? "true" : "false");
}

/* The watchdog: SIGALRM past a step's limit. The handler may only use
 * async-signal-safe calls, so its message is made when the alarm is armed. */
static char check_alarm_msg[160];
static size_t check_alarm_len;
static void check_alarm(int sig) {
    (void)sig;
    ssize_t w = write(2, check_alarm_msg, check_alarm_len);
    (void)w;
    _exit(CHECK_EXIT_DIED);
}

/* A step begins: the JSON says it runs (so a death inside it is attributed to
 * it), and the watchdog is armed for limit_s seconds. */
static void check_step_begin(const char *step, int limit_s) {
    snprintf(check_progress.running, sizeof check_progress.running, "%s", step);
    if (check_progress_write) check_progress_write();
    int l = snprintf(check_alarm_msg, sizeof check_alarm_msg,
                     "\ngpu_check: %s ran past its limit of %d s; stopping (check.sh resumes after it)\n", step, limit_s);
    check_alarm_len = l < 0 ? 0 : (size_t)l < sizeof check_alarm_msg ? (size_t)l : sizeof check_alarm_msg - 1;
    signal(SIGALRM, check_alarm);
    alarm((unsigned)limit_s);
}

/* A step ended: the watchdog is off, and the device context must still work;
 * when it does not (a sticky error: every later CUDA call would fail), the
 * process stops here with the JSON still naming the step. */
static void check_step_end(void) {
    alarm(0);
    if (check_context_ok && !check_context_ok(check_progress.running)) {
        printf("gpu_check: the device context is broken after %s (above); stopping so that check.sh resumes "
               "after it in a fresh process\n", check_progress.running);
        fflush(stdout);
        _exit(CHECK_EXIT_DIED);
    }
}

/* A table-walking section's rows as steps of their own, "SECTION@ROW": each
 * its own watchdog, the JSON naming it while it runs, the device context
 * checked when the next row begins and, for the last, at check_rows_end. */
static int check_rows_open;
static void check_row_begin(const char *section, size_t row, int limit_s) {
    char step[48];
    if (check_rows_open) check_step_end();
    check_rows_open = 1;
    snprintf(step, sizeof step, "%s@%zu", section, row);
    check_step_begin(step, limit_s);
}
static void check_rows_end(void) {
    if (check_rows_open) check_step_end();
    check_rows_open = 0;
}

/* Runs the table in order, skipping the sections skip (a comma list) names;
 * *n_pass / *n_fail are the checks' global counters, whose growth over a
 * section goes to its part. */
static void check_sections_run(const CheckSection *t, int n, const char *skip, const int *n_pass, const int *n_fail) {
    for (int i = 0; i < n; i++) {
        if (check_list_has(skip, t[i].name)) {
            printf("gpu_check: section %s skipped (--skip-sections)\n", t[i].name);
            check_list_add(check_progress.skipped, sizeof check_progress.skipped, t[i].name);
            continue;
        }
        CheckProgress *g = &check_progress;
        g->n_pass = n_pass;
        g->n_fail = n_fail;
        g->cur_part = t[i].part;
        g->p0 = *n_pass;
        g->f0 = *n_fail;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        check_step_begin(t[i].name, t[i].limit_s);
        t[i].run();
        /* a table-walking section leaves "running" at its last row: the section is what ends */
        snprintf(check_progress.running, sizeof check_progress.running, "%s", t[i].name);
        check_step_end();
        g->pass[t[i].part] += *n_pass - g->p0;
        g->fail[t[i].part] += *n_fail - g->f0;
        g->cur_part = 0;
        check_list_add(check_progress.done, sizeof check_progress.done, t[i].name);
        check_progress.running[0] = 0;
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("gpu_check: section %s done in %.1f s (%d passed, %d failed so far)\n", t[i].name,
               (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9, *n_pass, *n_fail);
        if (check_progress_write) check_progress_write();
    }
    check_progress.complete = 1;
    if (check_progress_write) check_progress_write();
}

/* The command line both gpu_check and fake_gpu_check take:
 *   --skip-bench            skip every part-3 section
 *   --skip-sections A,B,..  skip these (check.sh's resume: the done and the dead)
 *   --ops-from ROW          the ops section starts at this row (resume after "ops@ROW-1")
 *   --list-sections         print "NAME PART" per section and exit 0
 *   --json FILE             the progress and results file
 * skip must hold 2048 bytes. Exits 2 on anything else. */
static void check_args_parse(int argc, char **argv, const CheckSection *t, int n, char *skip, size_t *ops_from,
                             const char **json_path) {
    skip[0] = 0;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--skip-bench")) {
            for (int k = 0; k < n; k++)
                if (t[k].part == 3) check_list_add(skip, 2048, t[k].name);
        } else if (!strcmp(argv[i], "--skip-sections") && i + 1 < argc) {
            check_list_add(skip, 2048, argv[++i]);
        } else if (!strcmp(argv[i], "--ops-from") && i + 1 < argc) {
            *ops_from = strtoul(argv[++i], &end, 10);
            if (end == argv[i] || *end) goto usage;
        } else if (!strcmp(argv[i], "--list-sections")) {
            for (int k = 0; k < n; k++) printf("%s %d\n", t[k].name, t[k].part);
            exit(0);
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            *json_path = argv[++i];
        } else {
        usage:
            fprintf(stderr, "usage: %s [--skip-bench] [--skip-sections A,B,..] [--ops-from ROW] [--list-sections] "
                            "[--json FILE]\n", argv[0]);
            exit(2);
        }
    }
}

#endif
