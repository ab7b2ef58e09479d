/*
 * jinja_parse.c - lexer and parser for the chat-template subset of Jinja,
 * with transformers' environment (trim_blocks, lstrip_blocks, no trailing
 * newline). Anything outside the subset - an unknown tag, filter, test,
 * function or method - is refused here with its line, never at render.
 * Not here: evaluation (jinja_eval.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "jinja.h"

typedef enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT,
               T_OP, T_EOF } TokKind;

typedef struct Tok { TokKind kind; int line; char *s; size_t n; json_int_t i; double f; } Tok;

typedef struct Parser {
    Tok *t; size_t n, cap, pos;
    Err *e;
    bool failed;
    int depth; /* recursion guard: nesting beyond MAX_DEPTH is refused */
} Parser;

#define MAX_DEPTH 200

static const char *FILTERS[] = {"tojson", "trim", "length", "count", "string", "lower", "upper", "join", "default",
    "d", "first", "last", "list", "reverse", "replace", "int", "float", "abs", "items", "safe", "capitalize",
    "title", "map", "select", "reject", "selectattr", "rejectattr", "unique", "sort", "max", "min", "sum",
    "indent", "round", "e", "escape", NULL};
static const char *TESTS[] = {"defined", "undefined", "none", "string", "number", "integer", "float", "boolean",
    "true", "false", "mapping", "iterable", "sequence", "equalto", "eq", "==", "ne", "!=", "odd", "even",
    "divisibleby", "in", "lower", "upper", "sameas", "gt", "ge", "lt", "le", ">", ">=", "<", "<=", NULL};
static const char *FUNCS[] = {"raise_exception", "namespace", "range", "strftime_now", "dict", NULL};
static const char *METHODS[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "upper",
    "lower", "replace", "title", "capitalize", "find", "rfind", "count", "splitlines", "isdigit", "isspace",
    "isalpha", "isalnum", "islower", "isupper", "join", "items", "keys", "values", "get", "index", NULL};

static bool in_list(const char **l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return true;
    return false;
}

static int perr(Parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(Parser *p, int line, const char *fmt, ...) {
    if (p->failed) return -1;
    p->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ERR(p->e, 400, "line %d: %s", line, msg);
    return -1;
}

static void tok_push(Parser *p, TokKind k, int line, const char *s, size_t n) {
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 256;
        p->t = realloc(p->t, p->cap * sizeof *p->t);
        CHECK(p->t, "out of memory lexing a template");
    }
    Tok *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    t->kind = k;
    t->line = line;
    if (s) {
        t->s = xmalloc(n + 1);
        memcpy(t->s, s, n);
        t->s[n] = 0;
        t->n = n;
    }
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Template data with \r\n and \r turned into \n, as Jinja does. */
static void push_text(Parser *p, int line, const char *s, size_t n) {
    if (!n) return;
    char *buf = xmalloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\r') { buf[k++] = '\n'; if (i + 1 < n && s[i + 1] == '\n') i++; }
        else buf[k++] = s[i];
    }
    tok_push(p, T_TEXT, line, buf, k);
    free(buf);
}

/* Python unicode-escape of a string literal body. */
static char *unescape(const char *s, size_t n, size_t *out_n) {
    char *o = xmalloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { o[k++] = s[i]; continue; }
        char c = s[++i];
        switch (c) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '0': o[k++] = '\0'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\\': case '\'': case '"': o[k++] = c; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int len = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            if (i + (size_t)len >= n) { o[k++] = '\\'; o[k++] = c; break; }
            char hex[9] = {0};
            memcpy(hex, s + i + 1, (size_t)len);
            char *end;
            long cp = strtol(hex, &end, 16);
            if (*end) { o[k++] = '\\'; o[k++] = c; break; }
            i += (size_t)len;
            uint8_t *u = (uint8_t *)o + k;
            if (cp < 0x80) { u[0] = (uint8_t)cp; k += 1; }
            else if (cp < 0x800) { u[0] = 0xC0 | (cp >> 6); u[1] = 0x80 | (cp & 0x3F); k += 2; }
            else if (cp < 0x10000) { u[0] = 0xE0 | (cp >> 12); u[1] = 0x80 | ((cp >> 6) & 0x3F); u[2] = 0x80 | (cp & 0x3F); k += 3; }
            else { u[0] = 0xF0 | (cp >> 18); u[1] = 0x80 | ((cp >> 12) & 0x3F); u[2] = 0x80 | ((cp >> 6) & 0x3F); u[3] = 0x80 | (cp & 0x3F); k += 4; }
            break;
        }
        default: o[k++] = '\\'; o[k++] = c; break;
        }
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

static int lex_src(Parser *p, const char *src, size_t n) {
    size_t pos = 0;
    if (n && src[n - 1] == '\n') n--;            /* keep_trailing_newline=False */
    int line = 1;
    bool line_starting = true;
    while (pos < n) {
        size_t idx = pos;
        while (idx + 1 < n && !(src[idx] == '{' && (src[idx + 1] == '{' || src[idx + 1] == '%' || src[idx + 1] == '#'))) idx++;
        if (idx + 1 >= n) { push_text(p, line, src + pos, n - pos); break; }
        size_t tl = idx - pos;
        char kind = src[idx + 1], sign = idx + 2 < n && (src[idx + 2] == '-' || src[idx + 2] == '+') ? src[idx + 2] : 0;
        int text_line = line;
        line += count_nl(src + pos, tl);
        if (sign == '-') { while (tl && is_ws(src[pos + tl - 1])) tl--; }
        else if (sign != '+' && kind != '{') {
            size_t l = tl;
            while (l && src[pos + l - 1] != '\n') l--;
            if (l > 0 || line_starting) {
                bool all = l < tl;
                for (size_t i = l; i < tl; i++) all = all && is_ws(src[pos + i]);
                if (all) tl = l;
            }
        }
        push_text(p, text_line, src + pos, tl);
        if (!strncmp(src + idx + 2, "raw", 3) || (sign && !strncmp(src + idx + 3, " raw", 4)))
            return perr(p, line, "unsupported tag 'raw'");
        pos = idx + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *end = strstr(src + pos, "#}");
            if (!end || (size_t)(end - src) >= n) return perr(p, line, "unterminated comment");
            bool strip = end > src + pos && end[-1] == '-';
            line += count_nl(src + pos, (size_t)(end - src) - pos);
            pos = (size_t)(end - src) + 2;
            if (strip) while (pos < n && is_ws(src[pos])) { line += src[pos] == '\n'; pos++; }
            else if (pos < n && src[pos] == '\n') { pos++; line++; }
            line_starting = src[pos - 1] == '\n';
            continue;
        }
        tok_push(p, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, line, NULL, 0);
        const char *close = kind == '{' ? "}}" : "%}";
        int depth = 0;
        for (;;) {
            while (pos < n && is_ws(src[pos])) { line += src[pos] == '\n'; pos++; }
            if (pos >= n) return perr(p, line, "unterminated tag");
            char esign = 0;
            if (depth == 0 && (src[pos] == '-' || src[pos] == '+') && !strncmp(src + pos + 1, close, 2)) esign = src[pos++];
            if (depth == 0 && !strncmp(src + pos, close, 2)) {
                pos += 2;
                tok_push(p, kind == '{' ? T_VAR_END : T_BLOCK_END, line, NULL, 0);
                if (esign == '-') while (pos < n && is_ws(src[pos])) { line += src[pos] == '\n'; pos++; }
                else if (kind == '%' && esign != '+' && pos < n && src[pos] == '\n') { pos++; line++; }
                line_starting = src[pos - 1] == '\n';
                break;
            }
            char c = src[pos];
            if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
                size_t s = pos;
                while (pos < n && (src[pos] == '_' || (src[pos] >= 'a' && src[pos] <= 'z') ||
                                   (src[pos] >= 'A' && src[pos] <= 'Z') || (src[pos] >= '0' && src[pos] <= '9'))) pos++;
                tok_push(p, T_NAME, line, src + s, pos - s);
            } else if (c >= '0' && c <= '9') {
                size_t s = pos;
                bool fl = false;
                while (pos < n && ((src[pos] >= '0' && src[pos] <= '9') || src[pos] == '_')) pos++;
                if (pos + 1 < n && src[pos] == '.' && src[pos + 1] >= '0' && src[pos + 1] <= '9') {
                    fl = true;
                    pos++;
                    while (pos < n && src[pos] >= '0' && src[pos] <= '9') pos++;
                }
                if (pos < n && (src[pos] == 'e' || src[pos] == 'E')) {
                    size_t q = pos + 1;
                    if (q < n && (src[q] == '+' || src[q] == '-')) q++;
                    if (q < n && src[q] >= '0' && src[q] <= '9') {
                        fl = true;
                        pos = q;
                        while (pos < n && src[pos] >= '0' && src[pos] <= '9') pos++;
                    }
                }
                char buf[64];
                size_t k = 0;
                for (size_t i = s; i < pos && k < 63; i++)
                    if (src[i] != '_') buf[k++] = src[i];
                buf[k] = 0;
                tok_push(p, fl ? T_FLOAT : T_INT, line, buf, k);
                if (fl) p->t[p->n - 1].f = strtod(buf, NULL);
                else p->t[p->n - 1].i = strtoll(buf, NULL, 10);
            } else if (c == '\'' || c == '"') {
                size_t s = ++pos;
                while (pos < n && src[pos] != c) { if (src[pos] == '\\') pos++; line += src[pos] == '\n'; pos++; }
                if (pos >= n) return perr(p, line, "unterminated string");
                size_t un;
                char *u = unescape(src + s, pos - s, &un);
                tok_push(p, T_STRING, line, u, un);
                free(u);
                pos++;
            } else {
                static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
                size_t len = 0;
                for (int i = 0; ops2[i]; i++)
                    if (!strncmp(src + pos, ops2[i], 2)) len = 2;
                if (!len) {
                    if (!strchr("+-*/%~<>=()[]{},.:|", c)) return perr(p, line, "unexpected character '%c'", c);
                    len = 1;
                    if (c == '(' || c == '[' || c == '{') depth++;
                    if ((c == ')' || c == ']' || c == '}') && depth) depth--;
                }
                tok_push(p, T_OP, line, src + pos, len);
                pos += len;
            }
        }
    }
    tok_push(p, T_EOF, line, NULL, 0);
    return 0;
}

static int lex(Parser *p, const char *raw) {
    /* Jinja joins the source's lines with \n before lexing. */
    size_t n = 0, rn = strlen(raw);
    char *src = xmalloc(rn + 1);
    for (size_t i = 0; i < rn; i++) {
        if (raw[i] == '\r') { src[n++] = '\n'; if (i + 1 < rn && raw[i + 1] == '\n') i++; }
        else src[n++] = raw[i];
    }
    src[n] = 0;
    int rc = lex_src(p, src, n);
    free(src);
    return rc;
}

/* ---- parser ---- */

static Tok *cur(Parser *p) { return &p->t[p->pos]; }
static bool is_op(Parser *p, const char *op) { return cur(p)->kind == T_OP && !strcmp(cur(p)->s, op); }
static bool is_name(Parser *p, const char *nm) { return cur(p)->kind == T_NAME && !strcmp(cur(p)->s, nm); }
static bool skip_op(Parser *p, const char *op) { if (is_op(p, op)) { p->pos++; return true; } return false; }
static bool skip_name(Parser *p, const char *nm) { if (is_name(p, nm)) { p->pos++; return true; } return false; }
static int expect_op(Parser *p, const char *op) {
    if (skip_op(p, op)) return 0;
    return perr(p, cur(p)->line, "expected '%s'", op);
}

static Node *mk(NodeKind k, int line) {
    Node *n = xcalloc(1, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}

static void add_kid(Node ***v, int *n, Node *k) {
    *v = realloc(*v, (size_t)(*n + 1) * sizeof **v);
    CHECK(*v, "out of memory parsing a template");
    (*v)[(*n)++] = k;
}

void jinja_node_free(Node *n) {
    if (!n) return;
    free(n->name);
    json_decref(n->lit);
    jinja_node_free(n->a);
    jinja_node_free(n->b);
    jinja_node_free(n->c);
    for (int i = 0; i < n->n_kids; i++) jinja_node_free(n->kids[i]);
    free(n->kids);
    for (int i = 0; i < n->n_kw; i++) { free(n->kw[i]); jinja_node_free(n->kwv[i]); }
    free(n->kw);
    free(n->kwv);
    for (int i = 0; i < n->n_bodies; i++) jinja_node_free(n->bodies[i]);
    free(n->bodies);
    for (int i = 0; i < n->n_targets; i++) free(n->targets[i]);
    free(n->targets);
    free(n);
}

static Node *parse_expr(Parser *p);
static Node *parse_expr_1(Parser *p);
static Node *parse_not_1(Parser *p);
static Node *parse_or(Parser *p);
static Node *parse_unary(Parser *p, bool with_filter);

/* (args, kw=value) after '(' has been seen */
static int parse_args(Parser *p, Node *call) {
    if (expect_op(p, "(")) return -1;
    while (!is_op(p, ")")) {
        if (cur(p)->kind == T_NAME && p->t[p->pos + 1].kind == T_OP && !strcmp(p->t[p->pos + 1].s, "=")) {
            call->kw = realloc(call->kw, (size_t)(call->n_kw + 1) * sizeof *call->kw);
            call->kwv = realloc(call->kwv, (size_t)(call->n_kw + 1) * sizeof *call->kwv);
            CHECK(call->kw && call->kwv, "out of memory parsing a template");
            call->kw[call->n_kw] = xstrdup(cur(p)->s);
            p->pos += 2;
            call->kwv[call->n_kw++] = parse_expr(p);
        } else add_kid(&call->kids, &call->n_kids, parse_expr(p));
        if (p->failed) return -1;
        if (!skip_op(p, ",")) break;
    }
    return expect_op(p, ")");
}

static Node *parse_primary(Parser *p) {
    Tok *t = cur(p);
    Node *n = NULL;
    if (t->kind == T_NAME) {
        p->pos++;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) { n = mk(N_LIT, t->line); n->lit = json_true(); }
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) { n = mk(N_LIT, t->line); n->lit = json_false(); }
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) { n = mk(N_LIT, t->line); n->lit = json_null(); }
        else { n = mk(N_NAME, t->line); n->name = xstrdup(t->s); }
    } else if (t->kind == T_STRING) {
        StrBuf b = {0};
        while (cur(p)->kind == T_STRING) { sb_put(&b, cur(p)->s, cur(p)->n); p->pos++; }
        n = mk(N_LIT, t->line);
        n->lit = json_stringn_nocheck(b.s ? b.s : "", b.n);
        free(b.s);
    } else if (t->kind == T_INT) { p->pos++; n = mk(N_LIT, t->line); n->lit = json_integer(t->i); }
    else if (t->kind == T_FLOAT) { p->pos++; n = mk(N_LIT, t->line); n->lit = json_real(t->f); }
    else if (skip_op(p, "(")) {
        Node *first = parse_expr(p);
        if (skip_op(p, ",")) { /* tuple: a list value */
            n = mk(N_LIST, t->line);
            add_kid(&n->kids, &n->n_kids, first);
            while (!is_op(p, ")") && !p->failed) {
                add_kid(&n->kids, &n->n_kids, parse_expr(p));
                if (!skip_op(p, ",")) break;
            }
        } else n = first;
        expect_op(p, ")");
    } else if (skip_op(p, "[")) {
        n = mk(N_LIST, t->line);
        while (!is_op(p, "]") && !p->failed) {
            add_kid(&n->kids, &n->n_kids, parse_expr(p));
            if (!skip_op(p, ",")) break;
        }
        expect_op(p, "]");
    } else if (skip_op(p, "{")) {
        n = mk(N_DICT, t->line);
        while (!is_op(p, "}") && !p->failed) {
            add_kid(&n->kids, &n->n_kids, parse_expr(p));
            expect_op(p, ":");
            add_kid(&n->kids, &n->n_kids, parse_expr(p));
            if (!skip_op(p, ",")) break;
        }
        expect_op(p, "}");
    } else {
        perr(p, t->line, "unexpected %s", t->kind == T_OP ? t->s : t->kind == T_EOF ? "end of template" : "token");
        return mk(N_LIT, t->line);
    }
    return n;
}

static Node *parse_postfix(Parser *p, Node *n) {
    for (;;) {
        int line = cur(p)->line;
        if (skip_op(p, ".")) {
            if (cur(p)->kind != T_NAME && cur(p)->kind != T_INT) { perr(p, line, "expected attribute name"); return n; }
            Node *a = mk(N_ATTR, line);
            a->a = n;
            a->name = xstrdup(cur(p)->s);
            p->pos++;
            n = a;
        } else if (skip_op(p, "[")) {
            Node *lo = NULL, *hi = NULL, *st = NULL;
            bool slice = false;
            if (!is_op(p, ":")) lo = parse_expr(p);
            if (skip_op(p, ":")) {
                slice = true;
                if (!is_op(p, "]") && !is_op(p, ":")) hi = parse_expr(p);
                if (skip_op(p, ":") && !is_op(p, "]")) st = parse_expr(p);
            }
            expect_op(p, "]");
            Node *s = mk(slice ? N_SLICE : N_ITEM, line);
            s->a = n;
            s->b = lo;
            if (slice) { s->kids = xcalloc(2, sizeof *s->kids); s->kids[0] = hi; s->kids[1] = st; s->n_kids = 2; }
            n = s;
        } else if (is_op(p, "(")) {
            Node *c = mk(N_CALL, line);
            if (n->kind == N_NAME) {
                if (!in_list(FUNCS, n->name)) { perr(p, line, "unsupported function '%s'", n->name); }
            } else if (n->kind == N_ATTR) {
                if (!in_list(METHODS, n->name)) { perr(p, line, "unsupported method '%s'", n->name); }
            } else perr(p, line, "unsupported call expression");
            c->a = n;
            parse_args(p, c);
            n = c;
        } else return n;
        if (p->failed) return n;
    }
}

static Node *parse_filters_tests(Parser *p, Node *n) {
    for (;;) {
        int line = cur(p)->line;
        if (skip_op(p, "|")) {
            if (cur(p)->kind != T_NAME) { perr(p, line, "expected filter name"); return n; }
            Node *f = mk(N_FILTER, line);
            f->name = xstrdup(cur(p)->s);
            if (!in_list(FILTERS, f->name)) perr(p, line, "unsupported filter '%s'", f->name);
            p->pos++;
            f->a = n;
            n = f;
            if (is_op(p, "(")) parse_args(p, f);
        } else if (skip_name(p, "is")) {
            Node *t = mk(N_TEST, line);
            t->negate = skip_name(p, "not");
            if (cur(p)->kind != T_NAME && !(cur(p)->kind == T_OP)) {
                jinja_node_free(t);
                perr(p, line, "expected test name");
                return n;
            }
            t->name = xstrdup(cur(p)->s);
            if (!in_list(TESTS, t->name)) perr(p, line, "unsupported test '%s'", t->name);
            p->pos++;
            t->a = n;
            n = t;
            Tok *c = cur(p);
            if (is_op(p, "(")) parse_args(p, t);
            else if ((c->kind == T_NAME || c->kind == T_STRING || c->kind == T_INT || c->kind == T_FLOAT ||
                      is_op(p, "[") || is_op(p, "{")) &&
                     !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and") && !is_name(p, "if")) {
                add_kid(&t->kids, &t->n_kids, parse_postfix(p, parse_primary(p)));
            }
        } else return n;
        if (p->failed) return n;
    }
}

static Node *parse_unary_1(Parser *p, bool with_filter);
static Node *parse_unary(Parser *p, bool with_filter) {
    if (++p->depth > MAX_DEPTH) { p->depth--; perr(p, cur(p)->line, "expression nested too deep"); return mk(N_LIT, cur(p)->line); }
    Node *n = parse_unary_1(p, with_filter);
    p->depth--;
    return n;
}

static Node *parse_unary_1(Parser *p, bool with_filter) {
    int line = cur(p)->line;
    Node *n;
    if (skip_op(p, "-")) { n = mk(N_NEG, line); n->a = parse_unary(p, false); }
    else if (skip_op(p, "+")) { n = mk(N_POS, line); n->a = parse_unary(p, false); }
    else n = parse_postfix(p, parse_primary(p));
    if (with_filter && !p->failed) n = parse_filters_tests(p, n);
    return n;
}

static Node *bin(BinOp op, Node *a, Node *b, int line) {
    Node *n = mk(N_BIN, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static Node *parse_pow(Parser *p) {
    Node *n = parse_unary(p, true);
    while (!p->failed && is_op(p, "**")) { int l = cur(p)->line; p->pos++; n = bin(OP_POW, n, parse_unary(p, true), l); }
    return n;
}

static Node *parse_math2(Parser *p) {
    Node *n = parse_pow(p);
    for (;;) {
        int l = cur(p)->line;
        BinOp op;
        if (is_op(p, "*")) op = OP_MUL;
        else if (is_op(p, "/")) op = OP_DIV;
        else if (is_op(p, "//")) op = OP_FLOORDIV;
        else if (is_op(p, "%")) op = OP_MOD;
        else return n;
        p->pos++;
        n = bin(op, n, parse_pow(p), l);
        if (p->failed) return n;
    }
}

static Node *parse_concat(Parser *p) {
    Node *n = parse_math2(p);
    while (!p->failed && is_op(p, "~")) { int l = cur(p)->line; p->pos++; n = bin(OP_CONCAT, n, parse_math2(p), l); }
    return n;
}

static Node *parse_math1(Parser *p) {
    Node *n = parse_concat(p);
    for (;;) {
        int l = cur(p)->line;
        BinOp op;
        if (is_op(p, "+")) op = OP_ADD;
        else if (is_op(p, "-")) op = OP_SUB;
        else return n;
        p->pos++;
        n = bin(op, n, parse_concat(p), l);
        if (p->failed) return n;
    }
}

static Node *parse_compare(Parser *p) {
    Node *n = parse_math1(p);
    for (;;) {
        int l = cur(p)->line;
        BinOp op;
        if (is_op(p, "==")) op = OP_EQ;
        else if (is_op(p, "!=")) op = OP_NE;
        else if (is_op(p, "<")) op = OP_LT;
        else if (is_op(p, "<=")) op = OP_LE;
        else if (is_op(p, ">")) op = OP_GT;
        else if (is_op(p, ">=")) op = OP_GE;
        else if (is_name(p, "in")) op = OP_IN;
        else if (is_name(p, "not") && p->t[p->pos + 1].kind == T_NAME && !strcmp(p->t[p->pos + 1].s, "in")) { op = OP_NOTIN; p->pos++; }
        else return n;
        p->pos++;
        n = bin(op, n, parse_math1(p), l);
        if (p->failed) return n;
    }
}

static Node *parse_not(Parser *p) {
    if (++p->depth > MAX_DEPTH) { p->depth--; perr(p, cur(p)->line, "expression nested too deep"); return mk(N_LIT, cur(p)->line); }
    Node *n = parse_not_1(p);
    p->depth--;
    return n;
}

static Node *parse_not_1(Parser *p) {
    int l = cur(p)->line;
    if (skip_name(p, "not")) { Node *n = mk(N_NOT, l); n->a = parse_not(p); return n; }
    return parse_compare(p);
}

static Node *parse_and(Parser *p) {
    Node *n = parse_not(p);
    while (!p->failed && is_name(p, "and")) {
        Node *a = mk(N_AND, cur(p)->line);
        p->pos++;
        a->a = n;
        a->b = parse_not(p);
        n = a;
    }
    return n;
}

static Node *parse_or(Parser *p) {
    Node *n = parse_and(p);
    while (!p->failed && is_name(p, "or")) {
        Node *a = mk(N_OR, cur(p)->line);
        p->pos++;
        a->a = n;
        a->b = parse_and(p);
        n = a;
    }
    return n;
}

static Node *parse_expr(Parser *p) {
    if (++p->depth > MAX_DEPTH) { p->depth--; perr(p, cur(p)->line, "expression nested too deep"); return mk(N_LIT, cur(p)->line); }
    Node *n = parse_expr_1(p);
    p->depth--;
    return n;
}

static Node *parse_expr_1(Parser *p) {
    Node *n = parse_or(p);
    while (!p->failed && is_name(p, "if")) {
        Node *c = mk(N_COND, cur(p)->line);
        p->pos++;
        c->b = n;
        c->a = parse_or(p);
        if (skip_name(p, "else")) c->c = parse_expr(p);
        n = c;
    }
    return n;
}

/* ---- statements ---- */

static Node *parse_body(Parser *p, const char **ends, const char **which);

static int end_block(Parser *p) {
    if (cur(p)->kind != T_BLOCK_END) return perr(p, cur(p)->line, "expected end of tag");
    p->pos++;
    return 0;
}

static Node *parse_for(Parser *p, int line) {
    Node *f = mk(N_FOR, line);
    do {
        if (cur(p)->kind != T_NAME) { perr(p, line, "expected loop variable"); return f; }
        f->targets = realloc(f->targets, (size_t)(f->n_targets + 1) * sizeof *f->targets);
        f->targets[f->n_targets++] = xstrdup(cur(p)->s);
        p->pos++;
    } while (skip_op(p, ","));
    if (!skip_name(p, "in")) { perr(p, line, "expected 'in'"); return f; }
    f->a = parse_or(p);
    if (skip_name(p, "if")) f->b = parse_or(p);
    if (is_name(p, "recursive")) { perr(p, line, "unsupported loop modifier 'recursive'"); return f; }
    if (end_block(p)) return f;
    static const char *ends[] = {"endfor", "else", NULL};
    const char *which = NULL;
    add_kid(&f->bodies, &f->n_bodies, parse_body(p, ends, &which));
    if (which && !strcmp(which, "else")) {
        static const char *ends2[] = {"endfor", NULL};
        add_kid(&f->bodies, &f->n_bodies, parse_body(p, ends2, &which));
    }
    return f;
}

static Node *parse_if(Parser *p, int line) {
    Node *n = mk(N_IF, line);
    add_kid(&n->kids, &n->n_kids, parse_expr(p));
    if (end_block(p)) return n;
    static const char *ends[] = {"endif", "elif", "else", NULL};
    for (;;) {
        const char *which = NULL;
        add_kid(&n->bodies, &n->n_bodies, parse_body(p, ends, &which));
        if (p->failed || !which) return n;
        if (!strcmp(which, "elif")) {
            add_kid(&n->kids, &n->n_kids, parse_expr(p));
            if (end_block(p)) return n;
        } else if (!strcmp(which, "else")) {
            static const char *ends2[] = {"endif", NULL};
            add_kid(&n->bodies, &n->n_bodies, parse_body(p, ends2, &which));
            return n;
        } else return n;
    }
}

static Node *parse_set(Parser *p, int line) {
    if (cur(p)->kind != T_NAME) { perr(p, line, "expected a name after set"); return mk(N_BODY, line); }
    char *name = xstrdup(cur(p)->s);
    p->pos++;
    Node *n;
    if (skip_op(p, ".")) {
        n = mk(N_SET_ATTR, line);
        n->c = mk(N_NAME, line);
        n->c->name = name;
        if (cur(p)->kind != T_NAME) { perr(p, line, "expected attribute name"); return n; }
        n->name = xstrdup(cur(p)->s);
        p->pos++;
    } else {
        n = mk(N_SET, line);
        n->name = name;
    }
    if (is_op(p, ",")) { perr(p, line, "unsupported tuple assignment in set"); return n; }
    if (!skip_op(p, "=")) { perr(p, line, "unsupported block set (set without '=')"); return n; }
    n->a = parse_expr(p);
    end_block(p);
    return n;
}

/* Statements until one of ends (a tag name) or EOF (ends == NULL). */
static Node *parse_body_1(Parser *p, const char **ends, const char **which);
static Node *parse_body(Parser *p, const char **ends, const char **which) {
    if (++p->depth > MAX_DEPTH) { p->depth--; *which = NULL; perr(p, cur(p)->line, "blocks nested too deep"); return mk(N_BODY, cur(p)->line); }
    Node *n = parse_body_1(p, ends, which);
    p->depth--;
    return n;
}

static Node *parse_body_1(Parser *p, const char **ends, const char **which) {
    Node *body = mk(N_BODY, cur(p)->line);
    *which = NULL;
    while (!p->failed) {
        Tok *t = cur(p);
        if (t->kind == T_EOF) {
            if (ends) perr(p, t->line, "missing '%s'", ends[0]);
            return body;
        }
        if (t->kind == T_TEXT) {
            Node *x = mk(N_TEXT, t->line);
            x->lit = json_stringn_nocheck(t->s, t->n);
            add_kid(&body->kids, &body->n_kids, x);
            p->pos++;
            continue;
        }
        if (t->kind == T_VAR_BEGIN) {
            p->pos++;
            Node *o = mk(N_OUT, t->line);
            o->a = parse_expr(p);
            if (!p->failed && cur(p)->kind != T_VAR_END) perr(p, cur(p)->line, "expected '}}'");
            p->pos++;
            add_kid(&body->kids, &body->n_kids, o);
            continue;
        }
        if (t->kind != T_BLOCK_BEGIN) { perr(p, t->line, "unexpected token"); return body; }
        p->pos++;
        Tok *kw = cur(p);
        int line = kw->line;
        if (kw->kind != T_NAME) { perr(p, line, "expected a tag name"); return body; }
        for (int i = 0; ends && ends[i]; i++)
            if (!strcmp(kw->s, ends[i])) {
                *which = ends[i];
                p->pos++;
                if (strcmp(kw->s, "elif")) end_block(p);
                return body;
            }
        p->pos++;
        Node *s = NULL;
        if (!strcmp(kw->s, "for")) s = parse_for(p, line);
        else if (!strcmp(kw->s, "if")) s = parse_if(p, line);
        else if (!strcmp(kw->s, "set")) s = parse_set(p, line);
        else if (!strcmp(kw->s, "break") || !strcmp(kw->s, "continue")) {
            s = mk(kw->s[0] == 'b' ? N_BREAK : N_CONTINUE, line);
            end_block(p);
        } else if (!strcmp(kw->s, "generation")) { /* transformers' assistant-mask tag: transparent */
            end_block(p);
            static const char *ends2[] = {"endgeneration", NULL};
            const char *w;
            s = parse_body(p, ends2, &w);
        } else {
            perr(p, line, "unsupported tag '%s'", kw->s);
            return body;
        }
        add_kid(&body->kids, &body->n_kids, s);
    }
    return body;
}

Node *jinja_parse(const char *src, Err *e) {
    Parser p = {0};
    p.e = e;
    Node *root = NULL;
    if (lex(&p, src) == 0) {
        const char *which;
        root = parse_body(&p, NULL, &which);
    }
    for (size_t i = 0; i < p.n; i++) free(p.t[i].s);
    free(p.t);
    if (p.failed) { jinja_node_free(root); return NULL; }
    return root;
}
