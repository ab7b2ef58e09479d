/*
 * grammar_parse.c - GBNF (with Lark-like `name:` rules and /regex/ terminals)
 * and regular expressions, parsed into expression trees (grammar_internal.h).
 * One recursive-descent parser serves both: the regex mode reads bare
 * characters as literals, the GBNF mode reads "quoted" literals and rule names.
 *
 * Characters: text is UTF-8; a literal matches its bytes. A class matches one
 * character: its members must be ASCII (a non-ASCII member is refused by name),
 * a negated class also matches every multi-byte character.
 *
 * Not here: turning the trees into NFAs (grammar_nfa.c).
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

#define AST_MAX_NODES (4 * GRAMMAR_MAX_NODES)

void ast_init(Ast *a) {
    memset(a, 0, sizeof *a);
    a->root = -1;
    a->utf8_rule = -1;
}

void ast_free(Ast *a) {
    for (int i = 0; i < a->n_rules; i++) free(a->names[i]);
    free(a->names);
    free(a->body);
    free(a->nodes);
    memset(a, 0, sizeof *a);
}

int ast_node(Ast *a, AstKind k, int32_t x, int32_t y) {
    if (a->too_big || a->n >= AST_MAX_NODES) { a->too_big = 1; return -1; }
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 256;
        AstNode *p = realloc(a->nodes, (size_t)cap * sizeof *p);
        if (!p) { a->too_big = 1; return -1; }
        a->nodes = p;
        a->cap = cap;
    }
    AstNode *n = &a->nodes[a->n];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)k;
    n->a = x;
    n->b = y;
    return a->n++;
}

int ast_class(Ast *a, const uint64_t cls[4]) {
    int i = ast_node(a, AST_CLASS, 0, 0);
    if (i >= 0) memcpy(a->nodes[i].cls, cls, sizeof a->nodes[i].cls);
    return i;
}

static int ast_byte(Ast *a, unsigned b) {
    uint64_t c[4] = { 0 };
    cls_set(c, b);
    return ast_class(a, c);
}

static int ast_seq(Ast *a, int x, int y) {
    if (x < 0) return y;
    if (y < 0) return x;
    return ast_node(a, AST_SEQ, x, y);
}

int ast_literal(Ast *a, const char *s, size_t n) {
    int r = ast_node(a, AST_EMPTY, 0, 0);
    for (size_t i = 0; i < n; i++) r = ast_node(a, AST_SEQ, r, ast_byte(a, (unsigned char)s[i]));
    return r;
}

int ast_rule(Ast *a, const char *name, size_t n) {
    for (int i = 0; i < a->n_rules; i++)
        if (strlen(a->names[i]) == n && !memcmp(a->names[i], name, n)) return i;
    if (a->n_rules >= 65536) { a->too_big = 1; return -1; }
    if (a->n_rules == a->cap_rules) {
        int cap = a->cap_rules ? 2 * a->cap_rules : 16;
        char **nm = realloc(a->names, (size_t)cap * sizeof *nm);
        if (nm) a->names = nm;
        int32_t *b = realloc(a->body, (size_t)cap * sizeof *b);
        if (b) a->body = b;
        if (!nm || !b) { a->too_big = 1; return -1; }
        a->cap_rules = cap;
    }
    char *c = malloc(n + 1);
    if (!c) { a->too_big = 1; return -1; }
    memcpy(c, name, n);
    c[n] = 0;
    a->names[a->n_rules] = c;
    a->body[a->n_rules] = -1;
    return a->n_rules++;
}

/* The shared rule matching one multi-byte UTF-8 character (well-formed:
 * no overlongs, no surrogates, <= U+10FFFF). */
static int utf8_rule(Ast *a) {
    if (a->utf8_rule >= 0) return a->utf8_rule;
    int r = ast_rule(a, "%utf8", 5);
    if (r < 0) return -1;
    a->utf8_rule = r;
    struct { unsigned lo0, hi0, lo1, hi1; int tail; } f[] = {
        { 0xC2, 0xDF, 0x80, 0xBF, 0 }, { 0xE0, 0xE0, 0xA0, 0xBF, 1 }, { 0xE1, 0xEC, 0x80, 0xBF, 1 },
        { 0xED, 0xED, 0x80, 0x9F, 1 }, { 0xEE, 0xEF, 0x80, 0xBF, 1 }, { 0xF0, 0xF0, 0x90, 0xBF, 2 },
        { 0xF1, 0xF3, 0x80, 0xBF, 2 }, { 0xF4, 0xF4, 0x80, 0x8F, 2 },
    };
    uint64_t cont[4] = { 0 };
    for (unsigned b = 0x80; b <= 0xBF; b++) cls_set(cont, b);
    int alt = -1;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        uint64_t c0[4] = { 0 }, c1[4] = { 0 };
        for (unsigned b = f[i].lo0; b <= f[i].hi0; b++) cls_set(c0, b);
        for (unsigned b = f[i].lo1; b <= f[i].hi1; b++) cls_set(c1, b);
        int s = ast_seq(a, ast_class(a, c0), ast_class(a, c1));
        for (int t = 0; t < f[i].tail; t++) s = ast_seq(a, s, ast_class(a, cont));
        alt = alt < 0 ? s : ast_node(a, AST_ALT, alt, s);
    }
    a->body[r] = alt;
    return r;
}

int ast_char_class(Ast *a, const uint64_t cls[4], int with_multibyte) {
    uint64_t c[4] = { cls[0], cls[1], 0, 0 };
    int x = (c[0] | c[1]) ? ast_class(a, c) : -1;
    if (!with_multibyte) return x >= 0 ? x : ast_class(a, c); /* empty class: matches nothing */
    int u = utf8_rule(a);
    int ref = ast_node(a, AST_REF, u, 0);
    return x < 0 ? ref : ast_node(a, AST_ALT, x, ref);
}

/* ---- the parser ---- */
typedef struct P {
    Ast *a;
    const char *s;
    size_t i, n;
    int regex;   /* regex mode: bare characters are literals */
    int depth;
    Err *err;
    int failed;
} P;

static int fail(P *p, const char *what) {
    if (!p->failed) {
        p->failed = 1;
        ERR(p->err, 400, "%s: %s at offset %zu", p->regex ? "regex" : "grammar", what, p->i);
    }
    return -1;
}

static int peek(P *p) { return p->i < p->n ? (unsigned char)p->s[p->i] : -1; }

static void skip_ws(P *p) {
    if (p->regex) return;
    for (;;) {
        while (p->i < p->n && isspace((unsigned char)p->s[p->i])) p->i++;
        if (peek(p) == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
            continue;
        }
        return;
    }
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* UTF-8 encode cp into out; returns bytes. */
static int utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 63));
        out[2] = (char)(0x80 | (cp & 63)); return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 63));
    out[2] = (char)(0x80 | ((cp >> 6) & 63)); out[3] = (char)(0x80 | (cp & 63)); return 4;
}

/* One escaped character after a backslash (p->i at the char after '\'):
 * its UTF-8 bytes into out (returns the count), or -2 for a class escape
 * (\d \w \s and negations, filled into cls and *neg), <0 on error. */
static int read_escape(P *p, char *out, uint64_t cls[4], int *neg) {
    int c = peek(p);
    if (c < 0) return fail(p, "dangling backslash");
    p->i++;
    switch (c) {
    case 'n': out[0] = '\n'; return 1;
    case 't': out[0] = '\t'; return 1;
    case 'r': out[0] = '\r'; return 1;
    case 'f': out[0] = '\f'; return 1;
    case 'v': out[0] = '\v'; return 1;
    case '0': out[0] = 0; return 1;
    case 'x': case 'u': {
        int digits = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            int h = hexval(peek(p));
            if (h < 0) return fail(p, "bad \\x or \\u escape");
            v = v * 16 + (uint32_t)h;
            p->i++;
        }
        if (c == 'x' && !p->regex) { out[0] = (char)v; return 1; } /* GBNF \xHH: a byte */
        return utf8_put(v, out);
    }
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': {
        memset(cls, 0, 4 * sizeof(uint64_t));
        int lc = tolower(c);
        for (unsigned b = 0; b < 128; b++) {
            int in = lc == 'd' ? (b >= '0' && b <= '9')
                   : lc == 'w' ? (isalnum((int)b) || b == '_')
                   : (b == ' ' || (b >= '\t' && b <= '\r'));
            if (in) cls_set(cls, b);
        }
        *neg = isupper(c) != 0;
        return -2;
    }
    case 'b': case 'B': case 'A': case 'z': case 'Z':
        return fail(p, "anchors inside the pattern (\\b \\B \\A \\z) are not supported");
    default:
        if (c >= '1' && c <= '9') return fail(p, "back-references are not supported");
        if (isalpha(c)) return fail(p, "unknown escape");
        out[0] = (char)c;
        return 1;
    }
}

static void cls_invert_ascii(uint64_t c[4]) {
    c[0] = ~c[0];
    c[1] = ~c[1];
    c[2] = c[3] = 0;
}

/* [...] (p->i after '['). */
static int parse_class(P *p) {
    uint64_t c[4] = { 0 };
    int neg = 0;
    if (peek(p) == '^') { neg = 1; p->i++; }
    int first = 1;
    while (p->i < p->n && (p->s[p->i] != ']' || (first && p->regex))) {
        first = 0;
        int lo;
        int ch = (unsigned char)p->s[p->i++];
        if (ch == '\\') {
            char b[4];
            uint64_t ec[4];
            int en = 0;
            int k = read_escape(p, b, ec, &en);
            if (k == -2) {
                if (en) return fail(p, "negated class escapes (\\D \\W \\S) inside [...] are not supported");
                for (int w = 0; w < 4; w++) c[w] |= ec[w];
                continue;
            }
            if (k < 0) return -1;
            if (k != 1 || (unsigned char)b[0] >= 128) return fail(p, "non-ASCII characters in a [...] class are not supported");
            lo = (unsigned char)b[0];
        } else {
            if (ch >= 128) return fail(p, "non-ASCII characters in a [...] class are not supported");
            lo = ch;
        }
        int hi = lo;
        if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            int h = (unsigned char)p->s[p->i++];
            if (h == '\\') {
                char b[4];
                uint64_t ec[4];
                int en;
                int k = read_escape(p, b, ec, &en);
                if (k != 1) return k == -2 ? fail(p, "a class escape cannot end a range") : -1;
                h = (unsigned char)b[0];
            }
            if (h >= 128) return fail(p, "non-ASCII characters in a [...] class are not supported");
            if (h < lo) return fail(p, "range out of order in a class");
            hi = h;
        }
        for (int b = lo; b <= hi; b++) cls_set(c, (unsigned)b);
    }
    if (peek(p) != ']') return fail(p, "unterminated [...] class");
    p->i++;
    if (neg) cls_invert_ascii(c);
    return ast_char_class(p->a, c, neg);
}

static int parse_alt(P *p);

/* {m}, {m,}, {m,n} (p->i at '{'); 0 and bounds, 1 when not a quantifier (regex literal). */
static int parse_braces(P *p, int *lo, int *hi) {
    size_t j = p->i + 1;
    long m = 0, x = -1;
    int dig = 0;
    while (j < p->n && isdigit((unsigned char)p->s[j])) { m = m * 10 + (p->s[j++] - '0'); dig++; if (m > GRAMMAR_MAX_REPEAT) return fail(p, "repetition count over 1000"); }
    if (!dig) return p->regex ? 1 : fail(p, "bad {m,n}");
    if (j < p->n && p->s[j] == ',') {
        j++;
        int d2 = 0;
        long v = 0;
        while (j < p->n && isdigit((unsigned char)p->s[j])) { v = v * 10 + (p->s[j++] - '0'); d2++; if (v > GRAMMAR_MAX_REPEAT) return fail(p, "repetition count over 1000"); }
        x = d2 ? v : -1;
    } else x = m;
    if (j >= p->n || p->s[j] != '}') return p->regex ? 1 : fail(p, "bad {m,n}");
    if (x >= 0 && x < m) return fail(p, "{m,n} with n < m");
    p->i = j + 1;
    *lo = (int)m;
    *hi = (int)x;
    return 0;
}

/* An item (regex mode: also a bare character); -1 error, -3 nothing here. */
static int parse_atom(P *p) {
    int c = peek(p);
    if (c < 0) return -3;
    Ast *a = p->a;
    if (c == '(') {
        p->i++;
        if (p->regex && peek(p) == '?') {
            p->i++;
            if (peek(p) == ':') p->i++;
            else if (peek(p) == 'P' && p->i + 1 < p->n && p->s[p->i + 1] == '<') {
                while (p->i < p->n && p->s[p->i] != '>') p->i++;
                p->i++;
            } else if (peek(p) == '<' && p->i + 1 < p->n && p->s[p->i + 1] != '=' && p->s[p->i + 1] != '!') {
                while (p->i < p->n && p->s[p->i] != '>') p->i++;
                p->i++;
            } else return fail(p, "lookarounds and inline flags (?...) are not supported");
        }
        if (++p->depth > 200) return fail(p, "nesting too deep");
        int x = parse_alt(p);
        p->depth--;
        if (x < 0 && x != -3) return -1;
        skip_ws(p);
        if (peek(p) != ')') return fail(p, "missing ')'");
        p->i++;
        return x == -3 ? ast_node(a, AST_EMPTY, 0, 0) : x;
    }
    if (c == '[') { p->i++; return parse_class(p); }
    if (c == '.') {
        p->i++;
        uint64_t cl[4] = { ~0ull, ~0ull, 0, 0 };
        if (p->regex) cl[0] &= ~(1ull << '\n');
        return ast_char_class(a, cl, 1);
    }
    if (p->regex) {
        if (c == ')' || c == '|') return -3;
        if (c == '*' || c == '+' || c == '?') return fail(p, "quantifier without an operand");
        p->i++;
        if (c == '\\') {
            char b[4];
            uint64_t cl[4];
            int neg = 0;
            int k = read_escape(p, b, cl, &neg);
            if (k == -2) {
                if (neg) cls_invert_ascii(cl);
                return ast_char_class(a, cl, neg);
            }
            if (k < 0) return -1;
            return ast_literal(a, b, (size_t)k);
        }
        if (c == '^' || c == '$') return ast_node(a, AST_EMPTY, 0, 0); /* anchors: the whole output matches */
        return ast_byte(a, (unsigned)c);
    }
    if (c == '"') {
        p->i++;
        int r = ast_node(a, AST_EMPTY, 0, 0);
        while (p->i < p->n && p->s[p->i] != '"') {
            char b[4];
            int k;
            if (p->s[p->i] == '\\') {
                p->i++;
                uint64_t cl[4];
                int neg;
                k = read_escape(p, b, cl, &neg);
                if (k == -2) return fail(p, "class escapes are not allowed in a \"literal\"");
                if (k < 0) return -1;
            } else { b[0] = p->s[p->i++]; k = 1; }
            for (int j = 0; j < k; j++) r = ast_node(a, AST_SEQ, r, ast_byte(a, (unsigned char)b[j]));
        }
        if (peek(p) != '"') return fail(p, "unterminated \"literal\"");
        p->i++;
        return r;
    }
    /* /regex/ (Lark-like terminal); %/regex/ (internal, grammar_json.c): the
     * same with the bytes a JSON string must escape removed from its classes */
    int json_safe = c == '%' && p->i + 1 < p->n && p->s[p->i + 1] == '/';
    if (json_safe) { p->i++; c = '/'; }
    if (c == '/') {
        size_t j = p->i + 1;
        int n0 = a->n;
        while (j < p->n && p->s[j] != '/') j += p->s[j] == '\\' ? 2 : 1;
        if (j >= p->n) return fail(p, "unterminated /regex/");
        P q = { a, p->s, p->i + 1, j, 1, p->depth, p->err, 0 };
        int x = parse_alt(&q);
        if (q.failed) { p->failed = 1; return -1; }
        if (q.i != j) { p->i = q.i; return fail(p, "unbalanced ')' in /regex/"); }
        p->i = j + 1;
        if (json_safe)
            for (int k = n0; k < a->n; k++)
                if (a->nodes[k].kind == AST_CLASS) {
                    a->nodes[k].cls[0] &= ~0xffffffffull;           /* control characters */
                    a->nodes[k].cls[0] &= ~(1ull << '"');
                    a->nodes[k].cls[1] &= ~(1ull << ('\\' - 64));
                }
        return x == -3 ? ast_node(a, AST_EMPTY, 0, 0) : x;
    }
    if (isalpha(c) || c == '_' || c == '-') {
        size_t j = p->i;
        while (j < p->n && (isalnum((unsigned char)p->s[j]) || p->s[j] == '_' || p->s[j] == '-' || p->s[j] == '.')) j++;
        /* a name followed by ::= or ':' starts the next rule */
        size_t k = j;
        while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t')) k++;
        if (k < p->n && p->s[k] == ':') return -3;
        int r = ast_rule(a, p->s + p->i, j - p->i);
        p->i = j;
        if (r < 0) return fail(p, "too many rules");
        return ast_node(a, AST_REF, r, 0);
    }
    return -3;
}

static int parse_seq(P *p) {
    int r = -3;
    for (;;) {
        skip_ws(p);
        int x = parse_atom(p);
        if (x == -3) break;
        if (x < 0) return -1;
        for (;;) {
            skip_ws(p);
            int c = peek(p), lo = 0, hi = 0; /* set on every path that reads them (gcc -O1 cannot tell) */
            if (c == '*') { lo = 0; hi = -1; p->i++; }
            else if (c == '+') { lo = 1; hi = -1; p->i++; }
            else if (c == '?') { lo = 0; hi = 1; p->i++; }
            else if (c == '{') {
                int q = parse_braces(p, &lo, &hi);
                if (q < 0) return -1;
                if (q == 1) break;
            } else break;
            if (p->regex && (peek(p) == '?' || peek(p) == '+')) p->i++; /* lazy / possessive: same language */
            AstNode *in = &p->a->nodes[x];
            if (in->kind == AST_REP && in->hi < 0 && hi < 0 && in->lo <= 1 && lo <= 1) {
                /* (x+)+ = x+, (x*)* = (x+)* = (x*)+ = x*: one loop, not nested ones */
                in->lo = in->lo && lo;
                continue;
            }
            x = ast_node(p->a, AST_REP, x, 0);
            if (x < 0) return fail(p, "grammar too large");
            p->a->nodes[x].lo = lo;
            p->a->nodes[x].hi = hi;
        }
        r = r == -3 ? x : ast_node(p->a, AST_SEQ, r, x);
        if (p->a->too_big) return fail(p, "grammar too large");
    }
    return r;
}

static int parse_alt(P *p) {
    int r = parse_seq(p);
    if (r == -1) return -1;
    for (;;) {
        skip_ws(p);
        if (peek(p) != '|') return r;
        p->i++;
        int x = parse_seq(p);
        if (x == -1) return -1;
        if (r == -3) r = ast_node(p->a, AST_EMPTY, 0, 0);
        if (x == -3) x = ast_node(p->a, AST_EMPTY, 0, 0);
        r = ast_node(p->a, AST_ALT, r, x);
        if (r < 0) return fail(p, "grammar too large");
    }
}

int grammar_parse_regex(Ast *a, const char *s, size_t n, Err *err) {
    P p = { a, s, 0, n, 1, 0, err, 0 };
    int x = parse_alt(&p);
    if (p.failed || x == -1) return -1;
    if (p.i != n) return fail(&p, "unbalanced ')'");
    return x == -3 ? ast_node(a, AST_EMPTY, 0, 0) : x;
}

int grammar_parse_gbnf(Ast *a, const char *s, size_t n, Err *err) {
    P p = { a, s, 0, n, 0, 0, err, 0 };
    int first = -1;
    for (;;) {
        skip_ws(&p);
        if (p.i >= n) break;
        size_t j = p.i;
        while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_' || s[j] == '-' || s[j] == '.')) j++;
        if (j == p.i) return fail(&p, "expected a rule name");
        size_t name0 = p.i, name1 = j;
        p.i = j;
        skip_ws(&p);
        if (p.i + 3 <= n && !memcmp(s + p.i, "::=", 3)) p.i += 3;
        else if (peek(&p) == ':') p.i++;
        else return fail(&p, "expected '::=' after the rule name");
        int r = ast_rule(a, s + name0, name1 - name0);
        if (r < 0) return fail(&p, "too many rules");
        if (a->body[r] >= 0) return fail(&p, "rule defined twice");
        int x = parse_alt(&p);
        if (x == -1) return -1;
        a->body[r] = x == -3 ? ast_node(a, AST_EMPTY, 0, 0) : x;
        if (first < 0) first = r;
        if (a->too_big) return fail(&p, "grammar too large");
    }
    if (first < 0) return ERR(err, 400, "grammar: no rules");
    for (int i = 0; i < a->n_rules; i++)
        if (!strcmp(a->names[i], "root") && a->body[i] >= 0) a->root = i;
    if (a->root < 0)
        for (int i = 0; i < a->n_rules; i++)
            if (!strcmp(a->names[i], "start") && a->body[i] >= 0) a->root = i;
    if (a->root < 0) return ERR(err, 400, "grammar: no `root` (or `start`) rule");
    return 0;
}
