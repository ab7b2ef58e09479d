/*
 * api_lora.c - the served LoRA adapters: the slot registry (name -> runner
 * slot, version, references), start-up loading (--lora NAME=DIR), and vLLM's
 * run-time endpoints POST /v1/load_lora_adapter {lora_name, lora_path,
 * load_inplace} and POST /v1/unload_lora_adapter {lora_name} (admin token).
 *
 * Slots: cfg.engine.max_loras, the runner's LoRA slots 0..max_loras-1. A slot
 * is FREE, LIVE (its name resolves) or DRAINING (unloaded while requests
 * still hold it: the name no longer resolves, the adapter stays until the
 * last reference is released). The runner's slot and the engine's adapter
 * version change only inside engine_run_exclusive, between steps.
 *
 * One transaction per load, as deltas: the directory is read and checked
 * against the model while serving (lora_load: config, every tensor's name,
 * dtype and shape, the rank against --max-lora-rank); only then, between two
 * steps, the slot is pointed at the new adapter and its version moves
 * (load_inplace: the same slot, version + 1; requests already running on it
 * continue with the new weights, every later token carries the new version,
 * and K/V cached under the old one are never reused). Any refusal leaves the
 * served adapters as they were. Run-time loads read only files inside
 * --reload-root (as full reloads do; vLLM gates them behind
 * VLLM_ALLOW_RUNTIME_LORA_UPDATING).
 *
 * Memory: each adapter holds 4 * r * sum(in + out) bytes of its adapted
 * linears (2 * ... with --lora-dtype bfloat16; lora_bytes_as at r =
 * --max-lora-rank bounds a slot), so adapters take at most max_loras *
 * lora_bytes_as(max_lora_rank), logged at start-up; device backends also hold
 * a copy in the pool reserved at start-up (runner_reserve_lora: max_loras + 1
 * regions), and a failed copy there fails the load (the old adapter serves on).
 *
 * Not here: the adapter format (lora.h), the batched compute (forward.c).
 */
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#include "delta_sign.h"
#include "log.h"
#include "lora.h"
#include "routes.h"
#include "server.h"

enum { SLOT_FREE = 0, SLOT_LIVE, SLOT_DRAINING };

typedef struct LoraSlot {
    int state;
    char name[128];
    char path[1024];    /* as given (start-up flag or lora_path) */
    LoraAdapter *a;
    uint64_t version;   /* 0 at load, + 1 per load_inplace */
    int refs;           /* requests holding the slot */
    int64_t created;
} LoraSlot;

/* ---- the exclusive section: point a runner slot at an adapter ---- */
typedef struct SlotSet {
    Server *s;
    int slot;
    const LoraAdapter *a; /* NULL: clear */
    uint64_t version;
} SlotSet;

static int slot_set_fn(void *ctx, Err *err) {
    SlotSet *x = ctx;
    if (runner_set_lora(x->s->runner, x->slot, x->a, err)) return -1;
    if (x->a) engine_lora_changed(x->s->eng, x->slot, (uint32_t)x->version);
    return 0;
}

static int slot_set(Server *s, int slot, const LoraAdapter *a, uint64_t version, Err *err) {
    SlotSet x = {s, slot, a, version};
    return engine_run_exclusive(s->eng, slot_set_fn, &x, 0, err);
}

/* ---- lookups (under lora_mu) ---- */
static int find_locked(Server *s, const char *name, int state) {
    for (int i = 0; i < s->cfg.engine.max_loras; i++)
        if (s->lora_slots[i].state == state && !strcmp(s->lora_slots[i].name, name)) return i;
    return -1;
}

static int free_slot_locked(Server *s) {
    for (int i = 0; i < s->cfg.engine.max_loras; i++)
        if (s->lora_slots[i].state == SLOT_FREE) return i;
    return -1;
}

static int name_ok(const Server *s, const char *name, Err *err) {
    size_t n = strlen(name);
    ENSURE(err, n > 0 && n < sizeof ((LoraSlot *)0)->name, 400, "lora_name: must be 1..127 bytes");
    ENSURE(err, strcmp(name, s->model_name) != 0 && strcmp(name, s->model_dir) != 0, 400,
           "lora_name: '%s' is the base model's name", name);
    return 0;
}

/* Put adapter a (read and checked) into slot `slot` and make it LIVE under
 * name: the commit of a load. Takes a (freed on failure). */
static int install(Server *s, int slot, const char *name, const char *dir, LoraAdapter *a, int inplace, Err *err) {
    pthread_mutex_lock(&s->lora_mu);
    uint64_t version = inplace ? s->lora_slots[slot].version + 1 : 0;
    pthread_mutex_unlock(&s->lora_mu);
    if (version > ENGINE_LORA_VERSION_MAX) {
        lora_free(a);
        return ERR(err, 400, "load_inplace: adapter '%s' is at version %u, the last one (unload it and load it anew)",
                   name, ENGINE_LORA_VERSION_MAX);
    }
    if (slot_set(s, slot, a, version, err)) {
        lora_free(a);
        return -1;
    }
    pthread_mutex_lock(&s->lora_mu);
    LoraSlot *e = &s->lora_slots[slot];
    LoraAdapter *old = e->a; /* inplace: no step reads it any more */
    e->a = a;
    e->version = version;
    e->state = SLOT_LIVE;
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->path, sizeof e->path, "%s", dir);
    e->created = server_now_s();
    pthread_mutex_unlock(&s->lora_mu);
    lora_free(old);
    log_info("lora: %s adapter '%s' from %s into slot %d: rank %d, alpha %g%s, %d linears, %.1f KiB, version %llu",
             inplace ? "replaced" : "loaded", name, dir, slot, a->rank, a->alpha, a->rslora ? " (rsLoRA)" : "",
             a->n_targets, a->bytes / 1024.0, (unsigned long long)version);
    return 0;
}

/* Read dir for slot `slot` (not yet visible) and install it: the load transaction. */
static int load_into(Server *s, int slot, const char *name, const char *dir, const StOpener *op, int inplace,
                     Err *err) {
    LoraAdapter *a = NULL;
    char label[1200];
    snprintf(label, sizeof label, "LoRA adapter '%s' (%s)", name, dir);
    LoraLoadOpts lo = {s->cfg.max_lora_rank, (LoraDtype)s->cfg.lora_dtype};
    if (lora_load_opts(&a, &s->model->cfg, dir, &lo, op, label, err)) return -1;
    return install(s, slot, name, dir, a, inplace, err);
}

void lora_startup(Server *s) {
    pthread_mutex_init(&s->lora_mu, NULL);
    int n = s->cfg.engine.max_loras;
    s->lora_slots = xcalloc(n > 0 ? (size_t)n : 1, sizeof(LoraSlot));
    CHECK(s->cfg.n_loras <= n, "%d --lora adapters but --max-loras %d: raise --max-loras", s->cfg.n_loras, n);
    if (n > 0)
        log_info("lora: %d adapter slots, rank <= %d, stored as %s: at most %.1f MiB of adapters (%.1f MiB per slot)",
                 n, s->cfg.max_lora_rank, s->cfg.lora_dtype ? "bf16" : "f32",
                 n * (double)lora_bytes_as(&s->model->cfg, s->cfg.max_lora_rank, (LoraDtype)s->cfg.lora_dtype) / 1048576.0,
                 lora_bytes_as(&s->model->cfg, s->cfg.max_lora_rank, (LoraDtype)s->cfg.lora_dtype) / 1048576.0);
    for (int i = 0; i < s->cfg.n_loras; i++) {
        const char *arg = s->cfg.loras[i], *eq = strchr(arg, '=');
        CHECK(eq && eq > arg && eq[1], "--lora %s: expected NAME=DIR (a PEFT adapter directory)", arg);
        char name[128];
        CHECK((size_t)(eq - arg) < sizeof name, "--lora %s: the name is longer than 127 bytes", arg);
        memcpy(name, arg, (size_t)(eq - arg));
        name[eq - arg] = 0;
        Err err = {0};
        pthread_mutex_lock(&s->lora_mu);
        int dup = find_locked(s, name, SLOT_LIVE) >= 0, slot = free_slot_locked(s);
        pthread_mutex_unlock(&s->lora_mu);
        CHECK(!dup, "--lora %s: the name '%s' is given twice", arg, name);
        CHECK(name_ok(s, name, &err) == 0, "--lora %s: %s", arg, err.msg);
        CHECK(load_into(s, slot, name, eq + 1, NULL, 0, &err) == 0, "--lora %s: %s", arg, err.msg);
    }
}

void lora_shutdown(Server *s) {
    if (!s->lora_slots) return;
    for (int i = 0; i < s->cfg.engine.max_loras; i++) lora_free(s->lora_slots[i].a);
    free(s->lora_slots);
    s->lora_slots = NULL;
    pthread_mutex_destroy(&s->lora_mu);
}

int lora_model_acquire(Server *s, json_t *body, int *lora, char *name, size_t cap, Err *err) {
    *lora = 0;
    json_t *m = json_object_get(body, "model");
    if (!m || json_is_null(m)) return 0;
    ENSURE(err, json_is_string(m), 400, "model: must be a string");
    const char *v = json_string_value(m);
    if (!strcmp(v, s->model_name) || !strcmp(v, s->model_dir)) return 0;
    int slot = -1;
    if (s->lora_slots) { /* NULL: lora_startup did not run (engine-only servers) */
        pthread_mutex_lock(&s->lora_mu);
        slot = find_locked(s, v, SLOT_LIVE);
        if (slot >= 0) s->lora_slots[slot].refs++;
        pthread_mutex_unlock(&s->lora_mu);
    }
    ENSURE(err, slot >= 0, 404, "The model `%s` does not exist. This server serves `%s` and its LoRA adapters "
           "(GET /v1/models).", v, s->model_name);
    *lora = slot + 1;
    snprintf(name, cap, "%s", v);
    return 0;
}

/* An unloaded slot nobody holds: clear the runner's slot between steps, then free. */
static void drain(Server *s, int slot) {
    Err err = {0};
    if (slot_set(s, slot, NULL, 0, &err)) { /* cannot fail for NULL; keep the adapter if it ever does */
        log_error("lora: clearing slot %d failed: %s", slot, err.msg);
        return;
    }
    pthread_mutex_lock(&s->lora_mu);
    LoraSlot *e = &s->lora_slots[slot];
    LoraAdapter *a = e->a;
    memset(e, 0, sizeof *e);
    pthread_mutex_unlock(&s->lora_mu);
    lora_free(a);
}

void lora_release(Server *s, int lora) {
    if (lora <= 0) return;
    int slot = lora - 1, last;
    pthread_mutex_lock(&s->lora_mu);
    LoraSlot *e = &s->lora_slots[slot];
    ASSERT(e->refs > 0, "LoRA slot %d released more often than acquired", slot);
    last = --e->refs == 0 && e->state == SLOT_DRAINING;
    pthread_mutex_unlock(&s->lora_mu);
    if (last) drain(s, slot);
}

static json_t *card_locked(Server *s, const LoraSlot *e) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(e->name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(e->created));
    json_object_set_new(m, "owned_by", json_string("sampler"));
    json_object_set_new(m, "root", json_string(e->path));
    json_object_set_new(m, "parent", json_string(s->model_name));
    json_object_set_new(m, "max_model_len", json_integer(s->max_model_len));
    json_object_set_new(m, "lora_rank", json_integer(e->a->rank));
    json_object_set_new(m, "adapter_version", json_integer((json_int_t)e->version));
    return m;
}

void lora_model_cards(Server *s, json_t *list) {
    if (!s->lora_slots) return;
    pthread_mutex_lock(&s->lora_mu);
    for (int i = 0; i < s->cfg.engine.max_loras; i++)
        if (s->lora_slots[i].state == SLOT_LIVE) json_array_append_new(list, card_locked(s, &s->lora_slots[i]));
    pthread_mutex_unlock(&s->lora_mu);
}

json_t *lora_model_card(Server *s, const char *name) {
    if (!s->lora_slots) return NULL;
    pthread_mutex_lock(&s->lora_mu);
    int slot = find_locked(s, name, SLOT_LIVE);
    json_t *m = slot >= 0 ? card_locked(s, &s->lora_slots[slot]) : NULL;
    pthread_mutex_unlock(&s->lora_mu);
    return m;
}

/* ---- endpoints ---- */
static int get_string(json_t *body, const char *key, const char **out, Err *err) {
    json_t *v = json_object_get(body, key);
    ENSURE(err, json_is_string(v), 400, "%s: required, a string", key);
    *out = json_string_value(v);
    return 0;
}

static int load_request(Server *s, json_t *body, char *msg, size_t cap, Err *err) {
    const char *name, *path;
    if (get_string(body, "lora_name", &name, err) || get_string(body, "lora_path", &path, err) ||
        name_ok(s, name, err))
        return -1;
    json_t *li = json_object_get(body, "load_inplace");
    ENSURE(err, !li || json_is_boolean(li) || json_is_null(li), 400, "load_inplace: must be a boolean");
    int inplace = json_is_true(li);
    ENSURE(err, s->cfg.n_reload_roots > 0, 403, "lora_path: loading adapters at run time reads only files inside "
           "--reload-root, and this server has none (start it with --reload-root DIR)");
    pthread_mutex_lock(&s->lora_mu);
    int have = find_locked(s, name, SLOT_LIVE), slot = have >= 0 ? have : free_slot_locked(s);
    pthread_mutex_unlock(&s->lora_mu);
    ENSURE(err, have < 0 || inplace, 400, "The lora adapter '%s' has already been loaded. If you want to load the "
           "adapter in place, set 'load_inplace' to True.", name);
    ENSURE(err, slot >= 0, 400, "lora_name: all %d LoRA slots are in use (--max-loras); unload an adapter first",
           s->cfg.engine.max_loras);
    ReloadConfine c = {s, path};
    StOpener op = {reload_confined_open, &c, 0};
    if (load_into(s, slot, name, path, &op, have >= 0, err)) return -1;
    snprintf(msg, cap, "Success: LoRA adapter '%s' added successfully.", name);
    return 0;
}

int api_lora_load(HttpReq *q, json_t *body) {
    int ret;
    if (routes_admin_check(q, &ret)) return ret;
    Server *s = q->s;
    Err err = {0};
    char msg[256];
    pthread_mutex_lock(&s->admin_mu); /* one adapter change at a time, and none beside a weight update */
    int rc = load_request(s, body, msg, sizeof msg, &err);
    pthread_mutex_unlock(&s->admin_mu);
    if (rc) return http_send_err(q, &err);
    return http_send_text(q, 200, "text/plain; charset=utf-8", msg, strlen(msg));
}

int api_lora_unload(HttpReq *q, json_t *body) {
    int ret;
    if (routes_admin_check(q, &ret)) return ret;
    Server *s = q->s;
    Err err = {0};
    const char *name;
    if (get_string(body, "lora_name", &name, &err)) return http_send_err(q, &err);
    pthread_mutex_lock(&s->admin_mu);
    pthread_mutex_lock(&s->lora_mu);
    int slot = find_locked(s, name, SLOT_LIVE), now = 0;
    if (slot >= 0) {
        s->lora_slots[slot].state = SLOT_DRAINING; /* the name stops resolving at once */
        now = s->lora_slots[slot].refs == 0;
    }
    pthread_mutex_unlock(&s->lora_mu);
    if (now) drain(s, slot);
    pthread_mutex_unlock(&s->admin_mu);
    if (slot < 0) return http_send_error(q, 404, "lora_name", "The lora adapter '%s' cannot be found.", name);
    log_info("lora: unloaded adapter '%s' (slot %d%s)", name, slot, now ? "" : ", freed when its requests finish");
    char msg[256];
    snprintf(msg, sizeof msg, "Success: LoRA adapter '%s' removed successfully.", name);
    return http_send_text(q, 200, "text/plain; charset=utf-8", msg, strlen(msg));
}

/* ---- POST /admin/v1/lora: an adapter pushed by `trainer push-lora` ----
 * Body (docs/lora.md, "Pushed adapters"): "SLORA\x01\0\0", u32 LE n, n bytes
 * of JSON {"lora_name", "load_inplace", "adapter_config": {...}}, then the
 * adapter_model.safetensors image. With --delta-key-file the whole body must
 * carry a valid X-Delta-Signature (HMAC-SHA256), checked before any byte is
 * parsed, as for deltas. Then the same transaction as a load. */
#define LORA_PUSH_MAGIC "SLORA\x01\0\0"

static int push_request(Server *s, const uint8_t *b, size_t n, char *name, size_t cap, uint64_t *version, Err *err) {
    ENSURE(err, n >= 12 && memcmp(b, LORA_PUSH_MAGIC, 8) == 0, 400, "not a pushed LoRA adapter (`trainer "
           "push-lora` writes them; magic SLORA\\x01)");
    uint32_t hn = (uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
    ENSURE(err, hn <= n - 12 && hn <= (1u << 20), 400, "pushed adapter: header of %u bytes in a body of %zu", hn, n);
    json_error_t je;
    json_t *h = json_loadb((const char *)b + 12, hn, JSON_REJECT_DUPLICATES, &je);
    ENSURE(err, h && json_is_object(h), 400, "pushed adapter: header is not a JSON object: %s", h ? "" : je.text);
    const char *nm = json_string_value(json_object_get(h, "lora_name"));
    json_t *cfgj = json_object_get(h, "adapter_config"), *li = json_object_get(h, "load_inplace");
    int rc = 0;
    if (!nm) rc = ERR(err, 400, "lora_name: required, a string");
    else if (!json_is_object(cfgj)) rc = ERR(err, 400, "adapter_config: required, the adapter_config.json object");
    else if (li && !json_is_boolean(li)) rc = ERR(err, 400, "load_inplace: must be a boolean");
    else rc = name_ok(s, nm, err);
    char *cfg = rc ? NULL : json_dumps(cfgj, JSON_COMPACT);
    if (!rc && !cfg) rc = ERR(err, 503, "out of memory");
    int inplace = json_is_true(li), have = -1, slot = -1;
    if (!rc) {
        snprintf(name, cap, "%s", nm);
        pthread_mutex_lock(&s->lora_mu);
        have = find_locked(s, name, SLOT_LIVE);
        slot = have >= 0 ? have : free_slot_locked(s);
        pthread_mutex_unlock(&s->lora_mu);
        if (have >= 0 && !inplace)
            rc = ERR(err, 400, "The lora adapter '%s' has already been loaded. If you want to load the adapter in "
                     "place, set 'load_inplace' to True.", name);
        else if (slot < 0)
            rc = ERR(err, 400, "lora_name: all %d LoRA slots are in use (--max-loras); unload an adapter first",
                     s->cfg.engine.max_loras);
    }
    json_decref(h);
    LoraAdapter *a = NULL;
    char label[256];
    snprintf(label, sizeof label, "pushed LoRA adapter '%s'", name);
    LoraLoadOpts lo = {s->cfg.max_lora_rank, (LoraDtype)s->cfg.lora_dtype};
    if (!rc) rc = lora_from_memory_opts(&a, &s->model->cfg, cfg, strlen(cfg), b + 12 + hn, n - 12 - hn, &lo, label,
                                        err);
    free(cfg);
    if (!rc) rc = install(s, slot, name, "(pushed)", a, have >= 0, err);
    if (!rc) {
        pthread_mutex_lock(&s->lora_mu);
        *version = s->lora_slots[slot].version;
        pthread_mutex_unlock(&s->lora_mu);
    }
    return rc;
}

int api_lora_push(HttpReq *q, json_t *unused) {
    (void)unused;
    Server *s = q->s;
    Err err = {0};
    const uint8_t *b = (const uint8_t *)q->body.p;
    if (s->cfg.delta_key) {
        const char *sig = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, DELTA_SIG_HEADER);
        if (delta_verify(s->cfg.delta_key, s->cfg.delta_key_len, b, q->body.n, sig, &err) < 0) {
            log_warn("refused a pushed LoRA adapter: %s", err.msg);
            return http_send_error_code(q, 401, NULL, "invalid_delta_signature", "%s", err.msg);
        }
    }
    char name[128] = "";
    uint64_t version = 0;
    pthread_mutex_lock(&s->admin_mu);
    int rc = push_request(s, b, q->body.n, name, sizeof name, &version, &err);
    pthread_mutex_unlock(&s->admin_mu);
    if (rc) return http_send_err(q, &err);
    json_t *o = json_pack("{s:s, s:I}", "lora_name", name, "adapter_version", (json_int_t)version);
    return http_send_json(q, 200, o);
}
