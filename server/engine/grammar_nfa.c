/*
 * grammar_nfa.c - expression trees (grammar_parse.c) to one epsilon-free NFA
 * per rule: Thompson construction with epsilon edges, then each node takes
 * the byte and call edges of its epsilon closure. Checks here, each a 400
 * naming the rule: a rule used but not defined, a rule that matches no
 * string, left recursion (a rule that can call itself before consuming a
 * byte). Also the FOLLOW byte sets the mask cache uses to drop tokens that
 * cannot continue after a rule in any context.
 *
 * Not here: parsing text (grammar_parse.c), matching (grammar_match.c).
 */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

#define TMP_MAX_NODES (4 * GRAMMAR_MAX_NODES)

typedef struct TEdge { int32_t from, kind, x, to; } TEdge; /* kind 0 eps, 1 byte (x = class), 2 call (x = rule) */

typedef struct B {
    Ast *a;
    uint8_t *inl;       /* [n_rules] 1: the rule is built in place where it is used */
    int n_nodes;
    int32_t *rule_of; int cap_nodes;
    TEdge *e; int n_e, cap_e;
    uint64_t (*cls)[4]; int n_cls, cap_cls;
    int failed;
} B;

static int new_node(B *b, int rule) {
    if (b->failed || b->n_nodes >= TMP_MAX_NODES) { b->failed = 1; return 0; }
    if (b->n_nodes == b->cap_nodes) {
        int cap = b->cap_nodes ? 2 * b->cap_nodes : 1024;
        int32_t *p = realloc(b->rule_of, (size_t)cap * sizeof *p);
        if (!p) { b->failed = 1; return 0; }
        b->rule_of = p;
        b->cap_nodes = cap;
    }
    b->rule_of[b->n_nodes] = rule;
    return b->n_nodes++;
}

static void add_edge(B *b, int from, int kind, int x, int to) {
    if (b->failed) return;
    if (b->n_e == b->cap_e) {
        int cap = b->cap_e ? 2 * b->cap_e : 1024;
        TEdge *p = realloc(b->e, (size_t)cap * sizeof *p);
        if (!p) { b->failed = 1; return; }
        b->e = p;
        b->cap_e = cap;
    }
    b->e[b->n_e++] = (TEdge){ from, kind, x, to };
}

static int add_cls(B *b, const uint64_t c[4]) {
    if (b->failed) return 0;
    if (b->n_cls == b->cap_cls) {
        int cap = b->cap_cls ? 2 * b->cap_cls : 256;
        void *p = realloc(b->cls, (size_t)cap * sizeof *b->cls);
        if (!p) { b->failed = 1; return 0; }
        b->cls = p;
        b->cap_cls = cap;
    }
    memcpy(b->cls[b->n_cls], c, sizeof b->cls[0]);
    return b->n_cls++;
}

/* Build node x from s; returns the end node (fresh, or s for an empty match). */
static int build(B *b, int x, int s, int rule, int depth) {
    if (b->failed) return s;
    if (depth > 2000) { b->failed = 1; return s; }
    const AstNode n = b->a->nodes[x];
    switch (n.kind) {
    case AST_EMPTY: return s;
    case AST_CLASS: {
        int e = new_node(b, rule);
        add_edge(b, s, 1, add_cls(b, n.cls), e);
        return e;
    }
    case AST_REF: {
        if (b->inl[n.a]) return build(b, b->a->body[n.a], s, rule, depth + 1);
        int e = new_node(b, rule);
        add_edge(b, s, 2, n.a, e);
        return e;
    }
    case AST_SEQ:
    case AST_ALT: {
        /* chains (literals, long choice lists) are left-deep: walk the spine
         * instead of recursing along it */
        int len = 0;
        for (int y = x; b->a->nodes[y].kind == n.kind; y = b->a->nodes[y].a) len++;
        int32_t *parts = malloc((size_t)(len + 1) * sizeof *parts);
        if (!parts) { b->failed = 1; return s; }
        int y = x;
        for (int k = len; k > 0; k--) { parts[k] = b->a->nodes[y].b; y = b->a->nodes[y].a; }
        parts[0] = y;
        int end = s;
        if (n.kind == AST_SEQ) {
            for (int k = 0; k <= len && !b->failed; k++) end = build(b, parts[k], end, rule, depth + 1);
        } else {
            end = new_node(b, rule);
            for (int k = 0; k <= len && !b->failed; k++) {
                int st = new_node(b, rule);
                add_edge(b, s, 0, 0, st);
                add_edge(b, build(b, parts[k], st, rule, depth + 1), 0, 0, end);
            }
        }
        free(parts);
        return end;
    }
    case AST_REP: {
        int cur = s;
        for (int i = 0; i < n.lo && !b->failed; i++) {
            int st = new_node(b, rule);
            add_edge(b, cur, 0, 0, st);
            cur = build(b, n.a, st, rule, depth + 1);
        }
        if (n.hi < 0) { /* star */
            int l = new_node(b, rule), body = new_node(b, rule), e = new_node(b, rule);
            add_edge(b, cur, 0, 0, l);
            add_edge(b, l, 0, 0, body);
            add_edge(b, build(b, n.a, body, rule, depth + 1), 0, 0, l);
            add_edge(b, l, 0, 0, e);
            return e;
        }
        /* hi - lo optional copies, nested: cur (child (child ...)?)? */
        int e = new_node(b, rule);
        for (int i = n.lo; i < n.hi && !b->failed; i++) {
            int st = new_node(b, rule);
            add_edge(b, cur, 0, 0, e);
            add_edge(b, cur, 0, 0, st);
            cur = build(b, n.a, st, rule, depth + 1);
        }
        add_edge(b, cur, 0, 0, e);
        return e;
    }
    }
    return s;
}

static int cmp_edge(const void *x, const void *y) {
    const TEdge *a = x, *b = y;
    return a->from != b->from ? (a->from < b->from ? -1 : 1) : 0;
}

Grammar *grammar_alloc(const GrammarVocab *v) {
    Grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    atomic_init(&g->refs, 1);
    g->v = v;
    pthread_mutex_init(&g->mu, NULL);
    g->cache_max = GRAMMAR_CACHE_MAX_BYTES;
    return g;
}

/* Mark the rules that can reach themselves through references (rule graph
 * DFS from each rule). */
static void ast_refs(const Ast *a, int x, uint8_t *seen_rule, int32_t *stack, int *top, int32_t *work) {
    int nw = 0; /* work holds at most one pending right child per node */
    work[nw++] = x;
    while (nw > 0) {
        const AstNode *n = &a->nodes[work[--nw]];
        switch (n->kind) {
        case AST_REF:
            if (!seen_rule[n->a]) { seen_rule[n->a] = 1; stack[(*top)++] = n->a; }
            break;
        case AST_SEQ: case AST_ALT: work[nw++] = n->a; work[nw++] = n->b; break;
        case AST_REP: work[nw++] = n->a; break;
        default: break;
        }
    }
}

/* Inlining: a rule that is not recursive is built in place of each use, so
 * its bytes belong to the caller's rule instance and the caller's mask
 * entries take them in any context (a one-character rule called in a loop
 * would otherwise make every longer token context-dependent). The shared
 * UTF-8 rule stays a call. */
static int mark_inline(const Ast *a, uint8_t *inl) {
    int R = a->n_rules;
    uint8_t *seen = calloc((size_t)R, 1);
    int32_t *stack = malloc((size_t)R * sizeof *stack), *work = malloc((size_t)(a->n + 1) * sizeof *work);
    if (!seen || !stack || !work) { free(seen); free(stack); free(work); return -1; }
    for (int r = 0; r < R; r++) {
        memset(seen, 0, (size_t)R);
        int top = 0;
        ast_refs(a, a->body[r], seen, stack, &top, work);
        while (top > 0) {
            int x = stack[--top];
            if (x == r) break;
            ast_refs(a, a->body[x], seen, stack, &top, work);
        }
        inl[r] = !seen[r] && r != a->root;
    }
    free(seen);
    free(stack);
    free(work);
    return 0;
}

int grammar_build(Ast *a, Grammar *g, Err *err) {
    for (int r = 0; r < a->n_rules; r++)
        ENSURE(err, a->body[r] >= 0, 400, "grammar: rule `%s` is used but not defined", a->names[r]);
    B b = { .a = a };
    int R = a->n_rules;
    ENSURE(err, R > 0 && R <= 65536 && a->root >= 0, 400, "grammar: no rules");
    int32_t *starts = calloc((size_t)R, sizeof *starts), *ends = calloc((size_t)R, sizeof *ends);
    int rc = -1;
    int32_t *map = NULL, *stk = NULL, *mark = NULL;
    uint8_t *prod = NULL, *nulln = NULL, *nullr = NULL, *seen = NULL;
    b.inl = calloc((size_t)R, 1);
    if (!starts || !ends || !b.inl || mark_inline(a, b.inl) < 0) goto oom;
    for (int r = 0; r < R; r++) {
        starts[r] = new_node(&b, r);
        ends[r] = build(&b, a->body[r], starts[r], r, 0);
    }
    if (b.failed) {
        ERR(err, 400, "grammar too large: over %d NFA nodes (lower maxLength / repetition counts or the "
            "number of properties)", TMP_MAX_NODES);
        goto out;
    }
    int T = b.n_nodes;
    if (b.n_e) qsort(b.e, (size_t)b.n_e, sizeof *b.e, cmp_edge);
    int32_t *off = calloc((size_t)T + 1, sizeof *off);
    if (!off) goto oom;
    for (int i = 0; i < b.n_e; i++) off[b.e[i].from + 1]++;
    for (int i = 0; i < T; i++) off[i + 1] += off[i];
    uint8_t *isend = calloc((size_t)T, 1);
    map = malloc((size_t)T * sizeof *map);
    stk = malloc((size_t)T * sizeof *stk);
    mark = malloc((size_t)T * sizeof *mark);
    if (!isend || !map || !stk || !mark) { free(off); free(isend); goto oom; }
    for (int r = 0; r < R; r++) isend[ends[r]] = 1;
    /* keep: rule starts and targets of non-epsilon edges; number them */
    for (int i = 0; i < T; i++) map[i] = -1;
    int N = 0;
    for (int r = 0; r < R; r++) if (map[starts[r]] < 0) map[starts[r]] = N++;
    for (int i = 0; i < b.n_e; i++) if (b.e[i].kind != 0 && map[b.e[i].to] < 0) map[b.e[i].to] = N++;
    if (N > GRAMMAR_MAX_NODES) {
        free(off); free(isend);
        ERR(err, 400, "grammar too large: %d NFA nodes, at most %d (lower maxLength / repetition counts or the "
            "number of properties)", N, GRAMMAR_MAX_NODES);
        goto out;
    }
    g->n_nodes = N;
    g->n_rules = R;
    g->nodes = calloc((size_t)N, sizeof *g->nodes);
    g->rule_start = malloc((size_t)R * sizeof *g->rule_start);
    g->follow = calloc((size_t)R, sizeof *g->follow);
    g->cache = calloc((size_t)N, sizeof *g->cache);
    GEdge *edges = NULL; GCall *calls = NULL;
    int ne = 0, nc = 0, cap_ed = 1024, cap_ca = 256;
    edges = malloc((size_t)cap_ed * sizeof *edges);
    calls = malloc((size_t)cap_ca * sizeof *calls);
    if (!g->nodes || !g->rule_start || !g->follow || !g->cache || !edges || !calls) {
        free(off); free(isend); free(edges); free(calls); goto oom;
    }
    for (int r = 0; r < R; r++) g->rule_start[r] = map[starts[r]];
    for (int i = 0; i < T; i++) mark[i] = -1;
    /* closure of every kept node, in the order of its new number */
    int32_t *order = malloc((size_t)N * sizeof *order);
    if (!order) { free(off); free(isend); free(edges); free(calls); goto oom; }
    for (int i = 0; i < T; i++) if (map[i] >= 0) order[map[i]] = i;
    /* closures can be quadratic in the node count (nested repetitions with
     * empty paths): a budget of steps, over it the grammar is refused */
    long long work = 0, budget = 50LL * 1000 * 1000;
    for (int k = 0; k < N; k++) {
        if (work > budget) {
            free(order); free(off); free(isend); free(edges); free(calls);
            ERR(err, 400, "grammar too large or too ambiguous: building its automaton takes over %lld steps "
                "(simplify nested repetitions such as (a+)+ or lower the repetition counts)", budget);
            goto out;
        }
        int src = order[k];
        GNode *nd = &g->nodes[k];
        nd->rule = b.rule_of[src];
        nd->e0 = ne;
        nd->c0 = nc;
        int top = 0;
        stk[top++] = src;
        mark[src] = k;
        while (top > 0) {
            int x = stk[--top];
            work += 1 + (ne - nd->e0) + (nc - nd->c0);
            if (isend[x] && b.rule_of[x] == nd->rule) nd->final = 1;
            for (int j = off[x]; j < off[x + 1]; j++) {
                const TEdge *te = &b.e[j];
                if (te->kind == 0) {
                    if (mark[te->to] != k) { mark[te->to] = k; stk[top++] = te->to; }
                } else if (te->kind == 1) {
                    int merged = 0; /* one edge per target: OR the classes */
                    for (int q = nd->e0; q < ne; q++)
                        if (edges[q].target == map[te->to]) {
                            for (int w = 0; w < 4; w++) b.cls[edges[q].cls][w] |= b.cls[te->x][w];
                            merged = 1;
                            break;
                        }
                    if (merged) continue;
                    if (ne == cap_ed) {
                        cap_ed *= 2;
                        GEdge *p = realloc(edges, (size_t)cap_ed * sizeof *p);
                        if (!p) { free(order); free(off); free(isend); free(edges); free(calls); goto oom; }
                        edges = p;
                    }
                    /* a private copy of the class: merging must not change other edges */
                    uint64_t cc[4];
                    memcpy(cc, b.cls[te->x], sizeof cc);
                    int c = add_cls(&b, cc);
                    edges[ne++] = (GEdge){ c, map[te->to] };
                } else {
                    int dup = 0;
                    for (int q = nd->c0; q < nc; q++)
                        if (calls[q].rule == te->x && calls[q].target == map[te->to]) dup = 1;
                    if (dup) continue;
                    if (nc == cap_ca) {
                        cap_ca *= 2;
                        GCall *p = realloc(calls, (size_t)cap_ca * sizeof *p);
                        if (!p) { free(order); free(off); free(isend); free(edges); free(calls); goto oom; }
                        calls = p;
                    }
                    calls[nc++] = (GCall){ te->x, map[te->to] };
                }
            }
        }
        nd->ne = ne - nd->e0;
        nd->nc = nc - nd->c0;
    }
    free(order);
    free(off);
    free(isend);
    if (b.failed) { free(edges); free(calls); goto oom; }
    g->edges = edges; g->n_edges = ne;
    g->calls = calls; g->n_calls = nc;
    g->cls = b.cls; g->n_cls = b.n_cls;
    b.cls = NULL;
    for (int k = 0; k < N; k++) {
        GNode *nd = &g->nodes[k];
        for (int q = 0; q < nd->ne; q++)
            for (int w = 0; w < 4; w++) nd->first[w] |= g->cls[g->edges[nd->e0 + q].cls][w];
    }
    /* productive nodes (can reach an end), fixpoint in reverse order */
    prod = calloc((size_t)N, 1);
    nulln = calloc((size_t)N, 1);
    nullr = calloc((size_t)R, 1);
    seen = calloc((size_t)N, 1);
    if (!prod || !nulln || !nullr || !seen) goto oom;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int k = N - 1; k >= 0; k--) {
            if (prod[k]) continue;
            const GNode *nd = &g->nodes[k];
            int p = nd->final;
            for (int q = 0; q < nd->ne && !p; q++) {
                const uint64_t *c = g->cls[g->edges[nd->e0 + q].cls];
                p = prod[g->edges[nd->e0 + q].target] && (c[0] | c[1] | c[2] | c[3]);
            }
            for (int q = 0; q < nd->nc && !p; q++)
                p = prod[g->rule_start[g->calls[nd->c0 + q].rule]] && prod[g->calls[nd->c0 + q].target];
            if (p) { prod[k] = 1; changed = 1; }
        }
    }
    if (!prod[g->rule_start[a->root]]) {
        ERR(err, 400, "grammar: rule `%s` matches no string", a->names[a->root]);
        goto out;
    }
    /* drop edges into unproductive nodes / rules (compact in place) */
    for (int k = 0; k < N; k++) {
        GNode *nd = &g->nodes[k];
        int w = nd->e0;
        for (int q = 0; q < nd->ne; q++) {
            GEdge ed = g->edges[nd->e0 + q];
            const uint64_t *c = g->cls[ed.cls];
            if (prod[ed.target] && (c[0] | c[1] | c[2] | c[3])) g->edges[w++] = ed;
        }
        nd->ne = w - nd->e0;
        memset(nd->first, 0, sizeof nd->first);
        for (int q = 0; q < nd->ne; q++)
            for (int x = 0; x < 4; x++) nd->first[x] |= g->cls[g->edges[nd->e0 + q].cls][x];
        w = nd->c0;
        for (int q = 0; q < nd->nc; q++) {
            GCall cl = g->calls[nd->c0 + q];
            if (prod[g->rule_start[cl.rule]] && prod[cl.target]) g->calls[w++] = cl;
        }
        nd->nc = w - nd->c0;
    }
    /* nullable nodes (can end without a byte) and rules */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int k = N - 1; k >= 0; k--) {
            if (nulln[k]) continue;
            const GNode *nd = &g->nodes[k];
            int p = nd->final;
            for (int q = 0; q < nd->nc && !p; q++) p = nullr[g->calls[nd->c0 + q].rule] && nulln[g->calls[nd->c0 + q].target];
            if (p) { nulln[k] = 1; changed = 1; if (g->rule_start[nd->rule] == k) nullr[nd->rule] = 1; }
        }
    }
    /* left recursion: per rule r, the rules reachable by calls made before a
     * byte is consumed (at the start node, or after nullable calls); r among
     * them is left recursion */
    {
        uint8_t *rr = calloc((size_t)R, 1);
        int32_t *rs = malloc((size_t)R * sizeof *rs), *rl = malloc((size_t)R * sizeof *rl);
        int32_t *ns = malloc((size_t)N * sizeof *ns), *nl = malloc((size_t)N * sizeof *nl);
        if (!rr || !rs || !rl || !ns || !nl) { free(rr); free(rs); free(rl); free(ns); free(nl); goto oom; }
        int bad = -1;
        for (int r = 0; r < R && bad < 0; r++) {
            int nr = 0, n_rl = 0, n_nl = 0;
            rs[nr++] = r;
            while (nr > 0 && bad < 0) {
                int x = rs[--nr];
                int nn = 0;
                ns[nn++] = g->rule_start[x];
                seen[g->rule_start[x]] = 1;
                nl[n_nl++] = g->rule_start[x];
                while (nn > 0 && bad < 0) {
                    const GNode *nd = &g->nodes[ns[--nn]];
                    for (int q = 0; q < nd->nc; q++) {
                        const GCall *cl = &g->calls[nd->c0 + q];
                        if (cl->rule == r) { bad = r; break; }
                        if (!rr[cl->rule]) { rr[cl->rule] = 1; rl[n_rl++] = cl->rule; rs[nr++] = cl->rule; }
                        if (nullr[cl->rule] && !seen[cl->target]) {
                            seen[cl->target] = 1;
                            nl[n_nl++] = cl->target;
                            ns[nn++] = cl->target;
                        }
                    }
                }
            }
            for (int i = 0; i < n_rl; i++) rr[rl[i]] = 0;
            for (int i = 0; i < n_nl; i++) seen[nl[i]] = 0;
        }
        free(rr); free(rs); free(rl); free(ns); free(nl);
        if (bad >= 0) {
            ERR(err, 400, "grammar: rule `%s` is left-recursive (it can reach itself before matching a "
                "character); rewrite it with repetition, e.g. `list ::= item (\",\" item)*`", a->names[bad]);
            goto out;
        }
    }
    /* FIRST per node (bytes a step from here can consume), then FOLLOW per rule */
    {
        uint64_t (*first)[4] = calloc((size_t)N, sizeof *first);
        if (!first) goto oom;
        for (int k = 0; k < N; k++) memcpy(first[k], g->nodes[k].first, sizeof first[k]);
        for (int changed = 1; changed;) {
            changed = 0;
            for (int k = N - 1; k >= 0; k--) {
                const GNode *nd = &g->nodes[k];
                for (int q = 0; q < nd->nc; q++) {
                    const GCall *cl = &g->calls[nd->c0 + q];
                    for (int w = 0; w < 4; w++) {
                        uint64_t v = first[g->rule_start[cl->rule]][w] | (nullr[cl->rule] ? first[cl->target][w] : 0);
                        if ((first[k][w] | v) != first[k][w]) { first[k][w] |= v; changed = 1; }
                    }
                }
            }
        }
        for (int changed = 1; changed;) {
            changed = 0;
            for (int k = 0; k < N; k++) {
                const GNode *nd = &g->nodes[k];
                for (int q = 0; q < nd->nc; q++) {
                    const GCall *cl = &g->calls[nd->c0 + q];
                    for (int w = 0; w < 4; w++) {
                        uint64_t v = first[cl->target][w] | (nulln[cl->target] ? g->follow[nd->rule][w] : 0);
                        if ((g->follow[cl->rule][w] | v) != g->follow[cl->rule][w]) {
                            g->follow[cl->rule][w] |= v;
                            changed = 1;
                        }
                    }
                }
            }
        }
        free(first);
    }
    g->root = a->root;
    rc = 0;
    goto out;
oom:
    ERR(err, 503, "out of memory compiling a grammar");
out:
    free(starts); free(ends); free(map); free(stk); free(mark);
    free(prod); free(nulln); free(nullr); free(seen);
    free(b.rule_of); free(b.e); free(b.cls); free(b.inl);
    return rc;
}
