/*
 * flags.h - the command line of sampler-cpu and the per-GPU binaries: one
 * table (flags.c) with a row per flag (name, metavar, --help section and
 * text, the field it sets, how its value is parsed and checked). Parsing and
 * --help both read the table, and --help prints each default from a
 * freshly defaulted CliConfig, so the help cannot disagree with the code.
 *
 * Not here: what the flags mean to the server (server.h, engine.h).
 */
#ifndef SAMPLER_FLAGS_H
#define SAMPLER_FLAGS_H

#include <stdint.h>
#include <stdio.h>

#include "log.h"
#include "server.h"

#define FLAGS_MAX_PROMPT 8192

typedef struct CliConfig {
    ServerConfig server;              /* everything server_create needs */
    int32_t prompt[FLAGS_MAX_PROMPT]; /* --prompt-ids: one-shot mode (no HTTP) when n_prompt > 0 */
    int n_prompt;
    int max_tokens;                   /* one-shot mode: tokens to generate; default 16 */
    LogLevel log_level;               /* --log-level; default LOG_DEFAULT_LEVEL (set at once while parsing) */
} CliConfig;

/* Every default (server_config_default, one-shot defaults); reads no environment. */
void flags_default(CliConfig *c);
/* Defaults, then the environment defaults (SAMPLER_API_KEY, SAMPLER_ADMIN_TOKEN),
 * then argv[1..argc) in order. A bad flag or value is fatal with a message
 * naming the flag. Returns 1 when --help was printed (the caller exits 0),
 * else 0. --log-level takes effect at once. */
int flags_parse(CliConfig *c, int argc, char **argv);
/* The --help text: every row of the table, by section, with its default. */
void flags_help(FILE *out, const char *prog);

#endif
