/*
 * jinja_eval.c - render a parsed chat template: scopes (a fresh one per
 * loop iteration, as Jinja has), the loop object, attribute/item/slice
 * access, operators and statements, with Python's semantics. Values are json_t (NULL = Undefined); every eval
 * returns a new reference. Not here: parsing (jinja_parse.c), methods,
 * filters and tests (jinja_builtins.c).
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <utf8proc.h>

#include "jinja.h"

json_t *jfail(Render *r, int line, const char *fmt, ...) {
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

/* ---- UTF-8 code points ---- */
size_t jn_chars(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}
int32_t jnext_cp(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { (*i)++; return 0xFFFD; }
    *i += (size_t)k;
    return cp;
}
bool jpy_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
void jput_cp(StrBuf *b, int32_t cp) {
    utf8proc_uint8_t buf[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, buf);
    sb_put(b, (char *)buf, (size_t)k);
}
/* Byte offsets of code points (jn_chars + 1 entries). */
size_t *jcp_offsets(const char *s, size_t n, size_t *count) {
    size_t c = jn_chars(s, n), k = 0;
    size_t *o = xmalloc((c + 1) * sizeof *o);
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) o[k++] = i;
    o[k] = n;
    *count = c;
    return o;
}

bool jtoo_big(Render *r, int line, size_t n, size_t limit) {
    if (n <= limit) return false;
    jfail(r, line, "value too large (%zu > %zu)", n, limit);
    return true;
}

bool jmake(Render *r, int line, size_t n, size_t limit) {
    if (jtoo_big(r, line, n, limit)) return true;
    r->made += (uint64_t)n * (limit == JINJA_MAX_ITEMS ? JINJA_ITEM_UNITS : 1);
    if (r->made <= JINJA_MAX_WORK) return false;
    jfail(r, line, "the template builds too much (over %llu units of values)", (unsigned long long)JINJA_MAX_WORK);
    return true;
}

bool jis_ns(Render *r, json_t *v) {
    for (int i = 0; i < r->n_ns; i++)
        if (r->ns[i] == v) return true;
    return false;
}


static void exec(Render *r, Node *n);

json_t *jstr_new(const char *s, size_t n) { return json_stringn_nocheck(s, n); }
json_t *jsb_take(StrBuf *b) { json_t *v = jstr_new(b->s ? b->s : "", b->n); free(b->s); return v; }
json_t *jto_str(json_t *v) {
    if (v && json_is_string(v)) return json_incref(v);
    StrBuf b = {0};
    jv_str(&b, v);
    return jsb_take(&b);
}

/* ---- variables ---- */
static json_t *lookup(Render *r, const char *name) {
    for (int i = r->n_frames - 1; i >= 0; i--) {
        json_t *v = json_object_get(r->frames[i], name);
        if (v) return v == r->undef ? NULL : json_incref(v);
    }
    return NULL;
}

/* ---- indexing ---- */
static json_t *get_item(Render *r, int line, json_t *obj, json_t *key) {
    if (!obj) return jfail(r, line, "cannot index an undefined value");
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
        size_t *o = jcp_offsets(json_string_value(obj), json_string_length(obj), &cnt);
        if (i < 0) i += (json_int_t)cnt;
        json_t *v = i < 0 || i >= (json_int_t)cnt ? NULL : jstr_new(json_string_value(obj) + o[i], o[i + 1] - o[i]);
        free(o);
        return v;
    }
    return NULL;
}

static bool slice_arg(Render *r, int line, json_t *v, json_int_t *out) {
    if (!v || json_is_null(v)) return false;
    if (!json_is_integer(v)) { jfail(r, line, "slice indices must be integers"); return false; }
    *out = json_integer_value(v);
    return true;
}

static json_t *do_slice(Render *r, Node *n, json_t *obj) {
    json_t *a = n->b ? jeval(r, n->b) : NULL, *b = n->kids[0] ? jeval(r, n->kids[0]) : NULL,
           *c = n->kids[1] ? jeval(r, n->kids[1]) : NULL;
    json_int_t lo = 0, hi = 0, st = 1;
    bool has_lo = slice_arg(r, n->line, a, &lo), has_hi = slice_arg(r, n->line, b, &hi);
    slice_arg(r, n->line, c, &st);
    json_decref(a); json_decref(b); json_decref(c);
    if (r->failed) return NULL;
    if (st == 0) return jfail(r, n->line, "slice step cannot be zero");
    bool is_str = obj && json_is_string(obj);
    if (!obj || !(is_str || json_is_array(obj))) return jfail(r, n->line, "cannot slice %s", jv_type_name(obj));
    size_t cnt, *o = NULL;
    if (is_str) o = jcp_offsets(json_string_value(obj), json_string_length(obj), &cnt);
    else cnt = json_array_size(obj);
    json_int_t len = (json_int_t)cnt;
    /* Python's slice.indices (inputs clamped first so nothing overflows) */
    if (lo < -len - 1) lo = -len - 1;
    if (lo > len) lo = len;
    if (hi < -len - 1) hi = -len - 1;
    if (hi > len) hi = len;
    if (st < -len - 1) st = -len - 1;
    if (st > len + 1) st = len + 1;
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
    return is_str ? jsb_take(&b2) : arr;
}

/* ---- operators ---- */
static json_t *arith(Render *r, int line, BinOp op, json_t *x, json_t *y) {
    if (op == OP_CONCAT) {
        StrBuf b = {0};
        jv_str(&b, x);
        jv_str(&b, y);
        if (jmake(r, line, b.n, JINJA_MAX_BYTES)) { free(b.s); return NULL; }
        return b.s ? jsb_take(&b) : jstr_new("", 0);
    }
    if (!x || !y) return jfail(r, line, "undefined value in an expression");
    bool nx = json_is_number(x) || json_is_boolean(x), ny = json_is_number(y) || json_is_boolean(y);
    if (op == OP_ADD && json_is_string(x) && json_is_string(y)) {
        if (jmake(r, line, json_string_length(x) + json_string_length(y), JINJA_MAX_BYTES)) return NULL;
        StrBuf b = {0};
        sb_put(&b, json_string_value(x), json_string_length(x));
        sb_put(&b, json_string_value(y), json_string_length(y));
        return b.s ? jsb_take(&b) : jstr_new("", 0);
    }
    if (op == OP_ADD && json_is_array(x) && json_is_array(y)) {
        if (jmake(r, line, json_array_size(x) + json_array_size(y), JINJA_MAX_ITEMS)) return NULL;
        json_t *o = json_copy(x);
        json_array_extend(o, y);
        return o;
    }
    if (op == OP_MUL && json_is_integer(x) && (json_is_string(y) || json_is_array(y))) { json_t *t = x; x = y; y = t; }
    if (op == OP_MUL && (json_is_string(x) || json_is_array(x)) && json_is_integer(y)) {
        json_int_t k = json_integer_value(y);
        size_t unit = json_is_string(x) ? json_string_length(x) : json_array_size(x), total;
        if (k > 0 && (__builtin_mul_overflow(unit, (size_t)k, &total) ||
                      jmake(r, line, total, json_is_string(x) ? JINJA_MAX_BYTES : JINJA_MAX_ITEMS))) {
            if (!r->failed) jfail(r, line, "repetition too large");
            return NULL;
        }
        if (unit == 0 || k <= 0) return json_is_string(x) ? jstr_new("", 0) : json_array(); /* no k-step loop */
        if (json_is_string(x)) {
            StrBuf b = {0};
            for (json_int_t i = 0; i < k; i++) sb_put(&b, json_string_value(x), json_string_length(x));
            return b.s ? jsb_take(&b) : jstr_new("", 0);
        }
        json_t *o = json_array();
        for (json_int_t i = 0; i < k; i++) json_array_extend(o, x);
        return o;
    }
    if (!nx || !ny) return jfail(r, line, "unsupported operand types: '%s' and '%s'", jv_type_name(x), jv_type_name(y));
    bool ints = !json_is_real(x) && !json_is_real(y);
    json_int_t a = json_is_integer(x) ? json_integer_value(x) : json_is_true(x);
    json_int_t b = json_is_integer(y) ? json_integer_value(y) : json_is_true(y);
    double fa = json_is_real(x) ? json_real_value(x) : (double)a, fb = json_is_real(y) ? json_real_value(y) : (double)b;
    json_int_t res;
    switch (op) {
    case OP_ADD:
        if (!ints) return json_real(fa + fb);
        if (__builtin_add_overflow(a, b, &res)) return jfail(r, line, "integer overflow");
        return json_integer(res);
    case OP_SUB:
        if (!ints) return json_real(fa - fb);
        if (__builtin_sub_overflow(a, b, &res)) return jfail(r, line, "integer overflow");
        return json_integer(res);
    case OP_MUL:
        if (!ints) return json_real(fa * fb);
        if (__builtin_mul_overflow(a, b, &res)) return jfail(r, line, "integer overflow");
        return json_integer(res);
    case OP_DIV: if (fb == 0) return jfail(r, line, "division by zero"); return json_real(fa / fb);
    case OP_FLOORDIV:
        if (fb == 0) return jfail(r, line, "division by zero");
        if (ints) {
            if (a == INT64_MIN && b == -1) return jfail(r, line, "integer overflow");
            json_int_t q = a / b;
            if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
            return json_integer(q);
        }
        return json_real(floor(fa / fb));
    case OP_MOD:
        if (fb == 0) return jfail(r, line, "modulo by zero");
        if (ints) {
            if (b == -1) return json_integer(0);
            json_int_t m = a % b;
            if (m && ((m < 0) != (b < 0))) m += b;
            return json_integer(m);
        }
        { double m = fmod(fa, fb); if (m && ((m < 0) != (fb < 0))) m += fb; return json_real(m); }
    case OP_POW:
        if (ints && b >= 0) {
            json_int_t p = 1;
            if (a == 0 || a == 1) return json_integer(b == 0 ? 1 : a);
            if (a == -1) return json_integer(b % 2 ? -1 : 1);
            for (json_int_t i = 0; i < b; i++)
                if (__builtin_mul_overflow(p, a, &p)) return jfail(r, line, "integer overflow");
            return json_integer(p);
        }
        return json_real(pow(fa, fb));
    default: return jfail(r, line, "bad operator");
    }
}

static json_t *contains(Render *r, int line, json_t *item, json_t *c) {
    if (!c) return json_false();
    if (json_is_string(c)) {
        if (!item || !json_is_string(item)) return jfail(r, line, "'in <string>' requires string as left operand");
        return json_boolean(memmem(json_string_value(c), json_string_length(c), json_string_value(item), json_string_length(item)) != NULL);
    }
    if (json_is_array(c)) {
        for (size_t i = 0; i < json_array_size(c); i++)
            if (jv_equal(json_array_get(c, i), item)) return json_true();
        return json_false();
    }
    if (json_is_object(c)) return json_boolean(item && json_is_string(item) && json_object_get(c, json_string_value(item)));
    return jfail(r, line, "argument of type '%s' is not iterable", jv_type_name(c));
}

static json_t *jeval_node(Render *r, Node *n) {
    if (r->failed) return NULL;
    switch (n->kind) {
    case N_LIT: return json_incref(n->lit);
    case N_NAME: return lookup(r, n->name);
    case N_ATTR: {
        json_t *o = jeval(r, n->a);
        if (r->failed) return NULL;
        if (!o) return jfail(r, n->line, "undefined value has no attribute '%s'", n->name);
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
        json_t *o = jeval(r, n->a), *k = jeval(r, n->b);
        json_t *v = r->failed ? NULL : get_item(r, n->line, o, k);
        json_decref(o);
        json_decref(k);
        return v;
    }
    case N_SLICE: {
        json_t *o = jeval(r, n->a);
        json_t *v = r->failed ? NULL : do_slice(r, n, o);
        json_decref(o);
        return v;
    }
    case N_CALL: {
        Args a;
        json_t *obj = n->a->kind == N_ATTR ? jeval(r, n->a->a) : NULL;
        jargs_eval(r, n, &a);
        json_t *v = NULL;
        if (!r->failed) {
            if (n->a->kind == N_NAME) v = jcall_func(r, n, &a);
            else if (!obj) v = jfail(r, n->line, "undefined value has no method '%s'", n->a->name);
            else v = jcall_method(r, n, obj, &a);
        }
        jargs_free(&a);
        json_decref(obj);
        return v;
    }
    case N_FILTER: {
        json_t *x = jeval(r, n->a);
        Args a;
        jargs_eval(r, n, &a);
        json_t *v = r->failed ? NULL : japply_filter(r, n->line, n->name, x, &a);
        jargs_free(&a);
        json_decref(x);
        return v;
    }
    case N_TEST: {
        json_t *x = jeval(r, n->a);
        Args a;
        jargs_eval(r, n, &a);
        int t = r->failed ? -1 : japply_test(r, n->line, n->name, x, &a, 0);
        jargs_free(&a);
        json_decref(x);
        if (t < 0) return NULL;
        return json_boolean(n->negate ? !t : t);
    }
    case N_NEG: case N_POS: {
        json_t *x = jeval(r, n->a), *v = NULL;
        if (r->failed) return NULL;
        if (x && json_is_integer(x) && n->kind == N_NEG && json_integer_value(x) == INT64_MIN) v = jfail(r, n->line, "integer overflow");
        else if (x && json_is_integer(x)) v = json_integer(n->kind == N_NEG ? -json_integer_value(x) : json_integer_value(x));
        else if (x && json_is_real(x)) v = json_real(n->kind == N_NEG ? -json_real_value(x) : json_real_value(x));
        else if (x && json_is_boolean(x)) v = json_integer(n->kind == N_NEG ? -(json_int_t)json_is_true(x) : json_is_true(x));
        else v = jfail(r, n->line, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+', jv_type_name(x));
        json_decref(x);
        return v;
    }
    case N_NOT: {
        json_t *x = jeval(r, n->a);
        bool t = jv_truthy(x);
        json_decref(x);
        return r->failed ? NULL : json_boolean(!t);
    }
    case N_AND: case N_OR: {
        json_t *x = jeval(r, n->a);
        if (r->failed) return NULL;
        if (jv_truthy(x) == (n->kind == N_OR)) return x;
        json_decref(x);
        return jeval(r, n->b);
    }
    case N_COND: {
        json_t *c = jeval(r, n->a);
        bool t = jv_truthy(c);
        json_decref(c);
        if (r->failed) return NULL;
        return t ? jeval(r, n->b) : n->c ? jeval(r, n->c) : NULL;
    }
    case N_BIN: {
        json_t *x = jeval(r, n->a), *y = jeval(r, n->b), *v = NULL;
        if (!r->failed) switch (n->op) {
        case OP_EQ: v = json_boolean(jv_equal(x, y)); break;
        case OP_NE: v = json_boolean(!jv_equal(x, y)); break;
        case OP_LT: case OP_LE: case OP_GT: case OP_GE: {
            int c = jv_cmp(x, y);
            if (c == -2) v = jfail(r, n->line, "'<' not supported between '%s' and '%s'", jv_type_name(x), jv_type_name(y));
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
            json_t *x = jeval(r, n->kids[i]);
            json_array_append_new(l, x ? x : json_incref(r->undef));
        }
        return l;
    }
    case N_DICT: {
        json_t *d = json_object();
        for (int i = 0; i + 1 < n->n_kids && !r->failed; i += 2) {
            json_t *k = jeval(r, n->kids[i]), *x = jeval(r, n->kids[i + 1]);
            if (!r->failed && (!k || !json_is_string(k))) jfail(r, n->line, "dict keys must be strings");
            else if (!r->failed) json_object_set(d, json_string_value(k), x ? x : r->undef);
            json_decref(k);
            json_decref(x);
        }
        return d;
    }
    default: return jfail(r, n->line, "not an expression");
    }
}

/* Once rendering failed, every evaluation yields NULL: a node that built a
 * value before a sub-expression failed (a list or dict half filled) drops it
 * here, so no caller has to free values on its error paths. */
json_t *jeval(Render *r, Node *n) {
    json_t *v = jeval_node(r, n);
    if (r->failed && v) {
        json_decref(v);
        return NULL;
    }
    return v;
}

static void set_var(Render *r, const char *name, json_t *v) {
    json_object_set_new(r->frames[r->n_frames - 1], name, v ? v : json_incref(r->undef));
}

static void exec_for(Render *r, Node *n) {
    json_t *it = jeval(r, n->a);
    if (r->failed) return;
    json_t *lst = jiter_list(r, n->line, it);
    json_decref(it);
    if (!lst) return;
    /* the inline "if" filter decides which items count for loop.length */
    json_t *items = json_array();
    for (size_t i = 0; i < json_array_size(lst) && !r->failed; i++) {
        json_t *x = json_array_get(lst, i);
        if (n->b) {
            if (r->n_frames == 256) { jfail(r, n->line, "nesting too deep"); break; }
            r->frames[r->n_frames++] = json_object();
            if (n->n_targets == 1) set_var(r, n->targets[0], json_incref(x));
            else for (int k = 0; k < n->n_targets; k++) set_var(r, n->targets[k], json_is_array(x) ? json_incref(json_array_get(x, (size_t)k)) : NULL);
            json_t *c = jeval(r, n->b);
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
        if (r->n_frames == 256) { jfail(r, n->line, "nesting too deep"); break; }
        json_t *frame = json_object();
        r->frames[r->n_frames++] = frame;
        json_t *x = json_array_get(items, i);
        if (n->n_targets == 1) set_var(r, n->targets[0], json_incref(x));
        else {
            if (!json_is_array(x) || json_array_size(x) != (size_t)n->n_targets) jfail(r, n->line, "cannot unpack %s into %d names", jv_type_name(x), n->n_targets);
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
    if (++r->steps > JINJA_MAX_STEPS) { jfail(r, n->line, "template runs too long"); return; }
    if (jtoo_big(r, n->line, r->out.n, JINJA_MAX_BYTES)) return;
    switch (n->kind) {
    case N_BODY:
        for (int i = 0; i < n->n_kids && !r->failed && !r->ctl; i++) exec(r, n->kids[i]);
        return;
    case N_TEXT: sb_put(&r->out, json_string_value(n->lit), json_string_length(n->lit)); return;
    case N_OUT: {
        json_t *v = jeval(r, n->a);
        if (!r->failed) jv_str(&r->out, v);
        json_decref(v);
        return;
    }
    case N_IF:
        for (int i = 0; i < n->n_kids; i++) {
            json_t *c = jeval(r, n->kids[i]);
            bool t = jv_truthy(c);
            json_decref(c);
            if (r->failed) return;
            if (t) { exec(r, n->bodies[i]); return; }
        }
        if (n->n_bodies > n->n_kids) exec(r, n->bodies[n->n_kids]);
        return;
    case N_FOR: exec_for(r, n); return;
    case N_SET: {
        json_t *v = jeval(r, n->a);
        if (!r->failed) set_var(r, n->name, v);
        else json_decref(v);
        return;
    }
    case N_SET_ATTR: {
        json_t *o = lookup(r, n->c->name);
        if (!o || !jis_ns(r, o)) { json_decref(o); jfail(r, n->line, "cannot assign attribute on non-namespace object"); return; }
        json_t *v = jeval(r, n->a);
        if (!r->failed) json_object_set_new(o, n->name, v ? v : json_incref(r->undef));
        else json_decref(v);
        json_decref(o);
        return;
    }
    case N_BREAK: r->ctl = 1; return;
    case N_CONTINUE: r->ctl = 2; return;
    default: jfail(r, n->line, "not a statement"); return;
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
