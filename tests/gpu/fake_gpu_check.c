/*
 * fake_gpu_check.c - a stand-in for gpu_check-smXX on a machine without a GPU,
 * for one purpose: testing how tests/gpu/check.sh and bench/gpu_json.py get
 * through a GPU check that dies part-way (tests/py/test_gpu_check_resume.py).
 *
 * It runs check_sections.h - the same walker, watchdog, context check, command
 * line and progress JSON gpu_check uses - over a small table named like
 * gpu_check's (ops with 6 rows, sampling, models_bf16, roofline, decode,
 * prefill, moe), whose steps only count checks and add rows with the names
 * gpu_json.py parses. Its numbers are made up and its JSON says so ("gpu":
 * "FAKE ..."): nothing it writes is a measurement.
 *
 * Planted deaths, from the environment: FAKE_DIE="STEP:HOW[,STEP:HOW...]",
 * STEP a section name or "ops@ROW", HOW one of
 *   crash   abort() inside the step (a fault: SIGABRT, as a SIGSEGV would)
 *   exit    exit(1) inside the step (CUDA_CHECK's fatal path)
 *   hang    block until the watchdog stops the process
 *   broken  the step returns, but the "device context" is broken after it
 *   fail    one check of the step fails, and the run goes on
 * FAKE_LIMIT_S overrides every step's watchdog limit (seconds), so that a hang
 * costs a test seconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_sections.h"

static int n_pass, n_fail, context_broken, limit_override;
static const char *json_path;
static double copy_gbs, gemm_tflops;
static char rows[1024], named[1024]; /* JSON array members written so far */

/* The planted death of this step, if any: its HOW, else NULL. */
static const char *fake_how(const char *step) {
    const char *spec = getenv("FAKE_DIE");
    static char how[16];
    size_t n = strlen(step);
    for (const char *p = spec; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l > n && !strncmp(p, step, n) && p[n] == ':') {
            snprintf(how, sizeof how, "%.*s", (int)(l - n - 1), p + n + 1);
            return how;
        }
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

/* A step's body: the planted death, or one passing check. */
static void fake_step(const char *step) {
    const char *how = fake_how(step);
    if (!how) { n_pass++; return; }
    printf("fake_gpu_check: %s: planted %s\n", step, how);
    fflush(stdout);
    if (!strcmp(how, "crash")) abort();
    if (!strcmp(how, "exit")) exit(1);
    if (!strcmp(how, "hang")) for (;;) pause();
    if (!strcmp(how, "broken")) context_broken = 1, n_pass++;
    else if (!strcmp(how, "fail")) n_fail++;
}

static int fake_context_ok(const char *after) {
    if (context_broken) printf("fake_gpu_check: the planted broken context after %s\n", after);
    return !context_broken;
}

static void write_json(void) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", json_path);
    FILE *f = fopen(tmp, "w");
    if (!f) { perror(tmp); exit(1); }
    fprintf(f, "{\"gpu\": \"FAKE (tests/gpu/fake_gpu_check.c, no measurement)\", \"sm\": 90, \"sms\": 1, "
               "\"mem_gib\": 1.0,\n ");
    check_progress_json(f);
    fprintf(f, ",\n \"bench_ran\": %s, \"copy_gbs\": %g, \"gemm_tflops\": %g,\n \"rows\": [%s],\n \"gemv\": [],\n"
               " \"ops\": [],\n \"named_rows\": [%s]}\n", copy_gbs > 0 ? "true" : "false", copy_gbs, gemm_tflops,
            rows, named);
    if (fclose(f) || rename(tmp, json_path)) { perror(json_path); exit(1); }
}

static void add_row(const char *name, double tok_s, double frac) {
    size_t l = strlen(rows);
    snprintf(rows + l, sizeof rows - l, "%s{\"name\": \"%s\", \"tok_s\": %g, \"ms\": 1, \"roof_tok_s\": %g, "
             "\"fraction\": %g}", l ? ", " : "", name, tok_s, tok_s / frac, frac);
}

static void add_named(const char *name, double v) {
    size_t l = strlen(named);
    snprintf(named + l, sizeof named - l, "%s{\"name\": \"%s\", \"value\": %g, \"unit\": \"\"}", l ? ", " : "", name, v);
}

static size_t ops_from;
static void section_ops(void) {
    for (size_t row = ops_from; row < 6; row++) {
        check_row_begin("ops", row, limit_override ? limit_override : 60);
        fake_step(check_progress.running);
    }
    check_rows_end();
}
static void section_sampling(void) { fake_step("sampling"); }
static void section_models(void) { fake_step("models_bf16"); }
static void section_roofline(void) {
    fake_step("roofline");
    copy_gbs = 1000;
    gemm_tflops = 100;
}
static void section_decode(void) {
    fake_step("decode");
    if (copy_gbs > 0) add_row("bf16 decode batch 1 (ctx 512)", 10, 0.5);
}
static void section_prefill(void) {
    fake_step("prefill");
    if (copy_gbs > 0) add_row("bf16 prefill 4 x 1024 tokens", 1000, 0.25);
}
static void section_moe(void) {
    fake_step("moe");
    if (copy_gbs > 0) add_named("decode_moe30b_b1_fraction", 0.125);
}

static CheckSection SECTIONS[] = {
    {"ops", 1, 60, section_ops},
    {"sampling", 1, 60, section_sampling},
    {"models_bf16", 2, 60, section_models},
    {"roofline", 3, 60, section_roofline},
    {"decode", 3, 60, section_decode},
    {"prefill", 3, 60, section_prefill},
    {"moe", 3, 60, section_moe},
};
#define N_SECTIONS ((int)(sizeof SECTIONS / sizeof SECTIONS[0]))

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    char skip[2048];
    check_args_parse(argc, argv, SECTIONS, N_SECTIONS, skip, &ops_from, &json_path);
    const char *lim = getenv("FAKE_LIMIT_S");
    limit_override = lim ? atoi(lim) : 0;
    if (limit_override > 0)
        for (int i = 0; i < N_SECTIONS; i++) SECTIONS[i].limit_s = limit_override;
    printf("fake_gpu_check: a stand-in for gpu_check (no GPU, no measurement)\n");
    if (json_path) check_progress_write = write_json;
    check_context_ok = fake_context_ok;
    check_sections_run(SECTIONS, N_SECTIONS, skip, &n_pass, &n_fail);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
