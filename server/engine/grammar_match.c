/*
 * grammar_match.c - the token trie, the pushdown matcher and the mask cache
 * (grammar.h has the contract).
 *
 * A parser state is a set of stacks of NFA nodes (frames); the top frame is
 * where the innermost rule is, the ones below are return nodes. A state is
 * kept "expanded": every stack's top has byte edges (calls were entered,
 * finished rules popped), and `accept` records that some path popped the
 * last frame (the root rule ended). A byte moves each top along its byte
 * edges (scan), then the result is expanded again. Expansion deduplicates
 * stacks, so nullable loops terminate.
 *
 * The mask: for a stack whose top is node p, the tokens whose bytes stay
 * inside p's rule instance (calls below it may come and go) are accepted or
 * rejected whatever the frames under it are. Walking the token trie once from
 * the one-frame stack [p] (the walk's "escape" mode: popping that frame is an
 * escape, not an end) sorts every token into accepted / rejected /
 * dependent; a dependent token popped p's rule with bytes left, and the next
 * byte can follow the rule somewhere (FOLLOW). At run time the mask is the
 * union of the accepted sets of the tops, plus each dependent token run
 * through the full state. Entries are built on first use, under the
 * Grammar's lock, and kept with the grammar (grammar_cache.c keeps grammars).
 *
 * Depth: a cached acceptance is only used while every stack is at most
 * GRAMMAR_MAX_DEPTH / 2 deep (and entries count a token that nests deeper
 * than that as dependent), so no cached answer can differ from the full run;
 * deeper states take the exact trie walk over the full state.
 *
 * Not here: compiling (grammar_nfa.c), the compiled-grammar cache.
 */
#define _GNU_SOURCE /* qsort_r */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

/* ---- the vocabulary and its trie ---- */
struct GrammarVocab {
    int V, words, max_len;
    char *bytes;        /* all token bytes */
    int64_t *off;       /* [V] */
    int32_t *len;       /* [V], -1: never allowed */
    int32_t *sorted;    /* [n_tok] ids with bytes, by bytes */
    int n_tok;
    /* trie in preorder; node 0 is the root (the empty prefix) */
    int n_trie;
    uint8_t *tbyte;     /* [n_trie] the byte on the edge into the node */
    int32_t *tdepth;    /* [n_trie] */
    int32_t *tend;      /* [n_trie] first node after the subtree */
    int32_t *tterm0, *tterm1; /* [n_trie] sorted[] range of tokens that end here */
};

typedef struct TB { const GrammarVocab *v; int cap; } TB;

static int trie_grow(GrammarVocab *v, int *cap) {
    int c = *cap ? 2 * *cap : 1 << 16;
    v->tbyte = realloc(v->tbyte, (size_t)c);
    v->tdepth = realloc(v->tdepth, (size_t)c * 4);
    v->tend = realloc(v->tend, (size_t)c * 4);
    v->tterm0 = realloc(v->tterm0, (size_t)c * 4);
    v->tterm1 = realloc(v->tterm1, (size_t)c * 4);
    CHECK(v->tbyte && v->tdepth && v->tend && v->tterm0 && v->tterm1, "out of memory building the token trie");
    *cap = c;
    return 0;
}

static inline const uint8_t *tok_bytes(const GrammarVocab *v, int32_t id) { return (const uint8_t *)v->bytes + v->off[id]; }

/* sorted[lo, hi) share a prefix of `depth` bytes; node index already made. */
static void trie_build(GrammarVocab *v, int node, int lo, int hi, int depth, int *cap) {
    int i = lo;
    while (i < hi && v->len[v->sorted[i]] == depth) i++;
    v->tterm0[node] = lo;
    v->tterm1[node] = i;
    while (i < hi) {
        uint8_t b = tok_bytes(v, v->sorted[i])[depth];
        int j = i;
        while (j < hi && tok_bytes(v, v->sorted[j])[depth] == b) j++;
        if (v->n_trie == *cap) trie_grow(v, cap);
        int c = v->n_trie++;
        v->tbyte[c] = b;
        v->tdepth[c] = depth + 1;
        trie_build(v, c, i, j, depth + 1, cap);
        i = j;
    }
    v->tend[node] = v->n_trie;
}

static int cmp_tok(const void *a, const void *b, void *ctx) {
    const GrammarVocab *sort_v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int lx = sort_v->len[x], ly = sort_v->len[y];
    int c = memcmp(tok_bytes(sort_v, x), tok_bytes(sort_v, y), (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    return lx != ly ? (lx < ly ? -1 : 1) : (x < y ? -1 : 1);
}

GrammarVocab *grammar_vocab_create(int vocab, const char *const *bytes, const int32_t *lens) {
    GrammarVocab *v = xcalloc(1, sizeof *v);
    v->V = vocab;
    v->words = (vocab + 63) / 64;
    v->off = xmalloc((size_t)vocab * sizeof *v->off);
    v->len = xmalloc((size_t)vocab * sizeof *v->len);
    size_t total = 0;
    for (int i = 0; i < vocab; i++) total += lens[i] > 0 ? (size_t)lens[i] : 0;
    v->bytes = xmalloc(total + 1);
    v->sorted = xmalloc((size_t)vocab * sizeof *v->sorted);
    size_t o = 0;
    for (int i = 0; i < vocab; i++) {
        v->off[i] = (int64_t)o;
        v->len[i] = lens[i] > 0 ? lens[i] : -1;
        if (lens[i] > 0) {
            memcpy(v->bytes + o, bytes[i], (size_t)lens[i]);
            o += (size_t)lens[i];
            v->sorted[v->n_tok++] = i;
            if (lens[i] > v->max_len) v->max_len = lens[i];
        }
    }
    qsort_r(v->sorted, (size_t)v->n_tok, sizeof *v->sorted, cmp_tok, v);
    int cap = 0;
    trie_grow(v, &cap);
    v->n_trie = 1;
    v->tbyte[0] = 0;
    v->tdepth[0] = 0;
    trie_build(v, 0, 0, v->n_tok, 0, &cap);
    return v;
}

void grammar_vocab_free(GrammarVocab *v) {
    if (!v) return;
    free(v->bytes); free(v->off); free(v->len); free(v->sorted);
    free(v->tbyte); free(v->tdepth); free(v->tend); free(v->tterm0); free(v->tterm1);
    free(v);
}

int grammar_vocab_size(const GrammarVocab *v) { return v->V; }
int grammar_vocab_words(const GrammarVocab *v) { return v->words; }

/* ---- stack sets ---- */
typedef struct SS {
    int32_t *f;          /* [cap_f] frames of all stacks */
    int32_t *off, *len;  /* [cap_s] */
    int nf, n, cap_f, cap_s;
    int accept;          /* a path popped the last frame */
    int overflow;        /* a stack was dropped at a limit */
    int max_depth;
} SS;

typedef struct HSlot { uint32_t stamp; int32_t idx; } HSlot;
#define HASH_SLOTS 4096

typedef struct Exp {
    SS w;                /* the worklist: every stack seen in one expansion */
    HSlot *h;            /* [HASH_SLOTS] */
    uint32_t stamp;
    int depth_cap;
} Exp;

static size_t ss_bytes(int cap_f, int cap_s) { return (size_t)cap_f * 4 + (size_t)cap_s * 8; }

static void ss_init(SS *s, int32_t *mem, int cap_f, int cap_s) {
    memset(s, 0, sizeof *s);
    s->f = mem;
    s->off = mem + cap_f;
    s->len = mem + cap_f + cap_s;
    s->cap_f = cap_f;
    s->cap_s = cap_s;
}

static void ss_clear(SS *s) { s->nf = s->n = s->accept = s->overflow = s->max_depth = 0; }

/* Append a stack; 0, or -1 (overflow noted) at a limit. */
static int ss_push(SS *s, const int32_t *fr, int len) {
    if (s->n >= s->cap_s || s->nf + len > s->cap_f) { s->overflow = 1; return -1; }
    memcpy(s->f + s->nf, fr, (size_t)len * 4);
    s->off[s->n] = s->nf;
    s->len[s->n] = len;
    s->n++;
    s->nf += len;
    if (len > s->max_depth) s->max_depth = len;
    return 0;
}

static void ss_copy(SS *d, const SS *s) {
    memcpy(d->f, s->f, (size_t)s->nf * 4);
    memcpy(d->off, s->off, (size_t)s->n * 4);
    memcpy(d->len, s->len, (size_t)s->n * 4);
    d->nf = s->nf; d->n = s->n; d->accept = s->accept; d->overflow = s->overflow; d->max_depth = s->max_depth;
}

static uint32_t hash_frames(const int32_t *f, int len) {
    uint32_t h = 2166136261u ^ (uint32_t)len;
    for (int i = 0; i < len; i++) { h ^= (uint32_t)f[i]; h *= 16777619u; }
    return h;
}

/* Add the stack at the tail of x->w's frames (already written, len frames)
 * unless seen in this expansion. */
static void w_commit(Exp *x, int len) {
    SS *w = &x->w;
    const int32_t *fr = w->f + w->nf;
    uint32_t h = hash_frames(fr, len);
    for (uint32_t k = 0; k < HASH_SLOTS; k++) {
        HSlot *sl = &x->h[(h + k) & (HASH_SLOTS - 1)];
        if (sl->stamp != x->stamp) {
            if (w->n >= w->cap_s) { w->overflow = 1; return; }
            sl->stamp = x->stamp;
            sl->idx = w->n;
            w->off[w->n] = w->nf;
            w->len[w->n] = len;
            w->n++;
            w->nf += len;
            return;
        }
        if (w->len[sl->idx] == len && !memcmp(w->f + w->off[sl->idx], fr, (size_t)len * 4)) return;
    }
    w->overflow = 1;
}

/* src (any tops) -> dst (tops with byte edges), accept, overflow. */
static void expand(const Grammar *g, Exp *x, const SS *src, SS *dst) {
    ss_clear(dst);
    dst->overflow = src->overflow;
    /* the common case: one stack whose top only has byte edges */
    if (src->n == 1 && src->len[0] > 0) {
        const GNode *nd = &g->nodes[src->f[src->off[0] + src->len[0] - 1]];
        if (nd->nc == 0 && !nd->final) {
            ss_push(dst, src->f + src->off[0], src->len[0]);
            return;
        }
    }
    SS *w = &x->w;
    ss_clear(w);
    if (++x->stamp == 0) { memset(x->h, 0, HASH_SLOTS * sizeof *x->h); x->stamp = 1; }
    for (int i = 0; i < src->n; i++) {
        if (w->nf + src->len[i] > w->cap_f) { w->overflow = 1; break; }
        memcpy(w->f + w->nf, src->f + src->off[i], (size_t)src->len[i] * 4);
        w_commit(x, src->len[i]);
    }
    for (int i = 0; i < w->n; i++) {
        int len = w->len[i];
        if (len == 0) { dst->accept = 1; continue; }
        const int32_t *fr = w->f + w->off[i];
        int top = fr[len - 1];
        const GNode *nd = &g->nodes[top];
        if (nd->ne) ss_push(dst, fr, len);
        for (int c = 0; c < nd->nc; c++) {
            const GCall *cl = &g->calls[nd->c0 + c];
            if (len + 1 > x->depth_cap || w->nf + len + 1 > w->cap_f) { w->overflow = 1; continue; }
            int32_t *t = w->f + w->nf;
            fr = w->f + w->off[i];
            memcpy(t, fr, (size_t)(len - 1) * 4);
            t[len - 1] = cl->target;
            t[len] = g->rule_start[cl->rule];
            w_commit(x, len + 1);
        }
        if (nd->final) {
            if (w->nf + len - 1 > w->cap_f) { w->overflow = 1; continue; }
            fr = w->f + w->off[i];
            memmove(w->f + w->nf, fr, (size_t)(len - 1) * 4);
            w_commit(x, len - 1);
        }
    }
    if (w->overflow) dst->overflow = 1;
}

/* src (expanded) moved by one byte -> dst (not expanded). */
static void scan(const Grammar *g, const SS *src, unsigned b, SS *dst) {
    ss_clear(dst);
    dst->overflow = src->overflow;
    for (int i = 0; i < src->n; i++) {
        const int32_t *fr = src->f + src->off[i];
        int len = src->len[i];
        const GNode *nd = &g->nodes[fr[len - 1]];
        if (!cls_has(nd->first, b)) continue;
        for (int e = 0; e < nd->ne; e++) {
            const GEdge *ed = &g->edges[nd->e0 + e];
            if (!cls_has(g->cls[ed->cls], b)) continue;
            if (ss_push(dst, fr, len) == 0) dst->f[dst->nf - 1] = ed->target;
        }
    }
}

/* ---- matchers ---- */
#define M_FRAMES GRAMMAR_MAX_FRAMES
#define M_STACKS GRAMMAR_MAX_STACKS
#define W_FRAMES (2 * GRAMMAR_MAX_FRAMES)
#define W_STACKS (2 * GRAMMAR_MAX_STACKS)

struct GrammarMatcher {
    Grammar *g;
    SS cur, a, b;        /* the state (expanded), scratch */
    Exp x;
    int done, dead;
    int limited;         /* a run since the last fill_mask / accept was cut at a limit */
    int32_t *mem;
};

static size_t matcher_mem_ints(void) {
    return 3 * (ss_bytes(M_FRAMES, M_STACKS) / 4) + ss_bytes(W_FRAMES, W_STACKS) / 4 + HASH_SLOTS * 2;
}

size_t grammar_matcher_bytes(void) { return sizeof(GrammarMatcher) + matcher_mem_ints() * 4; }

static void exp_init(Exp *x, int32_t *mem, int cap_f, int cap_s, int depth_cap) {
    ss_init(&x->w, mem, cap_f, cap_s);
    x->h = (HSlot *)(mem + ss_bytes(cap_f, cap_s) / 4);
    x->stamp = 0;
    x->depth_cap = depth_cap;
}

void grammar_matcher_reset(GrammarMatcher *m) {
    Grammar *g = m->g;
    ss_clear(&m->a);
    int32_t st = g->rule_start[g->root];
    ss_push(&m->a, &st, 1);
    expand(g, &m->x, &m->a, &m->cur);
    m->done = 0;
    m->dead = m->cur.overflow;
}

GrammarMatcher *grammar_matcher_create(Grammar *g) {
    GrammarMatcher *m = calloc(1, sizeof *m);
    int32_t *mem = calloc(matcher_mem_ints(), 4);
    if (!m || !mem) { free(m); free(mem); return NULL; }
    m->mem = mem;
    size_t k = ss_bytes(M_FRAMES, M_STACKS) / 4;
    ss_init(&m->cur, mem, M_FRAMES, M_STACKS);
    ss_init(&m->a, mem + k, M_FRAMES, M_STACKS);
    ss_init(&m->b, mem + 2 * k, M_FRAMES, M_STACKS);
    exp_init(&m->x, mem + 3 * k, W_FRAMES, W_STACKS, GRAMMAR_MAX_DEPTH);
    m->g = g;
    grammar_ref(g);
    grammar_matcher_reset(m);
    return m;
}

void grammar_matcher_free(GrammarMatcher *m) {
    if (!m) return;
    grammar_unref(m->g);
    free(m->mem);
    free(m);
}

int grammar_matcher_done(const GrammarMatcher *m) { return m->done; }
int grammar_matcher_can_end(const GrammarMatcher *m) { return m->cur.accept; }

/* Run bytes from m->cur; the end state in m->a (expanded). 1 when alive at the end. */
static int run_bytes(GrammarMatcher *m, const uint8_t *s, int n) {
    const SS *src = &m->cur;
    for (int i = 0; i < n; i++) {
        scan(m->g, src, s[i], &m->b);
        if (m->b.overflow) { m->limited = 1; return 0; }
        if (m->b.n == 0) return 0;
        expand(m->g, &m->x, &m->b, &m->a);
        if (m->a.overflow) { m->limited = 1; return 0; }
        src = &m->a;
    }
    return n > 0 && (m->a.n > 0 || m->a.accept);
}

static int is_end(int32_t t, const int32_t *end, int n_end) {
    for (int i = 0; i < n_end; i++) if (end[i] == t) return 1;
    return 0;
}

int grammar_matcher_limited(const GrammarMatcher *m) { return m->limited; }

int grammar_matcher_accept_bytes(GrammarMatcher *m, const char *s, size_t n) {
    m->limited = 0;
    if (m->done || m->dead || n == 0) return n == 0 ? 0 : -1;
    if (!run_bytes(m, (const uint8_t *)s, (int)n)) return -1;
    ss_copy(&m->cur, &m->a);
    return 0;
}

int grammar_matcher_accept(GrammarMatcher *m, int32_t token, const int32_t *end_ids, int n_end) {
    const GrammarVocab *v = m->g->v;
    if (m->done || m->dead || token < 0 || token >= v->V) return -1;
    if (is_end(token, end_ids, n_end)) {
        if (!m->cur.accept) return -1;
        m->done = 1;
        return 0;
    }
    if (v->len[token] <= 0) return -1;
    return grammar_matcher_accept_bytes(m, (const char *)tok_bytes(v, token), (size_t)v->len[token]);
}

/* ---- the trie walk ---- */
typedef struct Walk {
    int levels;
    SS *lv;              /* [levels] expanded states per depth */
    SS tmp;
    Exp x;
    uint8_t *esc_in, *esc_at; /* [levels] */
    int32_t *acc, *dep;  /* [V] outputs */
    int n_acc, n_dep;
    int32_t *mem;
} Walk;

#define WALK_FRAMES 2048
#define WALK_STACKS 128

static Walk *walk_create(const GrammarVocab *v) {
    Walk *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->levels = v->max_len + 2;
    size_t per = ss_bytes(WALK_FRAMES, WALK_STACKS) / 4;
    size_t ints = per * (size_t)(w->levels + 1) + ss_bytes(W_FRAMES, W_STACKS) / 4 + HASH_SLOTS * 2;
    w->mem = calloc(ints, 4);
    w->lv = calloc((size_t)w->levels, sizeof *w->lv);
    w->esc_in = calloc((size_t)w->levels, 1);
    w->esc_at = calloc((size_t)w->levels, 1);
    w->acc = malloc((size_t)v->V * 4);
    w->dep = malloc((size_t)v->V * 4);
    if (!w->mem || !w->lv || !w->esc_in || !w->esc_at || !w->acc || !w->dep) {
        free(w->mem); free(w->lv); free(w->esc_in); free(w->esc_at); free(w->acc); free(w->dep); free(w);
        return NULL;
    }
    for (int i = 0; i < w->levels; i++) ss_init(&w->lv[i], w->mem + per * (size_t)i, WALK_FRAMES, WALK_STACKS);
    ss_init(&w->tmp, w->mem + per * (size_t)w->levels, WALK_FRAMES, WALK_STACKS);
    exp_init(&w->x, w->mem + per * (size_t)(w->levels + 1), W_FRAMES, W_STACKS, GRAMMAR_MAX_DEPTH);
    return w;
}

static void walk_free(Walk *w) {
    if (!w) return;
    free(w->mem); free(w->lv); free(w->esc_in); free(w->esc_at); free(w->acc); free(w->dep); free(w);
}

/* Walk the trie from init (expanded; copied into level 0). escape mode:
 * popping init's bottom frame escapes (follow: bytes that may come next),
 * tokens sort into acc / dep; otherwise popping it ends the grammar and
 * tokens go to acc or nowhere. A state over the walk's limits makes its
 * tokens dependent (escape mode) or is an overflow (set *overflow). */
static void walk_run(const Grammar *g, Walk *w, const SS *init, int escape, const uint64_t follow[4],
                     int *overflow) {
    const GrammarVocab *v = g->v;
    w->n_acc = w->n_dep = 0;
    if (init->nf > WALK_FRAMES || init->n > WALK_STACKS) { *overflow = 1; return; }
    ss_copy(&w->lv[0], init);
    w->lv[0].accept = 0;
    w->esc_in[0] = 0;
    w->esc_at[0] = 0;
    w->x.depth_cap = escape ? GRAMMAR_MAX_DEPTH / 2 : GRAMMAR_MAX_DEPTH;
    int i = 1;
    while (i < v->n_trie) {
        int d = v->tdepth[i];
        unsigned b = v->tbyte[i];
        SS *par = &w->lv[d - 1], *cur = &w->lv[d];
        int ein = w->esc_in[d - 1] || (w->esc_at[d - 1] && cls_has(follow, b));
        if (par->n > 0) {
            scan(g, par, b, &w->tmp);
            if (w->tmp.n > 0) expand(g, &w->x, &w->tmp, cur);
            else ss_clear(cur);
        } else ss_clear(cur);
        if (cur->overflow) {
            if (escape) ein = 1;
            else *overflow = 1;
            ss_clear(cur);
        }
        w->esc_in[d] = (uint8_t)ein;
        w->esc_at[d] = (uint8_t)(escape && cur->accept);
        int alive = cur->n > 0 || cur->accept;
        for (int t = v->tterm0[i]; t < v->tterm1[i]; t++) {
            if (alive) w->acc[w->n_acc++] = v->sorted[t];
            else if (ein) w->dep[w->n_dep++] = v->sorted[t];
        }
        if (cur->n == 0 && !w->esc_in[d] && !w->esc_at[d]) { i = v->tend[i]; continue; }
        if (cur->n == 0 && w->esc_in[d]) {
            /* nothing alive, every longer token depends on the context */
            for (int t = v->tterm1[i]; t < (v->tend[i] < v->n_trie ? v->tterm0[v->tend[i]] : v->n_tok); t++)
                w->dep[w->n_dep++] = v->sorted[t];
            i = v->tend[i];
            continue;
        }
        i++;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Entry for top node p, built on first use. NULL when out of memory, or
 * (*full = 1) when the cache is at its budget and p's entry is not in it. */
static const MaskEntry *entry_get(Grammar *g, int p, int *full) {
    MaskEntry *e = &g->cache[p];
    if (atomic_load_explicit(&e->ready, memory_order_acquire)) return e;
    pthread_mutex_lock(&g->mu);
    if (!atomic_load_explicit(&e->ready, memory_order_relaxed)) {
        if (g->cache_bytes >= g->cache_max) {
            pthread_mutex_unlock(&g->mu);
            *full = 1;
            return NULL;
        }
        if (!g->walk) g->walk = walk_create(g->v);
        Walk *w = g->walk;
        if (!w) { pthread_mutex_unlock(&g->mu); return NULL; }
        SS one;
        int32_t mem[3];
        ss_init(&one, mem, 1, 1);
        ss_push(&one, &p, 1);
        int ovf = 0;
        walk_run(g, w, &one, 1, g->follow[g->nodes[p].rule], &ovf);
        const GrammarVocab *v = g->v;
        int use_bits = (size_t)w->n_acc * 32 > (size_t)v->V;
        e->n_acc = w->n_acc;
        e->n_dep = w->n_dep;
        if (use_bits) {
            e->acc_bits = calloc((size_t)v->words, 8);
            if (e->acc_bits) for (int k = 0; k < w->n_acc; k++) e->acc_bits[w->acc[k] >> 6] |= 1ull << (w->acc[k] & 63);
        } else if (w->n_acc) {
            e->acc = malloc((size_t)w->n_acc * 4);
            if (e->acc) memcpy(e->acc, w->acc, (size_t)w->n_acc * 4);
        }
        if (w->n_dep) {
            e->dep = malloc((size_t)w->n_dep * 4);
            if (e->dep) {
                memcpy(e->dep, w->dep, (size_t)w->n_dep * 4);
                qsort(e->dep, (size_t)w->n_dep, 4, cmp_i32);
            }
        }
        if ((use_bits && !e->acc_bits) || (!use_bits && w->n_acc && !e->acc) || (w->n_dep && !e->dep)) {
            free(e->acc_bits); free(e->acc); free(e->dep);
            memset(e, 0, sizeof *e);
            pthread_mutex_unlock(&g->mu);
            return NULL;
        }
        g->cache_bytes += use_bits ? (size_t)v->words * 8 : (size_t)w->n_acc * 4;
        g->cache_bytes += (size_t)w->n_dep * 4;
        atomic_store_explicit(&e->ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&g->mu);
    return e;
}

void grammar_cache_entries_free(Grammar *g) {
    for (int i = 0; i < g->n_nodes && g->cache; i++) {
        free(g->cache[i].acc); free(g->cache[i].acc_bits); free(g->cache[i].dep);
    }
    walk_free(g->walk);
    g->walk = NULL;
}

static int finish_mask(GrammarMatcher *m, uint64_t *bits, const int32_t *end_ids, int n_end) {
    const GrammarVocab *v = m->g->v;
    if (m->cur.accept)
        for (int i = 0; i < n_end; i++)
            if (end_ids[i] >= 0 && end_ids[i] < v->V) bits[end_ids[i] >> 6] |= 1ull << (end_ids[i] & 63);
    int n = 0;
    for (int i = 0; i < v->words; i++) n += __builtin_popcountll(bits[i]);
    return n;
}

int grammar_matcher_fill_mask_slow(GrammarMatcher *m, uint64_t *bits, const int32_t *end_ids, int n_end) {
    const GrammarVocab *v = m->g->v;
    memset(bits, 0, (size_t)v->words * 8);
    m->limited = 0;
    if (m->done || m->dead) return 0;
    for (int t = 0; t < v->V; t++)
        if (v->len[t] > 0 && run_bytes(m, tok_bytes(v, t), v->len[t])) bits[t >> 6] |= 1ull << (t & 63);
    return finish_mask(m, bits, end_ids, n_end);
}

/* The exact mask over the matcher's whole state by one walk, without the
 * cache (states too deep for it, or a cache at its budget); under the
 * grammar's lock (its walk scratch). */
static int fill_exact(GrammarMatcher *m, uint64_t *bits, const int32_t *end_ids, int n_end) {
    Grammar *g = m->g;
    const GrammarVocab *v = g->v;
    const SS *T = &m->cur;
    memset(bits, 0, (size_t)v->words * 8);
    pthread_mutex_lock(&g->mu);
    if (!g->walk) g->walk = walk_create(v);
    int ovf = 0;
    if (g->walk) {
        uint64_t none[4] = { 0 };
        walk_run(g, g->walk, T, 0, none, &ovf);
        for (int k = 0; k < g->walk->n_acc; k++) bits[g->walk->acc[k] >> 6] |= 1ull << (g->walk->acc[k] & 63);
    }
    int ok = g->walk && !ovf;
    pthread_mutex_unlock(&g->mu);
    if (!ok) { memset(bits, 0, (size_t)v->words * 8); m->dead = 1; return 0; }
    return finish_mask(m, bits, end_ids, n_end);
}

int grammar_matcher_fill_mask(GrammarMatcher *m, uint64_t *bits, const int32_t *end_ids, int n_end) {
    Grammar *g = m->g;
    const GrammarVocab *v = g->v;
    memset(bits, 0, (size_t)v->words * 8);
    m->limited = 0;
    if (m->done || m->dead) return 0;
    const SS *T = &m->cur;
    if (T->max_depth > GRAMMAR_MAX_DEPTH / 2) return fill_exact(m, bits, end_ids, n_end);
    int32_t tops[M_STACKS];
    int nt = 0;
    for (int i = 0; i < T->n; i++) {
        int32_t p = T->f[T->off[i] + T->len[i] - 1];
        int dup = 0;
        for (int k = 0; k < nt && !dup; k++) dup = tops[k] == p;
        if (!dup) tops[nt++] = p;
    }
    for (int k = 0; k < nt; k++) {
        int full = 0;
        const MaskEntry *e = entry_get(g, tops[k], &full);
        if (full) return fill_exact(m, bits, end_ids, n_end); /* memset by it */
        if (!e) { m->dead = 1; memset(bits, 0, (size_t)v->words * 8); return 0; }
        if (e->acc_bits) for (int i = 0; i < v->words; i++) bits[i] |= e->acc_bits[i];
        else for (int i = 0; i < e->n_acc; i++) bits[e->acc[i] >> 6] |= 1ull << (e->acc[i] & 63);
    }
    for (int k = 0; k < nt; k++) {
        const MaskEntry *e = &g->cache[tops[k]];
        for (int i = 0; i < e->n_dep; i++) {
            int32_t t = e->dep[i];
            if ((bits[t >> 6] >> (t & 63)) & 1) continue;
            if (run_bytes(m, tok_bytes(v, t), v->len[t])) bits[t >> 6] |= 1ull << (t & 63);
        }
    }
    return finish_mask(m, bits, end_ids, n_end);
}
