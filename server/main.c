/*
 * main.c - entry point of sampler-cpu and the per-GPU binaries: parse the
 * flags (flags.h), create the server (server.h: model, tokenizer, engine,
 * ...), listen, wait for SIGTERM / SIGINT, shut down gracefully, free.
 *
 * --prompt-ids keeps a one-shot mode (no HTTP): generate from token ids
 * through the engine and print the ids.
 */
#include <signal.h>
#include <stdio.h>

#include "check.h"
#include "engine.h"
#include "flags.h"
#include "log.h"
#include "server.h"

static int oneshot(Engine *e, const int32_t *prompt, int n_prompt, int max_new) {
    EngineRequestParams p;
    engine_request_params_default(&p);
    p.prompt = prompt;
    p.n_prompt = n_prompt;
    p.sampling.temperature = 0;
    p.sampling.max_tokens = max_new;
    EngineRequest *r;
    Err err = {0};
    CHECK(engine_submit(e, &p, &r, &err) == 0, "%s", err.msg);
    uint64_t seen = 0;
    while (!engine_request_done(r)) engine_request_wait(r, &seen, 1000);
    EngineSeqView v;
    engine_request_seq(r, 0, &v);
    printf("generated:");
    for (int i = 0; i < v.n_tokens; i++) printf(" %d", v.tokens[i].token);
    printf("\nfinish: %s\n", finish_reason_name(v.finish));
    engine_request_release(r);
    return 0;
}

int main(int argc, char **argv) {
    static CliConfig cli; /* the prompt array is large */
    if (flags_parse(&cli, argc, argv)) return 0;
    signal(SIGPIPE, SIG_IGN);

    if (cli.n_prompt > 0) {
        cli.server.engine_only = 1;
        Server *s = server_create(&cli.server);
        int rc = oneshot(s->eng, cli.prompt, cli.n_prompt, cli.max_tokens);
        server_free(s);
        return rc;
    }

    /* Before any thread starts (server_create starts the runner's pool and the
     * engine): every thread inherits the mask, so SIGTERM/SIGINT reach only
     * main's sigwait. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    Server *s = server_create(&cli.server);
    server_start(s);
    printf("listening on %s://%s:%d\n", s->cfg.tls_cert ? "https" : "http", s->cfg.host, s->bound_port);
    fflush(stdout);

    int sig = 0;
    sigwait(&set, &sig);
    log_info("received %s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    server_shutdown(s);
    server_free(s);
    log_info("bye");
    return 0;
}
