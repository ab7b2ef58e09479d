/*
 * jinja_builtins.c - what chat templates call: str/dict/list methods,
 * global functions (raise_exception, namespace, range, strftime_now, dict),
 * filters and tests, each with the semantics of Python and Jinja 3.1 as
 * transformers configures it. Not here: operators and statements
 * (jinja_eval.c).
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <utf8proc.h>

#include "jinja.h"

/* ---- string methods ---- */
static bool in_chars(const char *chars, size_t nc, int32_t cp) {
    for (size_t i = 0; i < nc;)
        if (jnext_cp(chars, nc, &i) == cp) return true;
    return false;
}

/* which: 1 left, 2 right, 3 both; chars NULL = whitespace */
static json_t *jstr_strip(json_t *s, json_t *chars, int which) {
    const char *p = json_string_value(s), *cs = chars && json_is_string(chars) ? json_string_value(chars) : NULL;
    size_t n = json_string_length(s), nc = cs ? json_string_length(chars) : 0, a = 0, b = n;
    if (which & 1)
        while (a < b) {
            size_t j = a;
            int32_t cp = jnext_cp(p, n, &j);
            if (cs ? !in_chars(cs, nc, cp) : !jpy_space(cp)) break;
            a = j;
        }
    if (which & 2)
        while (b > a) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)p[j] & 0xC0) == 0x80) j--;
            size_t k = j;
            int32_t cp = jnext_cp(p, n, &k);
            if (cs ? !in_chars(cs, nc, cp) : !jpy_space(cp)) break;
            b = j;
        }
    return jstr_new(p + a, b - a);
}

static json_t *str_split(Render *r, int line, json_t *s, json_t *sep, json_int_t maxsplit, bool from_right) {
    const char *p = json_string_value(s);
    size_t n = json_string_length(s);
    json_t *out = json_array();
    if (!sep || json_is_null(sep)) {
        /* runs of whitespace, no empty strings */
        size_t i = 0;
        json_int_t splits = 0;
        if (from_right && maxsplit >= 0) { json_decref(out); return jfail(r, line, "rsplit with maxsplit on whitespace is not supported"); }
        while (i < n) {
            size_t j = i;
            while (j < n) { size_t k = j; if (!jpy_space(jnext_cp(p, n, &k))) break; j = k; }
            i = j;
            if (i >= n) break;
            if (maxsplit >= 0 && splits == maxsplit) {
                size_t e = n;
                while (e > i) { size_t k = e - 1; while (k > i && ((unsigned char)p[k] & 0xC0) == 0x80) k--; size_t q = k; if (!jpy_space(jnext_cp(p, n, &q))) break; e = k; }
                json_array_append_new(out, jstr_new(p + i, e - i));
                break;
            }
            while (j < n) { size_t k = j; if (jpy_space(jnext_cp(p, n, &k))) break; j = k; }
            json_array_append_new(out, jstr_new(p + i, j - i));
            splits++;
            i = j;
        }
        return out;
    }
    if (!json_is_string(sep)) { json_decref(out); return jfail(r, line, "split separator must be a string"); }
    const char *q = json_string_value(sep);
    size_t m = json_string_length(sep);
    if (!m) { json_decref(out); return jfail(r, line, "empty separator"); }
    if (!from_right) {
        size_t i = 0;
        json_int_t splits = 0;
        for (;;) {
            const char *hit = maxsplit >= 0 && splits >= maxsplit ? NULL : memmem(p + i, n - i, q, m);
            if (!hit) { json_array_append_new(out, jstr_new(p + i, n - i)); break; }
            json_array_append_new(out, jstr_new(p + i, (size_t)(hit - p) - i));
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
            if (!hit) { json_array_insert_new(out, 0, jstr_new(p, e)); break; }
            json_array_insert_new(out, 0, jstr_new(hit + m, e - (size_t)(hit - p) - m));
            e = (size_t)(hit - p);
            splits++;
        }
    }
    return out;
}

json_t *jstr_case(json_t *s, int mode) { /* 0 lower 1 upper 2 title 3 capitalize */
    const char *p = json_string_value(s);
    size_t n = json_string_length(s), i = 0;
    StrBuf b = {0};
    bool prev_cased = false, first = true;
    while (i < n) {
        int32_t cp = jnext_cp(p, n, &i);
        int32_t o = cp;
        if (mode == 0) o = utf8proc_tolower(cp);
        else if (mode == 1) o = utf8proc_toupper(cp);
        else if (mode == 2) o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        else o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
        utf8proc_category_t c = utf8proc_category(cp);
        prev_cased = c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
        first = false;
        jput_cp(&b, o);
    }
    if (!b.s) return jstr_new("", 0);
    return jsb_take(&b);
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
            jnext_cp(p, n, &j);
            sb_put(&b, p + k, j - k);
            k = j;
        }
        if (k < n) sb_put(&b, p + k, n - k);
        return jsb_take(&b);
    }
    while (i <= n) {
        const char *hit = count >= 0 && done >= count ? NULL : memmem(p + i, n - i, q, m);
        if (!hit) { sb_put(&b, p + i, n - i); break; }
        sb_put(&b, p + i, (size_t)(hit - p) - i);
        sb_put(&b, w, wl);
        i = (size_t)(hit - p) + m;
        done++;
    }
    if (!b.s) return jstr_new("", 0);
    return jsb_take(&b);
}

static bool str_affix(json_t *s, json_t *x, bool end) {
    size_t n = json_string_length(s), m = json_string_length(x);
    return m <= n && !memcmp(json_string_value(s) + (end ? n - m : 0), json_string_value(x), m);
}

/* ---- calls ---- */

void jargs_eval(Render *r, Node *n, Args *a) {
    memset(a, 0, sizeof *a);
    for (int i = 0; i < n->n_kids && i < 8; i++) a->pos[a->n++] = jeval(r, n->kids[i]);
    for (int i = 0; i < n->n_kw && i < 8; i++) { a->kw[a->nkw] = n->kw[i]; a->kwv[a->nkw++] = jeval(r, n->kwv[i]); }
    if (n->n_kids > 8 || n->n_kw > 8) jfail(r, n->line, "too many arguments");
}
void jargs_free(Args *a) {
    for (int i = 0; i < a->n; i++) json_decref(a->pos[i]);
    for (int i = 0; i < a->nkw; i++) json_decref(a->kwv[i]);
}
/* positional i or keyword name; borrowed; *found tells whether given */
json_t *jargs_get(Args *a, int i, const char *name, bool *found) {
    if (i >= 0 && i < a->n) { if (found) *found = true; return a->pos[i]; }
    for (int k = 0; k < a->nkw; k++)
        if (name && !strcmp(a->kw[k], name)) { if (found) *found = true; return a->kwv[k]; }
    if (found) *found = false;
    return NULL;
}


json_t *jcall_method(Render *r, Node *n, json_t *obj, Args *a) {
    const char *m = n->a->name;
    int line = n->line;
    if (obj && json_is_string(obj)) {
        json_t *x = jargs_get(a, 0, NULL, NULL);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            bool end = m[0] == 'e';
            if (x && json_is_string(x)) return json_boolean(str_affix(obj, x, end));
            if (x && json_is_array(x)) {
                for (size_t i = 0; i < json_array_size(x); i++)
                    if (json_is_string(json_array_get(x, i)) && str_affix(obj, json_array_get(x, i), end)) return json_true();
                return json_false();
            }
            return jfail(r, line, "%s needs a string argument", m);
        }
        if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
            json_t *sep = jargs_get(a, 0, "sep", NULL), *mx = jargs_get(a, 1, "maxsplit", NULL);
            return str_split(r, line, obj, sep, mx && json_is_integer(mx) ? json_integer_value(mx) : -1, m[0] == 'r');
        }
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            if (x && !json_is_string(x) && !json_is_null(x)) return jfail(r, line, "%s arg must be None or str", m);
            return jstr_strip(obj, x, m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3);
        }
        if (!strcmp(m, "lower")) return jstr_case(obj, 0);
        if (!strcmp(m, "upper")) return jstr_case(obj, 1);
        if (!strcmp(m, "title")) return jstr_case(obj, 2);
        if (!strcmp(m, "capitalize")) return jstr_case(obj, 3);
        if (!strcmp(m, "replace")) {
            json_t *o = jargs_get(a, 0, NULL, NULL), *w = jargs_get(a, 1, NULL, NULL), *c = jargs_get(a, 2, "count", NULL);
            if (!o || !w || !json_is_string(o) || !json_is_string(w)) return jfail(r, line, "replace needs two strings");
            if (jtoo_big(r, line, (json_string_length(obj) + 1) * (json_string_length(w) + 1), JINJA_MAX_BYTES)) return NULL;
            return str_replace(obj, o, w, c && json_is_integer(c) ? json_integer_value(c) : -1);
        }
        if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "count") || !strcmp(m, "index")) {
            if (!x || !json_is_string(x)) return jfail(r, line, "%s needs a string", m);
            const char *p = json_string_value(obj), *q = json_string_value(x);
            size_t np = json_string_length(obj), nq = json_string_length(x);
            json_int_t found = -1, cnt = 0;
            for (size_t i = 0; i + nq <= np; i++)
                if (!memcmp(p + i, q, nq)) {
                    if (found < 0 || m[0] == 'r') found = (json_int_t)jn_chars(p, i);
                    cnt++;
                    if (nq) i += nq - 1;
                    if (m[0] == 'f' || m[0] == 'i') break;
                }
            if (m[0] == 'c') return json_integer(cnt);
            if (m[0] == 'i' && found < 0) return jfail(r, line, "substring not found");
            return json_integer(found);
        }
        if (!strcmp(m, "splitlines")) {
            json_t *out = json_array();
            const char *p = json_string_value(obj);
            size_t np = json_string_length(obj), i = 0, s = 0;
            while (i < np) {
                size_t j = i;
                int32_t cp = jnext_cp(p, np, &j);
                if (cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
                    cp == 0x85 || cp == 0x2028 || cp == 0x2029) {
                    json_array_append_new(out, jstr_new(p + s, i - s));
                    if (cp == '\r' && j < np && p[j] == '\n') j++;
                    s = j;
                }
                i = j;
            }
            if (s < np) json_array_append_new(out, jstr_new(p + s, np - s));
            return out;
        }
        if (!strncmp(m, "is", 2)) {
            const char *p = json_string_value(obj);
            size_t np = json_string_length(obj), i = 0;
            bool ok = np > 0, cased = false;
            while (i < np && ok) {
                int32_t cp = jnext_cp(p, np, &i);
                utf8proc_category_t c = utf8proc_category(cp);
                bool letter = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
                bool digit = c == UTF8PROC_CATEGORY_ND;
                if (!strcmp(m, "isdigit")) ok = digit;
                else if (!strcmp(m, "isspace")) ok = jpy_space(cp);
                else if (!strcmp(m, "isalpha")) ok = letter;
                else if (!strcmp(m, "isalnum")) ok = letter || digit || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
                else if (!strcmp(m, "islower")) { ok = c != UTF8PROC_CATEGORY_LU && c != UTF8PROC_CATEGORY_LT; cased |= c == UTF8PROC_CATEGORY_LL; }
                else if (!strcmp(m, "isupper")) { ok = c != UTF8PROC_CATEGORY_LL && c != UTF8PROC_CATEGORY_LT; cased |= c == UTF8PROC_CATEGORY_LU; }
            }
            if (!strcmp(m, "islower") || !strcmp(m, "isupper")) ok = ok && cased;
            return json_boolean(ok);
        }
        if (!strcmp(m, "join")) {
            if (!x || !json_is_array(x)) return jfail(r, line, "join needs a list");
            StrBuf b = {0};
            for (size_t i = 0; i < json_array_size(x); i++) {
                json_t *it = json_array_get(x, i);
                if (!json_is_string(it)) { free(b.s); return jfail(r, line, "join: sequence item %zu: expected str", i); }
                if (i) sb_put(&b, json_string_value(obj), json_string_length(obj));
                sb_put(&b, json_string_value(it), json_string_length(it));
                if (jtoo_big(r, line, b.n, JINJA_MAX_BYTES)) { free(b.s); return NULL; }
            }
            return b.s ? jsb_take(&b) : jstr_new("", 0);
        }
    } else if (obj && json_is_object(obj) && !jis_ns(r, obj)) {
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
            json_t *k = jargs_get(a, 0, NULL, NULL), *d = jargs_get(a, 1, "default", NULL);
            json_t *v = k && json_is_string(k) ? json_object_get(obj, json_string_value(k)) : NULL;
            if (v) return json_incref(v);
            return d ? json_incref(d) : json_null();
        }
    } else if (obj && json_is_array(obj)) {
        json_t *x = jargs_get(a, 0, NULL, NULL);
        if (!strcmp(m, "count") || !strcmp(m, "index")) {
            json_int_t c = 0;
            for (size_t i = 0; i < json_array_size(obj); i++)
                if (jv_equal(json_array_get(obj, i), x)) {
                    if (m[0] == 'i') return json_integer((json_int_t)i);
                    c++;
                }
            if (m[0] == 'i') return jfail(r, line, "value is not in list");
            return json_integer(c);
        }
    }
    return jfail(r, line, "'%s' object has no method '%s'", jv_type_name(obj), m);
}

json_t *jcall_func(Render *r, Node *n, Args *a) {
    const char *f = n->a->name;
    int line = n->line;
    if (!strcmp(f, "raise_exception")) {
        StrBuf b = {0};
        jv_str(&b, jargs_get(a, 0, "message", NULL));
        jfail(r, line, "raise_exception: %s", b.s ? b.s : "");
        free(b.s);
        return NULL;
    }
    if (!strcmp(f, "namespace") || !strcmp(f, "dict")) {
        json_t *o = json_object();
        json_t *init = jargs_get(a, 0, NULL, NULL);
        if (init && json_is_object(init)) json_object_update(o, init);
        for (int i = 0; i < a->nkw; i++) json_object_set(o, a->kw[i], a->kwv[i] ? a->kwv[i] : r->undef);
        if (f[0] == 'n') {
            if (r->n_ns == 64) { json_decref(o); return jfail(r, line, "too many namespaces"); }
            r->ns[r->n_ns++] = json_incref(o);
        }
        return o;
    }
    if (!strcmp(f, "range")) {
        json_int_t lo = 0, hi, st = 1;
        for (int i = 0; i < a->n; i++)
            if (!a->pos[i] || !json_is_integer(a->pos[i])) return jfail(r, line, "range needs integers");
        if (a->n == 1) hi = json_integer_value(a->pos[0]);
        else if (a->n >= 2) { lo = json_integer_value(a->pos[0]); hi = json_integer_value(a->pos[1]); if (a->n == 3) st = json_integer_value(a->pos[2]); }
        else return jfail(r, line, "range needs arguments");
        if (st == 0) return jfail(r, line, "range step is zero");
        if ((st > 0 && hi > lo && ((double)hi - (double)lo) / (double)st > JINJA_MAX_ITEMS) ||
            (st < 0 && hi < lo && ((double)lo - (double)hi) / (double)-st > JINJA_MAX_ITEMS))
            return jfail(r, line, "range too large");
        json_t *out = json_array();
        for (json_int_t i = lo; st > 0 ? i < hi : i > hi;) {
            json_array_append_new(out, json_integer(i));
            if (__builtin_add_overflow(i, st, &i)) break;
        }
        return out;
    }
    if (!strcmp(f, "strftime_now")) {
        json_t *fmt = jargs_get(a, 0, NULL, NULL);
        if (!fmt || !json_is_string(fmt)) return jfail(r, line, "strftime_now needs a format string");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        /* The format is the template's (HF's strftime_now passes it to Python's
         * strftime the same way); strftime writes at most sizeof buf bytes. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        size_t k = strftime(buf, sizeof buf, json_string_value(fmt), &tm);
#pragma GCC diagnostic pop
        return jstr_new(buf, k);
    }
    return jfail(r, line, "unknown function %s", f);
}

/* ---- filters ---- */
json_t *jiter_list(Render *r, int line, json_t *v) {
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
        while (i < n) { size_t s = i; jnext_cp(p, n, &i); json_array_append_new(out, jstr_new(p + s, i - s)); }
    } else { json_decref(out); return jfail(r, line, "'%s' object is not iterable", jv_type_name(v)); }
    return out;
}

static int cmp_sort(json_t *a, json_t *b, bool ci) {
    if (ci && json_is_string(a) && json_is_string(b)) {
        json_t *x = jstr_case(a, 0), *y = jstr_case(b, 0);
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

json_t *japply_filter(Render *r, int line, const char *f, json_t *v, Args *a) {
    if (!strcmp(f, "safe")) return v ? json_incref(v) : NULL;
    if (!strcmp(f, "tojson")) {
        json_t *ind = jargs_get(a, 0, "indent", NULL), *asc = jargs_get(a, -1, "ensure_ascii", NULL),
               *sep = jargs_get(a, -1, "separators", NULL), *sk = jargs_get(a, -1, "sort_keys", NULL);
        int indent = ind && json_is_integer(ind) ? (int)json_integer_value(ind) : -1;
        const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
        if (sep && json_is_array(sep) && json_array_size(sep) == 2) {
            isep = json_string_value(json_array_get(sep, 0));
            ksep = json_string_value(json_array_get(sep, 1));
            if (!isep || !ksep) return jfail(r, line, "tojson separators must be strings");
        }
        StrBuf b = {0};
        if (jv_json(&b, v, jv_truthy(asc), indent, isep, ksep, jv_truthy(sk), 0)) {
            free(b.s);
            return jfail(r, line, "Object of type %s is not JSON serializable", jv_type_name(v));
        }
        return jsb_take(&b);
    }
    if (!strcmp(f, "trim")) {
        json_t *s = jto_str(v), *out = jstr_strip(s, jargs_get(a, 0, "chars", NULL), 3);
        json_decref(s);
        return out;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (!v) return json_integer(0);
        if (json_is_string(v)) return json_integer((json_int_t)jn_chars(json_string_value(v), json_string_length(v)));
        if (json_is_array(v)) return json_integer((json_int_t)json_array_size(v));
        if (json_is_object(v)) return json_integer((json_int_t)json_object_size(v));
        return jfail(r, line, "object of type '%s' has no len()", jv_type_name(v));
    }
    if (!strcmp(f, "string")) return jto_str(v);
    if (!strcmp(f, "lower") || !strcmp(f, "upper") || !strcmp(f, "capitalize") || !strcmp(f, "title")) {
        json_t *s = jto_str(v), *out = jstr_case(s, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3);
        json_decref(s);
        return out;
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        json_t *d = jargs_get(a, 0, "default_value", NULL), *bo = jargs_get(a, 1, "boolean", NULL);
        if (!v || (jv_truthy(bo) && !jv_truthy(v))) return d ? json_incref(d) : jstr_new("", 0);
        return json_incref(v);
    }
    if (!strcmp(f, "e") || !strcmp(f, "escape")) {
        json_t *s = jto_str(v);
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
        return b.s ? jsb_take(&b) : jstr_new("", 0);
    }
    if (!strcmp(f, "abs")) {
        if (v && json_is_integer(v) && json_integer_value(v) == INT64_MIN) return jfail(r, line, "integer overflow");
        if (v && json_is_integer(v)) return json_integer(llabs(json_integer_value(v)));
        if (v && json_is_real(v)) return json_real(fabs(json_real_value(v)));
        return jfail(r, line, "bad operand type for abs()");
    }
    if (!strcmp(f, "int") || !strcmp(f, "float") || !strcmp(f, "round")) {
        double d = 0;
        bool ok = true;
        if (v && json_is_number(v)) d = json_number_value(v);
        else if (v && json_is_boolean(v)) d = json_is_true(v);
        else if (v && json_is_string(v)) { char *end; d = strtod(json_string_value(v), &end); ok = end != json_string_value(v) && !*end; }
        else ok = false;
        if (!strcmp(f, "round")) {
            json_t *pr = jargs_get(a, 0, "precision", NULL), *me = jargs_get(a, 1, "method", NULL);
            double sc = pow(10, pr && json_is_integer(pr) ? (double)json_integer_value(pr) : 0);
            const char *mm = me && json_is_string(me) ? json_string_value(me) : "common";
            double x = d * sc;
            x = !strcmp(mm, "floor") ? floor(x) : !strcmp(mm, "ceil") ? ceil(x) : (x < 0 ? -floor(-x + 0.5) : floor(x + 0.5));
            return json_real(x / sc);
        }
        json_t *dflt = jargs_get(a, 0, "default", NULL);
        if (f[0] == 'i' && v && json_is_integer(v)) return json_incref(v);
        if (f[0] == 'i' && !(d > -9.2e18 && d < 9.2e18)) ok = false;
        if (!ok) return dflt ? json_incref(dflt) : f[0] == 'i' ? json_integer(0) : json_real(0);
        if (f[0] == 'i') return json_integer((json_int_t)d);
        return json_real(d);
    }
    if (!strcmp(f, "replace")) {
        json_t *s = jto_str(v), *o = jargs_get(a, 0, "old", NULL), *w = jargs_get(a, 1, "new", NULL), *c = jargs_get(a, 2, "count", NULL);
        if (!o || !w || !json_is_string(o) || !json_is_string(w)) { json_decref(s); return jfail(r, line, "replace needs strings"); }
        if (jtoo_big(r, line, (json_string_length(s) + 1) * (json_string_length(w) + 1), JINJA_MAX_BYTES)) { json_decref(s); return NULL; }
        json_t *out = str_replace(s, o, w, c && json_is_integer(c) ? json_integer_value(c) : -1);
        json_decref(s);
        return out;
    }
    if (!strcmp(f, "items")) {
        if (!v) return json_array();
        if (!json_is_object(v)) return jfail(r, line, "items filter needs a mapping");
        json_t *out = json_array(), *x;
        const char *k;
        json_object_foreach(v, k, x) json_array_append_new(out, json_pack("[sO]", k, x));
        return out;
    }
    json_t *lst = jiter_list(r, line, v);
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
            out = b.s ? jsb_take(&b) : jstr_new("", 0);
        } else {
            out = json_array();
            for (size_t i = n; i-- > 0;) json_array_append(out, json_array_get(lst, i));
        }
    } else if (!strcmp(f, "join")) {
        json_t *d = jargs_get(a, 0, "d", NULL), *at = jargs_get(a, 1, "attribute", NULL);
        StrBuf b = {0};
        for (size_t i = 0; i < n; i++) {
            if (i && d) jv_str(&b, d);
            json_t *it = json_array_get(lst, i);
            jv_str(&b, at && json_is_string(at) ? attr_of(it, json_string_value(at)) : it);
            if (jtoo_big(r, line, b.n, JINJA_MAX_BYTES)) break;
        }
        out = b.s ? jsb_take(&b) : jstr_new("", 0);
    } else if (!strcmp(f, "map")) {
        json_t *at = jargs_get(a, -1, "attribute", NULL), *fn = jargs_get(a, 0, NULL, NULL);
        out = json_array();
        for (size_t i = 0; i < n && !r->failed; i++) {
            json_t *it = json_array_get(lst, i);
            if (at && json_is_string(at)) {
                json_t *x = attr_of(it, json_string_value(at));
                if (!x) x = jargs_get(a, -1, "default", NULL);
                json_array_append(out, x ? x : json_null());
            } else if (fn && json_is_string(fn)) {
                Args sub = {0};
                for (int k = 1; k < a->n; k++) sub.pos[sub.n++] = a->pos[k];
                json_t *x = japply_filter(r, line, json_string_value(fn), it, &sub);
                json_array_append_new(out, x ? x : json_null());
            } else { jfail(r, line, "map needs attribute= or a filter name"); }
        }
    } else if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
        bool attr = strstr(f, "attr") != NULL, keep = f[0] == 's';
        json_t *an = attr ? jargs_get(a, 0, NULL, NULL) : NULL, *tn = jargs_get(a, attr ? 1 : 0, NULL, NULL);
        out = json_array();
        for (size_t i = 0; i < n && !r->failed; i++) {
            json_t *it = json_array_get(lst, i), *x = attr ? attr_of(it, an && json_is_string(an) ? json_string_value(an) : "") : it;
            int t = tn && json_is_string(tn) ? japply_test(r, line, json_string_value(tn), x, a, attr ? 2 : 1) : jv_truthy(x);
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
        bool rev = f[0] == 's' && jv_truthy(jargs_get(a, 0, "reverse", NULL));
        json_t *cs = jargs_get(a, f[0] == 's' ? 1 : 0, "case_sensitive", NULL), *at = jargs_get(a, f[0] == 's' ? 2 : 1, "attribute", NULL);
        bool ci = !jv_truthy(cs);
        json_t **items = xmalloc((n + 1) * sizeof *items);
        for (size_t i = 0; i < n; i++) items[i] = json_array_get(lst, i);
        /* stable insertion sort: template lists are short */
        for (size_t i = 1; i < n && !r->failed; i++)
            for (size_t j = i; j > 0; j--) {
                json_t *x = at && json_is_string(at) ? attr_of(items[j - 1], json_string_value(at)) : items[j - 1];
                json_t *y = at && json_is_string(at) ? attr_of(items[j], json_string_value(at)) : items[j];
                int c = cmp_sort(x, y, ci);
                if (c == -2) { jfail(r, line, "unorderable values in %s", f); break; }
                if (rev ? c >= 0 : c <= 0) break;
                json_t *t = items[j]; items[j] = items[j - 1]; items[j - 1] = t;
            }
        if (f[0] == 's') { out = json_array(); for (size_t i = 0; i < n; i++) json_array_append(out, items[i]); }
        else out = n ? json_incref(items[f[1] == 'a' ? n - 1 : 0]) : NULL;
        free(items);
    } else if (!strcmp(f, "sum")) {
        json_t *at = jargs_get(a, 0, "attribute", NULL), *st = jargs_get(a, 1, "start", NULL);
        double fs = st && json_is_number(st) ? json_number_value(st) : 0;
        json_int_t is = st && json_is_integer(st) ? json_integer_value(st) : 0;
        bool real = st && json_is_real(st);
        for (size_t i = 0; i < n; i++) {
            json_t *x = at && json_is_string(at) ? attr_of(json_array_get(lst, i), json_string_value(at)) : json_array_get(lst, i);
            if (!x || !(json_is_number(x) || json_is_boolean(x))) { jfail(r, line, "sum of non-numbers"); break; }
            if (json_is_real(x)) real = true;
            fs += json_is_boolean(x) ? json_is_true(x) : json_number_value(x);
            if (__builtin_add_overflow(is, json_is_integer(x) ? json_integer_value(x) : (json_int_t)json_is_true(x), &is)) {
                jfail(r, line, "integer overflow");
                break;
            }
        }
        out = real ? json_real(fs) : json_integer(is);
    } else if (!strcmp(f, "indent")) {
        json_t *w = jargs_get(a, 0, "width", NULL), *first = jargs_get(a, 1, "first", NULL), *blank = jargs_get(a, 2, "blank", NULL);
        StrBuf pad = {0}, b = {0};
        if (w && json_is_string(w)) jv_str(&pad, w);
        else {
            json_int_t width = w && json_is_integer(w) ? json_integer_value(w) : 4;
            if (width > 0 && jtoo_big(r, line, (size_t)width, 4096)) { json_decref(lst); return NULL; }
            for (json_int_t i = 0; i < width; i++) sb_putc(&pad, ' ');
        }
        json_t *s = jto_str(v);
        const char *p = json_string_value(s);
        size_t np = json_string_length(s), i = 0;
        bool line_start = jv_truthy(first);
        while (i < np) {
            const char *nl = memchr(p + i, '\n', np - i);
            size_t e = nl ? (size_t)(nl - p) : np;
            if (line_start && (e > i || jv_truthy(blank)) && pad.s) sb_put(&b, pad.s, pad.n);
            sb_put(&b, p + i, e - i);
            if (nl) sb_putc(&b, '\n');
            if (jtoo_big(r, line, b.n, JINJA_MAX_BYTES)) break;
            i = e + (nl ? 1 : 0);
            line_start = true;
        }
        json_decref(s);
        free(pad.s);
        out = b.s ? jsb_take(&b) : jstr_new("", 0);
    } else jfail(r, line, "unsupported filter '%s'", f);
    json_decref(lst);
    return out;
}

/* ---- tests: 1 true, 0 false, -1 error ---- */
int japply_test(Render *r, int line, const char *t, json_t *v, Args *a, int first_arg) {
    json_t *x = jargs_get(a, first_arg, NULL, NULL);
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
        json_t *c = jstr_case(v, t[0] == 'u'), *s = v;
        int eq = jv_equal(c, s);
        json_decref(c);
        return eq;
    }
    if (!strcmp(t, "in")) {
        if (!x) return 0;
        if (json_is_string(x)) return v && json_is_string(v) && memmem(json_string_value(x), json_string_length(x), json_string_value(v), json_string_length(v)) != NULL;
        if (json_is_array(x)) { for (size_t i = 0; i < json_array_size(x); i++) if (jv_equal(json_array_get(x, i), v)) return 1; return 0; }
        if (json_is_object(x)) return v && json_is_string(v) && json_object_get(x, json_string_value(v)) != NULL;
        jfail(r, line, "'in' test on %s", jv_type_name(x));
        return -1;
    }
    if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (!v || !json_is_integer(v)) { jfail(r, line, "%s test needs an integer", t); return -1; }
        json_int_t i = json_integer_value(v);
        if (t[0] == 'o') return (i % 2 + 2) % 2 == 1;
        if (t[0] == 'e') return i % 2 == 0;
        if (!x || !json_is_integer(x) || !json_integer_value(x)) { jfail(r, line, "divisibleby needs a non-zero integer"); return -1; }
        return json_integer_value(x) == -1 || i % json_integer_value(x) == 0;
    }
    int c = jv_cmp(v, x);
    if (c == -2) { jfail(r, line, "cannot compare %s and %s", jv_type_name(v), jv_type_name(x)); return -1; }
    if (!strcmp(t, "gt") || !strcmp(t, ">")) return c > 0;
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) return c >= 0;
    if (!strcmp(t, "lt") || !strcmp(t, "<")) return c < 0;
    if (!strcmp(t, "le") || !strcmp(t, "<=")) return c <= 0;
    jfail(r, line, "unsupported test '%s'", t);
    return -1;
}

