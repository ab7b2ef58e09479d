/*
 * fleet.h - push targets and the trainer's delta chain (fleet.c), for push.c.
 */
#ifndef SAMPLER_TRAINER_FLEET_H
#define SAMPLER_TRAINER_FLEET_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "delta_sign.h"

#define FLEET_MAX_TARGETS 256
#define FLEET_MAX_CHAIN 1024

typedef struct FleetTargets {
    char *url[FLEET_MAX_TARGETS]; /* without a trailing slash; each listed once */
    int n;
} FleetTargets;

void fleet_add_url(FleetTargets *t, const char *url);
/* One URL per line; blank lines and # comments ignored. */
void fleet_add_file(FleetTargets *t, const char *path);
/* The workers a vllm-router or sglang-router routes to (GET /workers, else
 * GET /list_workers); key: the router's API key or NULL. */
void fleet_add_router(FleetTargets *t, const char *router, const char *key);

/* One delta of the trainer's chain (a *.delta file of --chain DIR). */
typedef struct FleetLink {
    char *path;
    const uint8_t *body;           /* [size] read-only mapping once a target needed it; NULL before */
    size_t size;
    uint64_t base, target;
    char sig[DELTA_SIG_CHARS + 1]; /* with a key: its signature, once mapped */
} FleetLink;

typedef struct FleetChain {
    FleetLink *link; /* sorted by base version */
    int n;
    const uint8_t *key; /* [nk] the signing key or NULL; the caller's, kept until fleet_chain_free */
    size_t nk;
    pthread_mutex_t mu; /* guards the lazy mapping */
    int loaded;         /* mu initialized */
} FleetChain;

/* Every *.delta of dir for the model with this fingerprint (others
 * skipped), headers only. key (may be NULL) signs each when it is mapped.
 * Fatal on an unreadable file or one that is not a delta container. */
void fleet_chain_load(FleetChain *c, const char *dir, uint64_t fingerprint, const uint8_t *key, size_t nk);
/* Link i's bytes (mapped on first use) and its signature (NULL without a
 * key); thread-safe. -1 with msg when it cannot be mapped or signed. */
int fleet_chain_body(FleetChain *c, int i, const uint8_t **body, size_t *size, const char **sig, char *msg,
                     size_t cap);
/* The deltas that take version `from` to `to` in order (indices into
 * c->link, at most cap): their count, or -1 when the chain has a gap or is
 * longer than cap. */
int fleet_chain_path(const FleetChain *c, uint64_t from, uint64_t to, int *idx, int cap);
void fleet_chain_free(FleetChain *c);

#endif
