/*
 * jinja_value.c - Python semantics of template values (jansson json_t,
 * NULL = Undefined): truthiness, str() and repr(), float repr, equality and
 * ordering, and json.dumps as transformers' tojson filter calls it.
 * Not here: operators and filters (jinja_eval.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "jinja.h"

void sb_put(StrBuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        if (b->cap < 256) b->cap = 256;
        b->s = realloc(b->s, b->cap);
        CHECK(b->s, "out of memory rendering a template");
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
void sb_puts(StrBuf *b, const char *s) { sb_put(b, s, strlen(s)); }
void sb_putc(StrBuf *b, char c) { sb_put(b, &c, 1); }

bool jv_truthy(json_t *v) {
    if (!v) return false;
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return true;
    default: return false;
    }
}

const char *jv_type_name(json_t *v) {
    if (!v) return "Undefined";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "dict";
    case JSON_ARRAY: return "list";
    case JSON_STRING: return "str";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_TRUE: case JSON_FALSE: return "bool";
    default: return "NoneType";
    }
}

/* repr(float): shortest round-trip digits, Python's exponent rules. */
void jv_float(StrBuf *b, double d) {
    if (isnan(d)) { sb_puts(b, "nan"); return; }
    if (isinf(d)) { sb_puts(b, d < 0 ? "-inf" : "inf"); return; }
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    /* buf = [-]D.DDDe[+-]XX ; split into digits and exponent */
    char digits[32];
    int nd = 0, exp10;
    const char *q = buf;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    if (neg) sb_putc(b, '-');
    if (exp10 < -4 || exp10 >= 16) {
        sb_putc(b, digits[0]);
        if (nd > 1) { sb_putc(b, '.'); sb_put(b, digits + 1, (size_t)nd - 1); }
        char e[16];
        snprintf(e, sizeof e, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        sb_puts(b, e);
    } else if (exp10 < 0) {
        sb_puts(b, "0.");
        for (int i = -1; i > exp10; i--) sb_putc(b, '0');
        sb_put(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i <= exp10; i++) sb_putc(b, i < nd ? digits[i] : '0');
        sb_putc(b, '.');
        if (nd > exp10 + 1) sb_put(b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
        else sb_putc(b, '0');
    }
}

static void str_repr(StrBuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    sb_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == (unsigned char)q || c == '\\') { sb_putc(b, '\\'); sb_putc(b, (char)c); }
        else if (c == '\n') sb_puts(b, "\\n");
        else if (c == '\r') sb_puts(b, "\\r");
        else if (c == '\t') sb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) { snprintf(esc, sizeof esc, "\\x%02x", c); sb_puts(b, esc); }
        else sb_putc(b, (char)c);
    }
    sb_putc(b, q);
}

static void num_str(StrBuf *b, json_t *v) {
    char buf[32];
    if (json_is_integer(v)) { snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); sb_puts(b, buf); }
    else jv_float(b, json_real_value(v));
}

void jv_repr(StrBuf *b, json_t *v) {
    if (!v) return;
    switch (json_typeof(v)) {
    case JSON_STRING: str_repr(b, json_string_value(v), json_string_length(v)); break;
    case JSON_ARRAY: {
        sb_putc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_puts(b, ", ");
            jv_repr(b, json_array_get(v, i));
        }
        sb_putc(b, ']');
        break;
    }
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        bool first = true;
        sb_putc(b, '{');
        json_object_foreach(v, k, x) {
            if (!first) sb_puts(b, ", ");
            first = false;
            str_repr(b, k, strlen(k));
            sb_puts(b, ": ");
            jv_repr(b, x);
        }
        sb_putc(b, '}');
        break;
    }
    default: jv_str(b, v);
    }
}

void jv_str(StrBuf *b, json_t *v) {
    if (!v) return;
    switch (json_typeof(v)) {
    case JSON_STRING: sb_put(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: case JSON_REAL: num_str(b, v); break;
    case JSON_TRUE: sb_puts(b, "True"); break;
    case JSON_FALSE: sb_puts(b, "False"); break;
    case JSON_NULL: sb_puts(b, "None"); break;
    default: jv_repr(b, v);
    }
}

static void json_str(StrBuf *b, const char *s, size_t n, bool ascii) {
    sb_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[16];
        switch (c) {
        case '"': sb_puts(b, "\\\""); break;
        case '\\': sb_puts(b, "\\\\"); break;
        case '\n': sb_puts(b, "\\n"); break;
        case '\r': sb_puts(b, "\\r"); break;
        case '\t': sb_puts(b, "\\t"); break;
        case '\b': sb_puts(b, "\\b"); break;
        case '\f': sb_puts(b, "\\f"); break;
        default:
            if (c < 0x20 || (ascii && c == 0x7f)) { snprintf(esc, sizeof esc, "\\u%04x", c); sb_puts(b, esc); }
            else if (ascii && c >= 0x80) {
                uint32_t cp;
                int len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
                cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
                for (int k = 1; k < len && i + (size_t)k < n; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
                i += (size_t)len - 1;
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                } else snprintf(esc, sizeof esc, "\\u%04x", cp);
                sb_puts(b, esc);
            } else sb_putc(b, (char)c);
        }
    }
    sb_putc(b, '"');
}

static void newline_indent(StrBuf *b, int indent, int depth) {
    sb_putc(b, '\n');
    for (int i = 0; i < indent * depth; i++) sb_putc(b, ' ');
}

static int cmp_keys(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int jv_json(StrBuf *b, json_t *v, bool ascii, int indent, const char *isep, const char *ksep, bool sort_keys, int depth) {
    if (!v) return -1;
    switch (json_typeof(v)) {
    case JSON_STRING: json_str(b, json_string_value(v), json_string_length(v), ascii); return 0;
    case JSON_INTEGER: num_str(b, v); return 0;
    case JSON_REAL: {
        double d = json_real_value(v);
        if (isnan(d)) sb_puts(b, "NaN");
        else if (isinf(d)) sb_puts(b, d < 0 ? "-Infinity" : "Infinity");
        else jv_float(b, d);
        return 0;
    }
    case JSON_TRUE: sb_puts(b, "true"); return 0;
    case JSON_FALSE: sb_puts(b, "false"); return 0;
    case JSON_NULL: sb_puts(b, "null"); return 0;
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        if (!n) { sb_puts(b, "[]"); return 0; }
        sb_putc(b, '[');
        for (size_t i = 0; i < n; i++) {
            if (i) sb_puts(b, isep);
            if (indent >= 0) newline_indent(b, indent, depth + 1);
            if (jv_json(b, json_array_get(v, i), ascii, indent, isep, ksep, sort_keys, depth + 1)) return -1;
        }
        if (indent >= 0) newline_indent(b, indent, depth);
        sb_putc(b, ']');
        return 0;
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(v), k = 0;
        if (!n) { sb_puts(b, "{}"); return 0; }
        const char **keys = xmalloc(n * sizeof *keys);
        const char *key;
        json_t *x;
        json_object_foreach(v, key, x) keys[k++] = key;
        if (sort_keys) qsort(keys, n, sizeof *keys, cmp_keys);
        sb_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) sb_puts(b, isep);
            if (indent >= 0) newline_indent(b, indent, depth + 1);
            json_str(b, keys[i], strlen(keys[i]), ascii);
            sb_puts(b, ksep);
            if (jv_json(b, json_object_get(v, keys[i]), ascii, indent, isep, ksep, sort_keys, depth + 1)) {
                free(keys);
                return -1;
            }
        }
        free(keys);
        if (indent >= 0) newline_indent(b, indent, depth);
        sb_putc(b, '}');
        return 0;
    }
    }
    return -1;
}

static bool is_num(json_t *v) { return v && (json_is_number(v) || json_is_boolean(v)); }
static double num_val(json_t *v) {
    return json_is_integer(v) ? (double)json_integer_value(v) : json_is_real(v) ? json_real_value(v) : json_is_true(v);
}

bool jv_equal(json_t *a, json_t *b) {
    if (!a || !b) return !a && !b;
    if (is_num(a) && is_num(b)) {
        if (json_is_real(a) || json_is_real(b)) return num_val(a) == num_val(b);
        json_int_t x = json_is_integer(a) ? json_integer_value(a) : json_is_true(a);
        json_int_t y = json_is_integer(b) ? json_integer_value(b) : json_is_true(b);
        return x == y;
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    if (json_is_string(a))
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!jv_equal(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        json_t *x;
        json_object_foreach(a, k, x) if (!jv_equal(x, json_object_get(b, k))) return false;
        return true;
    }
    return true; /* null == null */
}

int jv_cmp(json_t *a, json_t *b) {
    if (is_num(a) && is_num(b)) {
        double x = num_val(a), y = num_val(b);
        if (json_is_integer(a) && json_is_integer(b)) {
            json_int_t i = json_integer_value(a), j = json_integer_value(b);
            return i < j ? -1 : i > j;
        }
        return x < y ? -1 : x > y;
    }
    if (a && b && json_is_string(a) && json_is_string(b)) {
        size_t la = json_string_length(a), lb = json_string_length(b);
        int c = memcmp(json_string_value(a), json_string_value(b), la < lb ? la : lb);
        if (c) return c < 0 ? -1 : 1;
        return la < lb ? -1 : la > lb;
    }
    return -2;
}
