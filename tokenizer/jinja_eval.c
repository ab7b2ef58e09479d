/*
 * jinja_eval.c - render a parsed chat template: scopes (a fresh one per
 * loop iteration, as Jinja has), the loop object, namespace(), operators,
 * filters, tests, and the str/dict/list methods templates call, all with
 * Python's semantics. Values are json_t (NULL = Undefined); every eval
 * returns a new reference. Not here: parsing (jinja_parse.c).
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <utf8proc.h>

#include "jinja.h"

typedef struct Render {
    StrBuf out;
    json_t *frames[256]; int n_frames;
    json_t *undef;             /* stored for variables set to Undefined */
    json_t *ns[64]; int n_ns;  /* objects made by namespace() */
    Err *e;
    bool failed;
    int ctl;                   /* 1 break, 2 continue */
} Render;

static json_t *fail(Render *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static json_t *fail(Render *r, int line, const char *fmt, ...) {
    if (r->failed) return NULL;
    r->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ERR(r->e, 400, "chat template line %d: %s", line, msg);
    return NULL;
}

static json_t *eval(Render *r, Node *n);
static void exec(Render *r, Node *n);

static json_t *str_new(const char *s, size_t n) { return json_stringn_nocheck(s, n); }
static json_t *sb_take(StrBuf *b) { json_t *v = str_new(b->s ? b->s : "", b->n); free(b->s); return v; }
static json_t *to_str(json_t *v) {
    if (v && json_is_string(v)) return json_incref(v);
    StrBuf b = {0};
    jv_str(&b, v);
    return sb_take(&b);
}

/* ---- UTF-8 code points ---- */
static size_t n_chars(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}
static int32_t next_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { (*i)++; return 0xFFFD; }
    *i += (size_t)k;
    return cp;
}
static bool py_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
static void put_cp(StrBuf *b, int32_t cp) {
    utf8proc_uint8_t buf[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, buf);
    sb_put(b, (char *)buf, (size_t)k);
}
/* Byte offsets of code points (n_chars + 1 entries). */
static size_t *cp_offsets(const char *s, size_t n, size_t *count) {
    size_t c = n_chars(s, n), k = 0;
    size_t *o = xmalloc((c + 1) * sizeof *o);
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) o[k++] = i;
    o[k] = n;
    *count = c;
    return o;
}

/* ---- variables ---- */
static json_t *lookup(Render *r, const char *name) {
    for (int i = r->n_frames - 1; i >= 0; i--) {
        json_t *v = json_object_get(r->frames[i], name);
        if (v) return v == r->undef ? NULL : json_incref(v);
    }
    return NULL;
}

static bool is_ns(Render *r, json_t *v) {
    for (int i = 0; i < r->n_ns; i++)
        if (r->ns[i] == v) return true;
    return false;
}

/* ---- indexing ---- */
static json_t *get_item(Render *r, int line, json_t *obj, json_t *key) {
    if (!obj) return fail(r, line, "cannot index an undefined value");
    if (json_is_object(obj)) {
        if (!key || !json_is_string(key)) return NULL;
        json_t *v = json_object_get(obj, json_string_value(key));
        return v ? json_incref(v) : NULL;
    }
    if ((json_is_array(obj) || json_is_string(obj)) && key && (json_is_integer(key) || json_is_boolean(key))) {
        json_int_t i = json_is_integer(key) ? json_integer_value(key) : json_is_true(key);
        if (json_is_array(obj)) {
            json_int_t n = (json_int_t)json_array_size(obj);
            if (i < 0) i += n;
            if (i < 0 || i >= n) return NULL;
            return json_incref(json_array_get(obj, (size_t)i));
        }
        size_t cnt;
        size_t *o = cp_offsets(json_string_value(obj), json_string_length(obj), &cnt);
        if (i < 0) i += (json_int_t)cnt;
        json_t *v = i < 0 || i >= (json_int_t)cnt ? NULL : str_new(json_string_value(obj) + o[i], o[i + 1] - o[i]);
        free(o);
        return v;
    }
    return NULL;
}

static bool slice_arg(Render *r, int line, json_t *v, json_int_t *out) {
    if (!v || json_is_null(v)) return false;
    if (!json_is_integer(v)) { fail(r, line, "slice indices must be integers"); return false; }
    *out = json_integer_value(v);
    return true;
}

static json_t *do_slice(Render *r, Node *n, json_t *obj) {
    json_t *a = n->b ? eval(r, n->b) : NULL, *b = n->kids[0] ? eval(r, n->kids[0]) : NULL,
           *c = n->kids[1] ? eval(r, n->kids[1]) : NULL;
    json_int_t lo = 0, hi = 0, st = 1;
    bool has_lo = slice_arg(r, n->line, a, &lo), has_hi = slice_arg(r, n->line, b, &hi);
    slice_arg(r, n->line, c, &st);
    json_decref(a); json_decref(b); json_decref(c);
    if (r->failed) return NULL;
    if (st == 0) return fail(r, n->line, "slice step cannot be zero");
    bool is_str = obj && json_is_string(obj);
    if (!obj || !(is_str || json_is_array(obj))) return fail(r, n->line, "cannot slice %s", jv_type_name(obj));
    size_t cnt, *o = NULL;
    if (is_str) o = cp_offsets(json_string_value(obj), json_string_length(obj), &cnt);
    else cnt = json_array_size(obj);
    json_int_t len = (json_int_t)cnt;
    /* Python's slice.indices */
    if (st > 0) {
        lo = has_lo ? (lo < 0 ? (lo + len < 0 ? 0 : lo + len) : (lo > len ? len : lo)) : 0;
        hi = has_hi ? (hi < 0 ? (hi + len < 0 ? 0 : hi + len) : (hi > len ? len : hi)) : len;
    } else {
        lo = has_lo ? (lo < 0 ? (lo + len < 0 ? -1 : lo + len) : (lo >= len ? len - 1 : lo)) : len - 1;
        hi = has_hi ? (hi < 0 ? (hi + len < 0 ? -1 : hi + len) : (hi >= len ? len - 1 : hi)) : -1;
    }
    StrBuf b2 = {0};
    json_t *arr = is_str ? NULL : json_array();
    for (json_int_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        if (is_str) sb_put(&b2, json_string_value(obj) + o[i], o[i + 1] - o[i]);
        else json_array_append(arr, json_array_get(obj, (size_t)i));
    }
    free(o);
    return is_str ? sb_take(&b2) : arr;
}

/* ---- string methods ---- */
static bool in_chars(const char *chars, size_t nc, int32_t cp) {
    for (size_t i = 0; i < nc;)
        if (next_cp(chars, nc, &i) == cp) return true;
    return false;
}

/* which: 1 left, 2 right, 3 both; chars NULL = whitespace */
static json_t *str_strip(json_t *s, json_t *chars, int which) {
    const char *p = json_string_value(s), *cs = chars && json_is_string(chars) ? json_string_value(chars) : NULL;
    size_t n = json_string_length(s), nc = cs ? json_string_length(chars) : 0, a = 0, b = n;
    if (which & 1)
        while (a < b) {
            size_t j = a;
            int32_t cp = next_cp(p, n, &j);
            if (cs ? !in_chars(cs, nc, cp) : !py_space(cp)) break;
            a = j;
        }
    if (which & 2)
        while (b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)p[j] & 0xC0) == 0x80) j--;
            size_t k = j;
            int32_t cp = next_cp(p, n, &k);
            if (cs ? !in_chars(cs, nc, cp) : !py_space(cp)) break;
            b = j;
        }
    return str_new(p + a, b - a);
}

static json_t *str_split(Render *r, int line, json_t *s, json_t *sep, json_int_t maxsplit, bool from_right) {
    const char *p = json_string_value(s);
    size_t n = json_string_length(s);
    json_t *out = json_array();
    if (!sep || json_is_null(sep)) {
        /* runs of whitespace, no empty strings */
        size_t i = 0;
        json_int_t splits = 0;
        if (from_right && maxsplit >= 0) { json_decref(out); return fail(r, line, "rsplit with maxsplit on whitespace is not supported"); }
        while (i < n) {
            size_t j = i;
            while (j < n) { size_t k = j; if (!py_space(next_cp(p, n, &k))) break; j = k; }
            i = j;
            if (i >= n) break;
            if (maxsplit >= 0 && splits == maxsplit) {
                size_t e = n;
                while (e > i) { size_t k = e - 1; while (k > i && ((unsigned char)p[k] & 0xC0) == 0x80) k--; size_t q = k; if (!py_space(next_cp(p, n, &q))) break; e = k; }
                json_array_append_new(out, str_new(p + i, e - i));
                break;
            }
            while (j < n) { size_t k = j; if (py_space(next_cp(p, n, &k))) break; j = k; }
            json_array_append_new(out, str_new(p + i, j - i));
            splits++;
            i = j;
        }
        return out;
    }
    if (!json_is_string(sep)) { json_decref(out); return fail(r, line, "split separator must be a string"); }
    const char *q = json_string_value(sep);
    size_t m = json_string_length(sep);
    if (!m) { json_decref(out); return fail(r, line, "empty separator"); }
    if (!from_right) {
        size_t i = 0;
        json_int_t splits = 0;
        for (;;) {
            const char *hit = maxsplit >= 0 && splits >= maxsplit ? NULL : memmem(p + i, n - i, q, m);
            if (!hit) { json_array_append_new(out, str_new(p + i, n - i)); break; }
            json_array_append_new(out, str_new(p + i, (size_t)(hit - p) - i));
            i = (size_t)(hit - p) + m;
            splits++;
        }
    } else {
        size_t e = n;
        json_int_t splits = 0;
        for (;;) {
            const char *hit = NULL;
            if (!(maxsplit >= 0 && splits >= maxsplit))
                for (size_t k = e >= m ? e - m + 1 : 0; k-- > 0;)
                    if (!memcmp(p + k, q, m)) { hit = p + k; break; }
            if (!hit) { json_array_insert_new(out, 0, str_new(p, e)); break; }
            json_array_insert_new(out, 0, str_new(hit + m, e - (size_t)(hit - p) - m));
            e = (size_t)(hit - p);
            splits++;
        }
    }
    return out;
}

static json_t *str_case(json_t *s, int mode) { /* 0 lower 1 upper 2 title 3 capitalize */
    const char *p = json_string_value(s);
    size_t n = json_string_length(s), i = 0;
    StrBuf b = {0};
    bool prev_cased = false, first = true;
    while (i < n) {
        int32_t cp = next_cp(p, n, &i);
        int32_t o = cp;
        if (mode == 0) o = utf8proc_tolower(cp);
        else if (mode == 1) o = utf8proc_toupper(cp);
        else if (mode == 2) o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        else o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
        utf8proc_category_t c = utf8proc_category(cp);
        prev_cased = c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
        first = false;
        put_cp(&b, o);
    }
    if (!b.s) return str_new("", 0);
    return sb_take(&b);
}

static json_t *str_replace(json_t *s, json_t *old, json_t *new, json_int_t count) {
    const char *p = json_string_value(s), *q = json_string_value(old), *w = json_string_value(new);
    size_t n = json_string_length(s), m = json_string_length(old), wl = json_string_length(new), i = 0;
    StrBuf b = {0};
    json_int_t done = 0;
    if (!m) { /* Python inserts new between every char */
        size_t k = 0;
        while (k <= n && (count < 0 || done < count)) {
            sb_put(&b, w, wl);
            done++;
            if (k == n) { k++; break; }
            size_t j = k;
            next_cp(p, n, &j);
            sb_put(&b, p + k, j - k);
            k = j;
        }
        if (k < n) sb_put(&b, p + k, n - k);
        return sb_take(&b);
    }
    while (i <= n) {
        const char *hit = count >= 0 && done >= count ? NULL : memmem(p + i, n - i, q, m);
        if (!hit) { sb_put(&b, p + i, n - i); break; }
        sb_put(&b, p + i, (size_t)(hit - p) - i);
        sb_put(&b, w, wl);
        i = (size_t)(hit - p) + m;
        done++;
    }
    if (!b.s) return str_new("", 0);
    return sb_take(&b);
}

static bool str_affix(json_t *s, json_t *x, bool end) {
    size_t n = json_string_length(s), m = json_string_length(x);
    return m <= n && !memcmp(json_string_value(s) + (end ? n - m : 0), json_string_value(x), m);
}

/* ---- calls ---- */
typedef struct Args { json_t *pos[8]; int n; char *kw[8]; json_t *kwv[8]; int nkw; } Args;

static void args_eval(Render *r, Node *n, Args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < n->n_kids && i < 8; i++) a->pos[a->n++] = eval(r, n->kids[i]);
    for (int i = 0; i < n->n_kw && i < 8; i++) { a->kw[a->nkw] = n->kw[i]; a->kwv[a->nkw++] = eval(r, n->kwv[i]); }
    if (n->n_kids > 8 || n->n_kw > 8) fail(r, n->line, "too many arguments");
}
static void args_free(Args *a) {
    for (int i = 0; i < a->n; i++) json_decref(a->pos[i]);
    for (int i = 0; i < a->nkw; i++) json_decref(a->kwv[i]);
}
/* positional i or keyword name; borrowed; *found tells whether given */
static json_t *args_get(Args *a, int i, const char *name, bool *found) {
    if (i >= 0 && i < a->n) { if (found) *found = true; return a->pos[i]; }
    for (int k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kw[k], name)) { if (found) *found = true; return a->kwv[k]; }
    if (found) *found = false;
    return NULL;
}

static json_t *apply_filter(Render *r, int line, const char *name, json_t *v, Args *a);
static int apply_test(Render *r, int line, const char *name, json_t *v, Args *a, int first_arg);

static json_t *call_method(Render *r, Node *n, json_t *obj, Args *a) {
    const char *m = n->a->name;
    int line = n->line;
    if (obj && json_is_string(obj)) {
        json_t *x = args_get(a, 0, NULL, NULL);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            bool end = m[0] == 'e';
            if (x && json_is_string(x)) return json_boolean(str_affix(obj, x, end));
            if (x && json_is_array(x)) {
                for (size_t i = 0; i < json_array_size(x); i++)
                    if (json_is_string(json_array_get(x, i)) && str_affix(obj, json_array_get(x, i), end)) return json_true();
                return json_false();
            }
            return fail(r, line, "%s needs a string argument", m);
        }
        if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
            json_t *sep = args_get(a, 0, "sep", NULL), *mx = args_get(a, 1, "maxsplit", NULL);
            return str_split(r, line, obj, sep, mx && json_is_integer(mx) ? json_integer_value(mx) : -1, m[0] == 'r');
        }
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            if (x && !json_is_string(x) && !json_is_null(x)) return fail(r, line, "%s arg must be None or str", m);
            return str_strip(obj, x, m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3);
        }
        if (!strcmp(m, "lower")) return str_case(obj, 0);
        if (!strcmp(m, "upper")) return str_case(obj, 1);
        if (!strcmp(m, "title")) return str_case(obj, 2);
        if (!strcmp(m, "capitalize")) return str_case(obj, 3);
        if (!strcmp(m, "replace")) {
            json_t *o = args_get(a, 0, NULL, NULL), *w = args_get(a, 1, NULL, NULL), *c = args_get(a, 2, "count", NULL);
            if (!o || !w || !json_is_string(o) || !json_is_string(w)) return fail(r, line, "replace needs two strings");
            return str_replace(obj, o, w, c && json_is_integer(c) ? json_integer_value(c) : -1);
        }
        if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "count") || !strcmp(m, "index")) {
            if (!x || !json_is_string(x)) return fail(r, line, "%s needs a string", m);
            const char *p = json_string_value(obj), *q = json_string_value(x);
            size_t np = json_string_length(obj), nq = json_string_length(x);
            json_int_t found = -1, cnt = 0;
            for (size_t i = 0; i + nq <= np; i++)
                if (!memcmp(p + i, q, nq)) {
                    if (found < 0 || m[0] == 'r') found = (json_int_t)n_chars(p, i);
                    cnt++;
                    if (nq) i += nq - 1;
                    if (m[0] == 'f' || m[0] == 'i') break;
                }
            if (m[0] == 'c') return json_integer(cnt);
            if (m[0] == 'i' && found < 0) return fail(r, line, "substring not found");
            return json_integer(found);
        }
        if (!strcmp(m, "splitlines")) {
            json_t *out = json_array();
            const char *p = json_string_value(obj);
            size_t np = json_string_length(obj), i = 0, s = 0;
            while (i < np) {
                size_t j = i;
                int32_t cp = next_cp(p, np, &j);
                if (cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
                    cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
                    json_array_append_new(out, str_new(p + s, i - s));
                    if (cp == '\r' && j < np && p[j] == '\n') j++;
                    s = j;
                }
                i = j;
            }
            if (s < np) json_array_append_new(out, str_new(p + s, np - s));
            return out;
        }
        if (!strncmp(m, "is", 2)) {
            const char *p = json_string_value(obj);
            size_t np = json_string_length(obj), i = 0;
            bool ok = np > 0, cased = false;
            while (i < np && ok) {
                int32_t cp = next_cp(p, np, &i);
                utf8proc_category_t c = utf8proc_category(cp);
                bool letter = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
                bool digit = c == UTF8PROC_CATEGORY_ND;
                if (!strcmp(m, "isdigit")) ok = digit;
                else if (!strcmp(m, "isspace")) ok = py_space(cp);
                else if (!strcmp(m, "isalpha")) ok = letter;
                else if (!strcmp(m, "isalnum")) ok = letter || digit || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
                else if (!strcmp(m, "islower")) { ok = c != UTF8PROC_CATEGORY_LU && c != UTF8PROC_CATEGORY_LT; cased |= c == UTF8PROC_CATEGORY_LL; }
                else if (!strcmp(m, "isupper")) { ok = c != UTF8PROC_CATEGORY_LL && c != UTF8PROC_CATEGORY_LT; cased |= c == UTF8PROC_CATEGORY_LU; }
            }
            if (!strcmp(m, "islower") || !strcmp(m, "isupper")) ok = ok && cased;
            return json_boolean(ok);
        }
        if (!strcmp(m, "join")) {
            if (!x || !json_is_array(x)) return fail(r, line, "join needs a list");
            StrBuf b = {0};
            for (size_t i = 0; i < json_array_size(x); i++) {
                json_t *it = json_array_get(x, i);
                if (!json_is_string(it)) { free(b.s); return fail(r, line, "join: sequence item %zu: expected str", i); }
                if (i) sb_put(&b, json_string_value(obj), json_string_length(obj));
                sb_put(&b, json_string_value(it), json_string_length(it));
            }
            return b.s ? sb_take(&b) : str_new("", 0);
        }
    } else if (obj && json_is_object(obj) && !is_ns(r, obj)) {
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            json_t *out = json_array(), *v;
            const char *k;
            json_object_foreach(obj, k, v) {
                if (m[0] == 'k') json_array_append_new(out, json_string(k));
                else if (m[0] == 'v') json_array_append(out, v);
                else json_array_append_new(out, json_pack("[sO]", k, v));
            }
            return out;
        }
        if (!strcmp(m, "get")) {
            json_t *k = args_get(a, 0, NULL, NULL), *d = args_get(a, 1, "default", NULL);
            json_t *v = k && json_is_string(k) ? json_object_get(obj, json_string_value(k)) : NULL;
            if (v) return json_incref(v);
            return d ? json_incref(d) : json_null();
        }
    } else if (obj && json_is_array(obj)) {
        json_t *x = args_get(a, 0, NULL, NULL);
        if (!strcmp(m, "count") || !strcmp(m, "index")) {
            json_int_t c = 0;
            for (size_t i = 0; i < json_array_size(obj); i++)
                if (jv_equal(json_array_get(obj, i), x)) {
                    if (m[0] == 'i') return json_integer((json_int_t)i);
                    c++;
                }
            if (m[0] == 'i') return fail(r, line, "value is not in list");
            return json_integer(c);
        }
    }
    return fail(r, line, "'%s' object has no method '%s'", jv_type_name(obj), m);
}

static json_t *call_func(Render *r, Node *n, Args *a) {
    const char *f = n->a->name;
    int line = n->line;
    if (!strcmp(f, "raise_exception")) {
        StrBuf b = {0};
        jv_str(&b, args_get(a, 0, "message", NULL));
        fail(r, line, "raise_exception: %s", b.s ? b.s : "");
        free(b.s);
        return NULL;
    }
    if (!strcmp(f, "namespace") || !strcmp(f, "dict")) {
        json_t *o = json_object();
        json_t *init = args_get(a, 0, NULL, NULL);
        if (init && json_is_object(init)) json_object_update(o, init);
        for (int i = 0; i < a->nkw; i++) json_object_set(o, a->kw[i], a->kwv[i] ? a->kwv[i] : r->undef);
        if (f[0] == 'n') {
            if (r->n_ns == 64) { json_decref(o); return fail(r, line, "too many namespaces"); }
            r->ns[r->n_ns++] = json_incref(o);
        }
        return o;
    }
    if (!strcmp(f, "range")) {
        json_int_t lo = 0, hi, st = 1;
        for (int i = 0; i < a->n; i++)
            if (!a->pos[i] || !json_is_integer(a->pos[i])) return fail(r, line, "range needs integers");
        if (a->n == 1) hi = json_integer_value(a->pos[0]);
        else if (a->n >= 2) { lo = json_integer_value(a->pos[0]); hi = json_integer_value(a->pos[1]); if (a->n == 3) st = json_integer_value(a->pos[2]); }
        else return fail(r, line, "range needs arguments");
        if (st == 0) return fail(r, line, "range step is zero");
        if ((hi - lo) / st > 100000) return fail(r, line, "range too large");
        json_t *out = json_array();
        for (json_int_t i = lo; st > 0 ? i < hi : i > hi; i += st) json_array_append_new(out, json_integer(i));
        return out;
    }
    if (!strcmp(f, "strftime_now")) {
        json_t *fmt = args_get(a, 0, NULL, NULL);
        if (!fmt || !json_is_string(fmt)) return fail(r, line, "strftime_now needs a format string");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        size_t k = strftime(buf, sizeof buf, json_string_value(fmt), &tm);
        return str_new(buf, k);
    }
    return fail(r, line, "unknown function %s", f);
}

/* ---- filters ---- */
static json_t *iter_list(Render *r, int line, json_t *v) {
    if (!v) return json_array();
    if (json_is_array(v)) return json_incref(v);
    json_t *out = json_array();
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) json_array_append_new(out, json_string(k));
    } else if (json_is_string(v)) {
        const char *p = json_string_value(v);
        size_t n = json_string_length(v), i = 0;
        while (i < n) { size_t s = i; next_cp(p, n, &i); json_array_append_new(out, str_new(p + s, i - s)); }
    } else { json_decref(out); return fail(r, line, "'%s' object is not iterable", jv_type_name(v)); }
    return out;
}

static int cmp_sort(json_t *a, json_t *b, bool ci) {
    if (ci && json_is_string(a) && json_is_string(b)) {
        json_t *x = str_case(a, 0), *y = str_case(b, 0);
        int c = jv_cmp(x, y);
        json_decref(x);
        json_decref(y);
        return c;
    }
    return jv_cmp(a, b);
}

static json_t *attr_of(json_t *v, const char *attr) {
    if (!v || !json_is_object(v)) return NULL;
    /* dotted paths like "function.name" */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", attr);
    json_t *cur = v;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) cur = json_is_object(cur) ? json_object_get(cur, tok) : NULL;
    return cur;
}

static json_t *apply_filter(Render *r, int line, const char *f, json_t *v, Args *a) {
    if (!strcmp(f, "safe")) return v ? json_incref(v) : NULL;
    if (!strcmp(f, "tojson")) {
        json_t *ind = args_get(a, 0, "indent", NULL), *asc = args_get(a, -1, "ensure_ascii", NULL),
               *sep = args_get(a, -1, "separators", NULL), *sk = args_get(a, -1, "sort_keys", NULL);
        int indent = ind && json_is_integer(ind) ? (int)json_integer_value(ind) : -1;
        const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
        if (sep && json_is_array(sep) && json_array_size(sep) == 2) {
            isep = json_string_value(json_array_get(sep, 0));
            ksep = json_string_value(json_array_get(sep, 1));
            if (!isep || !ksep) return fail(r, line, "tojson separators must be strings");
        }
        StrBuf b = {0};
        if (jv_json(&b, v, jv_truthy(asc), indent, isep, ksep, jv_truthy(sk), 0)) {
            free(b.s);
            return fail(r, line, "Object of type %s is not JSON serializable", jv_type_name(v));
        }
        return sb_take(&b);
    }
    if (!strcmp(f, "trim")) {
        json_t *s = to_str(v), *out = str_strip(s, args_get(a, 0, "chars", NULL), 3);
        json_decref(s);
        return out;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (!v) return json_integer(0);
        if (json_is_string(v)) return json_integer((json_int_t)n_chars(json_string_value(v), json_string_length(v)));
        if (json_is_array(v)) return json_integer((json_int_t)json_array_size(v));
        if (json_is_object(v)) return json_integer((json_int_t)json_object_size(v));
        return fail(r, line, "object of type '%s' has no len()", jv_type_name(v));
    }
    if (!strcmp(f, "string")) return to_str(v);
    if (!strcmp(f, "lower") || !strcmp(f, "upper") || !strcmp(f, "capitalize") || !strcmp(f, "title")) {
        json_t *s = to_str(v), *out = str_case(s, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3);
        json_decref(s);
        return out;
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        json_t *d = args_get(a, 0, "default_value", NULL), *bo = args_get(a, 1, "boolean", NULL);
        if (!v || (jv_truthy(bo) && !jv_truthy(v))) return d ? json_incref(d) : str_new("", 0);
        return json_incref(v);
    }
    if (!strcmp(f, "e") || !strcmp(f, "escape")) {
        json_t *s = to_str(v);
        StrBuf b = {0};
        for (size_t i = 0; i < json_string_length(s); i++) {
            char c = json_string_value(s)[i];
            if (c == '&') sb_puts(&b, "&amp;");
            else if (c == '<') sb_puts(&b, "&lt;");
            else if (c == '>') sb_puts(&b, "&gt;");
            else if (c == '"') sb_puts(&b, "&#34;");
            else if (c == '\'') sb_puts(&b, "&#39;");
            else sb_putc(&b, c);
        }
        json_decref(s);
        return b.s ? sb_take(&b) : str_new("", 0);
    }
    if (!strcmp(f, "abs")) {
        if (v && json_is_integer(v)) return json_integer(llabs(json_integer_value(v)));
        if (v && json_is_real(v)) return json_real(fabs(json_real_value(v)));
        return fail(r, line, "bad operand type for abs()");
    }
    if (!strcmp(f, "int") || !strcmp(f, "float") || !strcmp(f, "round")) {
        double d = 0;
        bool ok = true;
        if (v && json_is_number(v)) d = json_number_value(v);
        else if (v && json_is_boolean(v)) d = json_is_true(v);
        else if (v && json_is_string(v)) { char *end; d = strtod(json_string_value(v), &end); ok = end != json_string_value(v) && !*end; }
        else ok = false;
        if (!strcmp(f, "round")) {
            json_t *pr = args_get(a, 0, "precision", NULL), *me = args_get(a, 1, "method", NULL);
            double sc = pow(10, pr && json_is_integer(pr) ? (double)json_integer_value(pr) : 0);
            const char *mm = me && json_is_string(me) ? json_string_value(me) : "common";
            double x = d * sc;
            x = !strcmp(mm, "floor") ? floor(x) : !strcmp(mm, "ceil") ? ceil(x) : (x < 0 ? -floor(-x + 0.5) : floor(x + 0.5));
            return json_real(x / sc);
        }
        json_t *dflt = args_get(a, 0, "default", NULL);
        if (!ok) return dflt ? json_incref(dflt) : f[0] == 'i' ? json_integer(0) : json_real(0);
        if (f[0] == 'i') return json_integer((json_int_t)d);
        return json_real(d);
    }
    if (!strcmp(f, "replace")) {
        json_t *s = to_str(v), *o = args_get(a, 0, "old", NULL), *w = args_get(a, 1, "new", NULL), *c = args_get(a, 2, "count", NULL);
        if (!o || !w || !json_is_string(o) || !json_is_string(w)) { json_decref(s); return fail(r, line, "replace needs strings"); }
        json_t *out = str_replace(s, o, w, c && json_is_integer(c) ? json_integer_value(c) : -1);
        json_decref(s);
        return out;
    }
    if (!strcmp(f, "items")) {
        if (!v) return json_array();
        if (!json_is_object(v)) return fail(r, line, "items filter needs a mapping");
        json_t *out = json_array(), *x;
        const char *k;
        json_object_foreach(v, k, x) json_array_append_new(out, json_pack("[sO]", k, x));
        return out;
    }
    json_t *lst = iter_list(r, line, v);
    if (!lst) return NULL;
    json_t *out = NULL;
    size_t n = json_array_size(lst);
    if (!strcmp(f, "list")) out = json_incref(lst);
    else if (!strcmp(f, "first")) out = n ? json_incref(json_array_get(lst, 0)) : NULL;
    else if (!strcmp(f, "last")) out = n ? json_incref(json_array_get(lst, n - 1)) : NULL;
    else if (!strcmp(f, "reverse")) {
        if (v && json_is_string(v)) {
            StrBuf b = {0};
            for (size_t i = n; i-- > 0;) jv_str(&b, json_array_get(lst, i));
            out = b.s ? sb_take(&b) : str_new("", 0);
        } else {
            out = json_array();
            for (size_t i = n; i-- > 0;) json_array_append(out, json_array_get(lst, i));
        }
    } else if (!strcmp(f, "join")) {
        json_t *d = args_get(a, 0, "d", NULL), *at = args_get(a, 1, "attribute", NULL);
        StrBuf b = {0};
        for (size_t i = 0; i < n; i++) {
            if (i && d) jv_str(&b, d);
            json_t *it = json_array_get(lst, i);
            jv_str(&b, at && json_is_string(at) ? attr_of(it, json_string_value(at)) : it);
        }
        out = b.s ? sb_take(&b) : str_new("", 0);
    } else if (!strcmp(f, "map")) {
        json_t *at = args_get(a, -1, "attribute", NULL), *fn = args_get(a, 0, NULL, NULL);
        out = json_array();
        for (size_t i = 0; i < n && !r->failed; i++) {
            json_t *it = json_array_get(lst, i);
            if (at && json_is_string(at)) {
                json_t *x = attr_of(it, json_string_value(at));
                if (!x) x = args_get(a, -1, "default", NULL);
                json_array_append(out, x ? x : json_null());
            } else if (fn && json_is_string(fn)) {
                Args sub = {0};
                for (int k = 1; k < a->n; k++) sub.pos[sub.n++] = a->pos[k];
                json_t *x = apply_filter(r, line, json_string_value(fn), it, &sub);
                json_array_append_new(out, x ? x : json_null());
            } else { fail(r, line, "map needs attribute= or a filter name"); }
        }
    } else if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
        bool attr = strstr(f, "attr") != NULL, keep = f[0] == 's';
        json_t *an = attr ? args_get(a, 0, NULL, NULL) : NULL, *tn = args_get(a, attr ? 1 : 0, NULL, NULL);
        out = json_array();
        for (size_t i = 0; i < n && !r->failed; i++) {
            json_t *it = json_array_get(lst, i), *x = attr ? attr_of(it, an && json_is_string(an) ? json_string_value(an) : "") : it;
            int t = tn && json_is_string(tn) ? apply_test(r, line, json_string_value(tn), x, a, attr ? 2 : 1) : jv_truthy(x);
            if (t < 0) break;
            if ((t != 0) == keep) json_array_append(out, it);
        }
    } else if (!strcmp(f, "unique")) {
        out = json_array();
        for (size_t i = 0; i < n; i++) {
            bool dup = false;
            for (size_t j = 0; j < json_array_size(out) && !dup; j++) dup = cmp_sort(json_array_get(out, j), json_array_get(lst, i), true) == 0;
            if (!dup) json_array_append(out, json_array_get(lst, i));
        }
    } else if (!strcmp(f, "sort") || !strcmp(f, "max") || !strcmp(f, "min")) {
        bool rev = f[0] == 's' && jv_truthy(args_get(a, 0, "reverse", NULL));
        json_t *cs = args_get(a, f[0] == 's' ? 1 : 0, "case_sensitive", NULL), *at = args_get(a, f[0] == 's' ? 2 : 1, "attribute", NULL);
        bool ci = !jv_truthy(cs);
        json_t **items = xmalloc((n + 1) * sizeof *items);
        for (size_t i = 0; i < n; i++) items[i] = json_array_get(lst, i);
        /* stable insertion sort: template lists are short */
        for (size_t i = 1; i < n && !r->failed; i++)
            for (size_t j = i; j > 0; j--) {
                json_t *x = at && json_is_string(at) ? attr_of(items[j - 1], json_string_value(at)) : items[j - 1];
                json_t *y = at && json_is_string(at) ? attr_of(items[j], json_string_value(at)) : items[j];
                int c = cmp_sort(x, y, ci);
                if (c == -2) { fail(r, line, "unorderable values in %s", f); break; }
                if (rev ? c >= 0 : c <= 0) break;
                json_t *t = items[j]; items[j] = items[j - 1]; items[j - 1] = t;
            }
        if (f[0] == 's') { out = json_array(); for (size_t i = 0; i < n; i++) json_array_append(out, items[i]); }
        else out = n ? json_incref(items[f[1] == 'a' ? n - 1 : 0]) : NULL;
        free(items);
    } else if (!strcmp(f, "sum")) {
        json_t *at = args_get(a, 0, "attribute", NULL), *st = args_get(a, 1, "start", NULL);
        double fs = st && json_is_number(st) ? json_number_value(st) : 0;
        json_int_t is = st && json_is_integer(st) ? json_integer_value(st) : 0;
        bool real = st && json_is_real(st);
        for (size_t i = 0; i < n; i++) {
            json_t *x = at && json_is_string(at) ? attr_of(json_array_get(lst, i), json_string_value(at)) : json_array_get(lst, i);
            if (!x || !(json_is_number(x) || json_is_boolean(x))) { fail(r, line, "sum of non-numbers"); break; }
            if (json_is_real(x)) real = true;
            fs += json_is_boolean(x) ? json_is_true(x) : json_number_value(x);
            is += json_is_integer(x) ? json_integer_value(x) : json_is_true(x);
        }
        out = real ? json_real(fs) : json_integer(is);
    } else if (!strcmp(f, "indent")) {
        json_t *w = args_get(a, 0, "width", NULL), *first = args_get(a, 1, "first", NULL), *blank = args_get(a, 2, "blank", NULL);
        StrBuf pad = {0}, b = {0};
        if (w && json_is_string(w)) jv_str(&pad, w);
        else for (json_int_t i = 0; i < (w && json_is_integer(w) ? json_integer_value(w) : 4); i++) sb_putc(&pad, ' ');
        json_t *s = to_str(v);
        const char *p = json_string_value(s);
        size_t np = json_string_length(s), i = 0;
        bool line_start = jv_truthy(first);
        while (i < np) {
            const char *nl = memchr(p + i, '\n', np - i);
            size_t e = nl ? (size_t)(nl - p) : np;
            if (line_start && (e > i || jv_truthy(blank)) && pad.s) sb_put(&b, pad.s, pad.n);
            sb_put(&b, p + i, e - i);
            if (nl) sb_putc(&b, '\n');
            i = e + (nl ? 1 : 0);
            line_start = true;
        }
        json_decref(s);
        free(pad.s);
        out = b.s ? sb_take(&b) : str_new("", 0);
    } else fail(r, line, "unsupported filter '%s'", f);
    json_decref(lst);
    return out;
}

/* ---- tests: 1 true, 0 false, -1 error ---- */
static int apply_test(Render *r, int line, const char *t, json_t *v, Args *a, int first_arg) {
    json_t *x = args_get(a, first_arg, NULL, NULL);
    if (!strcmp(t, "defined")) return v != NULL;
    if (!strcmp(t, "undefined")) return v == NULL;
    if (!strcmp(t, "none")) return v && json_is_null(v);
    if (!strcmp(t, "string")) return v && json_is_string(v);
    if (!strcmp(t, "number")) return v && (json_is_number(v) || json_is_boolean(v));
    if (!strcmp(t, "integer")) return v && json_is_integer(v);
    if (!strcmp(t, "float")) return v && json_is_real(v);
    if (!strcmp(t, "boolean")) return v && json_is_boolean(v);
    if (!strcmp(t, "true")) return v && json_is_true(v);
    if (!strcmp(t, "false")) return v && json_is_false(v);
    if (!strcmp(t, "mapping")) return v && json_is_object(v);
    if (!strcmp(t, "iterable") || !strcmp(t, "sequence")) return v && (json_is_string(v) || json_is_array(v) || json_is_object(v));
    if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==")) return jv_equal(v, x);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !jv_equal(v, x);
    if (!strcmp(t, "sameas")) return (v && x && json_typeof(v) == json_typeof(x) && (json_is_null(v) || json_is_boolean(v))) || v == x;
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (!v || !json_is_string(v)) return 0;
        json_t *c = str_case(v, t[0] == 'u'), *s = v;
        int eq = jv_equal(c, s);
        json_decref(c);
        return eq;
    }
    if (!strcmp(t, "in")) {
        if (!x) return 0;
        if (json_is_string(x)) return v && json_is_string(v) && memmem(json_string_value(x), json_string_length(x), json_string_value(v), json_string_length(v)) != NULL;
        if (json_is_array(x)) { for (size_t i = 0; i < json_array_size(x); i++) if (jv_equal(json_array_get(x, i), v)) return 1; return 0; }
        if (json_is_object(x)) return v && json_is_string(v) && json_object_get(x, json_string_value(v)) != NULL;
        fail(r, line, "'in' test on %s", jv_type_name(x));
        return -1;
    }
    if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (!v || !json_is_integer(v)) { fail(r, line, "%s test needs an integer", t); return -1; }
        json_int_t i = json_integer_value(v);
        if (t[0] == 'o') return (i % 2 + 2) % 2 == 1;
        if (t[0] == 'e') return i % 2 == 0;
        if (!x || !json_is_integer(x) || !json_integer_value(x)) { fail(r, line, "divisibleby needs a non-zero integer"); return -1; }
        return i % json_integer_value(x) == 0;
    }
    int c = jv_cmp(v, x);
    if (c == -2) { fail(r, line, "cannot compare %s and %s", jv_type_name(v), jv_type_name(x)); return -1; }
    if (!strcmp(t, "gt") || !strcmp(t, ">")) return c > 0;
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) return c >= 0;
    if (!strcmp(t, "lt") || !strcmp(t, "<")) return c < 0;
    if (!strcmp(t, "le") || !strcmp(t, "<=")) return c <= 0;
    fail(r, line, "unsupported test '%s'", t);
    return -1;
}

/* ---- operators ---- */
static json_t *arith(Render *r, int line, BinOp op, json_t *x, json_t *y) {
    if (op == OP_CONCAT) {
        StrBuf b = {0};
        jv_str(&b, x);
        jv_str(&b, y);
        return b.s ? sb_take(&b) : str_new("", 0);
    }
    if (!x || !y) return fail(r, line, "undefined value in an expression");
    bool nx = json_is_number(x) || json_is_boolean(x), ny = json_is_number(y) || json_is_boolean(y);
    if (op == OP_ADD && json_is_string(x) && json_is_string(y)) {
        StrBuf b = {0};
        sb_put(&b, json_string_value(x), json_string_length(x));
        sb_put(&b, json_string_value(y), json_string_length(y));
        return b.s ? sb_take(&b) : str_new("", 0);
    }
    if (op == OP_ADD && json_is_array(x) && json_is_array(y)) {
        json_t *o = json_copy(x);
        json_array_extend(o, y);
        return o;
    }
    if (op == OP_MUL && json_is_integer(x) && (json_is_string(y) || json_is_array(y))) { json_t *t = x; x = y; y = t; }
    if (op == OP_MUL && (json_is_string(x) || json_is_array(x)) && json_is_integer(y)) {
        json_int_t k = json_integer_value(y);
        if (k > 100000) return fail(r, line, "repetition too large");
        if (json_is_string(x)) {
            StrBuf b = {0};
            for (json_int_t i = 0; i < k; i++) sb_put(&b, json_string_value(x), json_string_length(x));
            return b.s ? sb_take(&b) : str_new("", 0);
        }
        json_t *o = json_array();
        for (json_int_t i = 0; i < k; i++) json_array_extend(o, x);
        return o;
    }
    if (!nx || !ny) return fail(r, line, "unsupported operand types: '%s' and '%s'", jv_type_name(x), jv_type_name(y));
    bool ints = !json_is_real(x) && !json_is_real(y);
    json_int_t a = json_is_integer(x) ? json_integer_value(x) : json_is_true(x);
    json_int_t b = json_is_integer(y) ? json_integer_value(y) : json_is_true(y);
    double fa = json_is_real(x) ? json_real_value(x) : (double)a, fb = json_is_real(y) ? json_real_value(y) : (double)b;
    switch (op) {
    case OP_ADD: return ints ? json_integer(a + b) : json_real(fa + fb);
    case OP_SUB: return ints ? json_integer(a - b) : json_real(fa - fb);
    case OP_MUL: return ints ? json_integer(a * b) : json_real(fa * fb);
    case OP_DIV: if (fb == 0) return fail(r, line, "division by zero"); return json_real(fa / fb);
    case OP_FLOORDIV:
        if (fb == 0) return fail(r, line, "division by zero");
        if (ints) { json_int_t q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q--; return json_integer(q); }
        return json_real(floor(fa / fb));
    case OP_MOD:
        if (fb == 0) return fail(r, line, "modulo by zero");
        if (ints) { json_int_t m = a % b; if (m && ((m < 0) != (b < 0))) m += b; return json_integer(m); }
        { double m = fmod(fa, fb); if (m && ((m < 0) != (fb < 0))) m += fb; return json_real(m); }
    case OP_POW:
        if (ints && b >= 0) { json_int_t p = 1; for (json_int_t i = 0; i < b && i < 64; i++) p *= a; return json_integer(p); }
        return json_real(pow(fa, fb));
    default: return fail(r, line, "bad operator");
    }
}

static json_t *contains(Render *r, int line, json_t *item, json_t *c) {
    if (!c) return json_false();
    if (json_is_string(c)) {
        if (!item || !json_is_string(item)) return fail(r, line, "'in <string>' requires string as left operand");
        return json_boolean(memmem(json_string_value(c), json_string_length(c), json_string_value(item), json_string_length(item)) != NULL);
    }
    if (json_is_array(c)) {
        for (size_t i = 0; i < json_array_size(c); i++)
            if (jv_equal(json_array_get(c, i), item)) return json_true();
        return json_false();
    }
    if (json_is_object(c)) return json_boolean(item && json_is_string(item) && json_object_get(c, json_string_value(item)));
    return fail(r, line, "argument of type '%s' is not iterable", jv_type_name(c));
}

static json_t *eval(Render *r, Node *n) {
    if (r->failed) return NULL;
    switch (n->kind) {
    case N_LIT: return json_incref(n->lit);
    case N_NAME: return lookup(r, n->name);
    case N_ATTR: {
        json_t *o = eval(r, n->a);
        if (r->failed) return NULL;
        if (!o) return fail(r, n->line, "undefined value has no attribute '%s'", n->name);
        json_t *v = NULL;
        if (json_is_object(o)) { v = json_object_get(o, n->name); if (v == r->undef) v = NULL; if (v) json_incref(v); }
        else if (json_is_array(o) && n->name[0] >= '0' && n->name[0] <= '9') {
            json_t *k = json_integer(atoll(n->name));
            v = get_item(r, n->line, o, k);
            json_decref(k);
        }
        json_decref(o);
        return v;
    }
    case N_ITEM: {
        json_t *o = eval(r, n->a), *k = eval(r, n->b);
        json_t *v = r->failed ? NULL : get_item(r, n->line, o, k);
        json_decref(o);
        json_decref(k);
        return v;
    }
    case N_SLICE: {
        json_t *o = eval(r, n->a);
        json_t *v = r->failed ? NULL : do_slice(r, n, o);
        json_decref(o);
        return v;
    }
    case N_CALL: {
        Args a;
        json_t *obj = n->a->kind == N_ATTR ? eval(r, n->a->a) : NULL;
        args_eval(r, n, &a);
        json_t *v = NULL;
        if (!r->failed) {
            if (n->a->kind == N_NAME) v = call_func(r, n, &a);
            else if (!obj) v = fail(r, n->line, "undefined value has no method '%s'", n->a->name);
            else v = call_method(r, n, obj, &a);
        }
        args_free(&a);
        json_decref(obj);
        return v;
    }
    case N_FILTER: {
        json_t *x = eval(r, n->a);
        Args a;
        args_eval(r, n, &a);
        json_t *v = r->failed ? NULL : apply_filter(r, n->line, n->name, x, &a);
        args_free(&a);
        json_decref(x);
        return v;
    }
    case N_TEST: {
        json_t *x = eval(r, n->a);
        Args a;
        args_eval(r, n, &a);
        int t = r->failed ? -1 : apply_test(r, n->line, n->name, x, &a, 0);
        args_free(&a);
        json_decref(x);
        if (t < 0) return NULL;
        return json_boolean(n->negate ? !t : t);
    }
    case N_NEG: case N_POS: {
        json_t *x = eval(r, n->a), *v = NULL;
        if (r->failed) return NULL;
        if (x && json_is_integer(x)) v = json_integer(n->kind == N_NEG ? -json_integer_value(x) : json_integer_value(x));
        else if (x && json_is_real(x)) v = json_real(n->kind == N_NEG ? -json_real_value(x) : json_real_value(x));
        else if (x && json_is_boolean(x)) v = json_integer(n->kind == N_NEG ? -(json_int_t)json_is_true(x) : json_is_true(x));
        else v = fail(r, n->line, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+', jv_type_name(x));
        json_decref(x);
        return v;
    }
    case N_NOT: {
        json_t *x = eval(r, n->a);
        bool t = jv_truthy(x);
        json_decref(x);
        return r->failed ? NULL : json_boolean(!t);
    }
    case N_AND: case N_OR: {
        json_t *x = eval(r, n->a);
        if (r->failed) return NULL;
        if (jv_truthy(x) == (n->kind == N_OR)) return x;
        json_decref(x);
        return eval(r, n->b);
    }
    case N_COND: {
        json_t *c = eval(r, n->a);
        bool t = jv_truthy(c);
        json_decref(c);
        if (r->failed) return NULL;
        return t ? eval(r, n->b) : n->c ? eval(r, n->c) : NULL;
    }
    case N_BIN: {
        json_t *x = eval(r, n->a), *y = eval(r, n->b), *v = NULL;
        if (!r->failed) switch (n->op) {
        case OP_EQ: v = json_boolean(jv_equal(x, y)); break;
        case OP_NE: v = json_boolean(!jv_equal(x, y)); break;
        case OP_LT: case OP_LE: case OP_GT: case OP_GE: {
            int c = jv_cmp(x, y);
            if (c == -2) v = fail(r, n->line, "'<' not supported between '%s' and '%s'", jv_type_name(x), jv_type_name(y));
            else v = json_boolean(n->op == OP_LT ? c < 0 : n->op == OP_LE ? c <= 0 : n->op == OP_GT ? c > 0 : c >= 0);
            break;
        }
        case OP_IN: v = contains(r, n->line, x, y); break;
        case OP_NOTIN: v = contains(r, n->line, x, y); if (v) { json_t *t = json_boolean(!json_is_true(v)); json_decref(v); v = t; } break;
        default: v = arith(r, n->line, n->op, x, y);
        }
        json_decref(x);
        json_decref(y);
        return v;
    }
    case N_LIST: {
        json_t *l = json_array();
        for (int i = 0; i < n->n_kids && !r->failed; i++) {
            json_t *x = eval(r, n->kids[i]);
            json_array_append_new(l, x ? x : json_incref(r->undef));
        }
        return l;
    }
    case N_DICT: {
        json_t *d = json_object();
        for (int i = 0; i + 1 < n->n_kids && !r->failed; i += 2) {
            json_t *k = eval(r, n->kids[i]), *x = eval(r, n->kids[i + 1]);
            if (!r->failed && (!k || !json_is_string(k))) fail(r, n->line, "dict keys must be strings");
            else if (!r->failed) json_object_set(d, json_string_value(k), x ? x : r->undef);
            json_decref(k);
            json_decref(x);
        }
        return d;
    }
    default: return fail(r, n->line, "not an expression");
    }
}

static void set_var(Render *r, const char *name, json_t *v) {
    json_object_set_new(r->frames[r->n_frames - 1], name, v ? v : json_incref(r->undef));
}

static void exec_for(Render *r, Node *n) {
    json_t *it = eval(r, n->a);
    if (r->failed) return;
    json_t *lst = iter_list(r, n->line, it);
    json_decref(it);
    if (!lst) return;
    /* the inline "if" filter decides which items count for loop.length */
    json_t *items = json_array();
    for (size_t i = 0; i < json_array_size(lst) && !r->failed; i++) {
        json_t *x = json_array_get(lst, i);
        if (n->b) {
            if (r->n_frames == 256) { fail(r, n->line, "nesting too deep"); break; }
            r->frames[r->n_frames++] = json_object();
            if (n->n_targets == 1) set_var(r, n->targets[0], json_incref(x));
            else for (int k = 0; k < n->n_targets; k++) set_var(r, n->targets[k], json_is_array(x) ? json_incref(json_array_get(x, (size_t)k)) : NULL);
            json_t *c = eval(r, n->b);
            bool keep = jv_truthy(c);
            json_decref(c);
            json_decref(r->frames[--r->n_frames]);
            if (!keep) continue;
        }
        json_array_append(items, x);
    }
    json_decref(lst);
    size_t len = json_array_size(items);
    for (size_t i = 0; i < len && !r->failed; i++) {
        if (r->n_frames == 256) { fail(r, n->line, "nesting too deep"); break; }
        json_t *frame = json_object();
        r->frames[r->n_frames++] = frame;
        json_t *x = json_array_get(items, i);
        if (n->n_targets == 1) set_var(r, n->targets[0], json_incref(x));
        else {
            if (!json_is_array(x) || json_array_size(x) != (size_t)n->n_targets) fail(r, n->line, "cannot unpack %s into %d names", jv_type_name(x), n->n_targets);
            else for (int k = 0; k < n->n_targets; k++) set_var(r, n->targets[k], json_incref(json_array_get(x, (size_t)k)));
        }
        json_t *loop = json_object();
        json_object_set_new(loop, "index0", json_integer((json_int_t)i));
        json_object_set_new(loop, "index", json_integer((json_int_t)i + 1));
        json_object_set_new(loop, "revindex0", json_integer((json_int_t)(len - i - 1)));
        json_object_set_new(loop, "revindex", json_integer((json_int_t)(len - i)));
        json_object_set_new(loop, "first", json_boolean(i == 0));
        json_object_set_new(loop, "last", json_boolean(i + 1 == len));
        json_object_set_new(loop, "length", json_integer((json_int_t)len));
        json_object_set_new(loop, "depth", json_integer(1));
        json_object_set_new(loop, "depth0", json_integer(0));
        if (i > 0) json_object_set(loop, "previtem", json_array_get(items, i - 1));
        if (i + 1 < len) json_object_set(loop, "nextitem", json_array_get(items, i + 1));
        set_var(r, "loop", loop);
        exec(r, n->bodies[0]);
        json_decref(r->frames[--r->n_frames]);
        if (r->ctl == 1) { r->ctl = 0; break; }
        r->ctl = 0;
    }
    if (len == 0 && n->n_bodies > 1 && !r->failed) exec(r, n->bodies[1]);
    json_decref(items);
}

static void exec(Render *r, Node *n) {
    if (r->failed || r->ctl) return;
    switch (n->kind) {
    case N_BODY:
        for (int i = 0; i < n->n_kids && !r->failed && !r->ctl; i++) exec(r, n->kids[i]);
        return;
    case N_TEXT: sb_put(&r->out, json_string_value(n->lit), json_string_length(n->lit)); return;
    case N_OUT: {
        json_t *v = eval(r, n->a);
        if (!r->failed) jv_str(&r->out, v);
        json_decref(v);
        return;
    }
    case N_IF:
        for (int i = 0; i < n->n_kids; i++) {
            json_t *c = eval(r, n->kids[i]);
            bool t = jv_truthy(c);
            json_decref(c);
            if (r->failed) return;
            if (t) { exec(r, n->bodies[i]); return; }
        }
        if (n->n_bodies > n->n_kids) exec(r, n->bodies[n->n_kids]);
        return;
    case N_FOR: exec_for(r, n); return;
    case N_SET: {
        json_t *v = eval(r, n->a);
        if (!r->failed) set_var(r, n->name, v);
        else json_decref(v);
        return;
    }
    case N_SET_ATTR: {
        json_t *o = lookup(r, n->c->name);
        if (!o || !is_ns(r, o)) { json_decref(o); fail(r, n->line, "cannot assign attribute on non-namespace object"); return; }
        json_t *v = eval(r, n->a);
        if (!r->failed) json_object_set_new(o, n->name, v ? v : json_incref(r->undef));
        else json_decref(v);
        json_decref(o);
        return;
    }
    case N_BREAK: r->ctl = 1; return;
    case N_CONTINUE: r->ctl = 2; return;
    default: fail(r, n->line, "not a statement"); return;
    }
}

int jinja_render(Node *root, json_t *context, char **out, Err *e) {
    Render r = {0};
    r.e = e;
    r.undef = json_object();
    r.frames[r.n_frames++] = context && json_is_object(context) ? json_deep_copy(context) : json_object();
    r.frames[r.n_frames++] = json_object(); /* template-level set */
    exec(&r, root);
    while (r.n_frames) json_decref(r.frames[--r.n_frames]);
    for (int i = 0; i < r.n_ns; i++) json_decref(r.ns[i]); /* held once more by their owners, if any */
    json_decref(r.undef);
    if (r.failed) { free(r.out.s); return -400; }
    *out = r.out.s ? r.out.s : xstrdup("");
    return 0;
}
