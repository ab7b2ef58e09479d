/*
 * grammar_json.c - JSON Schema to GBNF text (grammar_parse.c reads it back).
 *
 * The subset (what OpenAI's strict structured outputs and vLLM's tests use):
 *   type (a name or a list of names): object, array, string, number,
 *     integer, boolean, null; a schema without type is any JSON value
 *     (unless enum / const / anyOf / $ref say otherwise);
 *   object: properties (written in their order), required,
 *     additionalProperties false or absent (only the listed properties are
 *     generated; a listed-but-optional property may be left out), or, for an
 *     object without properties, additionalProperties true / a schema (a map);
 *   array: items, minItems, maxItems;
 *   string: minLength, maxLength, pattern (search semantics, as JSON Schema:
 *     unanchored ends match anything; characters JSON must escape are not
 *     generated inside a pattern);
 *   enum, const (any JSON values), anyOf, $ref to "#", "#/$defs/NAME" or
 *   "#/definitions/NAME" (recursion allowed);
 *   annotations ignored: title, description, default, examples, $schema,
 *   $id, $comment, strict, deprecated, readOnly, writeOnly, $defs, definitions.
 * Anything else (oneOf, allOf, not, format, minimum, multipleOf, patternProperties,
 * ...) is a 400 naming the keyword and where it is.
 *
 * Numbers: at most 16 integer digits, 16 fraction digits and 2 exponent
 * digits (so every number is a finite double); whitespace between tokens:
 * nothing, one space, or one newline and up to 24 spaces / tabs of indent;
 * none before or after the value (the bounds keep a sampled output short;
 * every output is valid JSON).
 *
 * Not here: GBNF parsing and matching.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "grammar_internal.h"

#define WS "( \" \" | \"\\n\" [ \\t]{0,24} )?"
#define MAX_SCHEMA_DEPTH 64

typedef struct J {
    json_t *root;
    Buf *out;       /* the rules */
    int n_rules;
    Err *err;
    int failed;
    /* $ref targets already given a rule: pointer string -> rule number */
    const char *ref_ptr[256];
    int ref_rule[256];
    int n_refs;
    int need_value; /* the generic JSON rules are used */
} J;

__attribute__((format(printf, 3, 4)))
static int jfail(J *j, const char *path, const char *fmt, ...) {
    if (!j->failed) {
        j->failed = 1;
        char m[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        ERR(j->err, 400, "json_schema: %s (at %s)", m, path[0] ? path : "the root");
    }
    return -1;
}

/* A GBNF "literal" of bytes s[0..n). */
static void lit(Buf *b, const char *s, size_t n) {
    buf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') buf_printf(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) buf_printf(b, "\\x%02x", c);
        else buf_append(b, &s[i], 1);
    }
    buf_puts(b, "\"");
}

/* The literal of a JSON value's compact text. */
static int lit_json(J *j, Buf *b, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) return jfail(j, "", "%s", "out of memory");
    lit(b, s, strlen(s));
    free(s);
    return 0;
}

static const char *const ANNOTATIONS[] = { "title", "description", "default", "examples", "$schema", "$id",
                                           "$comment", "strict", "deprecated", "readOnly", "writeOnly", "$defs",
                                           "definitions", NULL };
static const char *const KNOWN[] = { "type", "properties", "required", "additionalProperties", "items",
                                     "minItems", "maxItems", "minLength", "maxLength", "pattern", "enum",
                                     "const", "anyOf", "$ref", NULL };

static int in_list(const char *k, const char *const *l) {
    for (int i = 0; l[i]; i++) if (!strcmp(k, l[i])) return 1;
    return 0;
}

static void generic_rules(Buf *b) {
    buf_puts(b, "json-value ::= json-object | json-array | json-string | json-number | \"true\" | \"false\" | \"null\"\n");
    buf_puts(b, "json-object ::= \"{\" " WS " ( json-string " WS " \":\" " WS " json-value ( " WS " \",\" " WS
                " json-string " WS " \":\" " WS " json-value )* )? " WS " \"}\"\n");
    buf_puts(b, "json-array ::= \"[\" " WS " ( json-value ( " WS " \",\" " WS " json-value )* )? " WS " \"]\"\n");
    buf_puts(b, "json-string ::= \"\\\"\" json-char* \"\\\"\"\n");
    buf_puts(b, "json-char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n");
    buf_puts(b, "json-number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [+-]? [0-9]{1,2} )?\n");
    buf_puts(b, "json-integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n");
}

static int schema_rule(J *j, json_t *s, const char *path, int depth);

/* The rule for a $ref pointer. */
static int ref_rule(J *j, const char *ptr, const char *path, int depth) {
    for (int i = 0; i < j->n_refs; i++) if (!strcmp(j->ref_ptr[i], ptr)) return j->ref_rule[i];
    json_t *t = NULL;
    if (!strcmp(ptr, "#")) t = j->root;
    else if (!strncmp(ptr, "#/$defs/", 8)) t = json_object_get(json_object_get(j->root, "$defs"), ptr + 8);
    else if (!strncmp(ptr, "#/definitions/", 14)) t = json_object_get(json_object_get(j->root, "definitions"), ptr + 14);
    else return jfail(j, path, "$ref \"%s\": only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported", ptr);
    if (!t) return jfail(j, path, "$ref \"%s\" does not resolve", ptr);
    if (j->n_refs >= 256) return jfail(j, path, "%s", "more than 256 distinct $ref targets");
    /* reserve the rule first so recursion finds it */
    int r = j->n_rules++;
    j->ref_ptr[j->n_refs] = ptr;
    j->ref_rule[j->n_refs++] = r;
    int body = schema_rule(j, t, ptr, depth + 1);
    if (body < 0) return -1;
    buf_printf(j->out, "s%d ::= s%d\n", r, body);
    return r;
}

static int string_body(J *j, json_t *s, const char *path, Buf *b) {
    json_t *pat = json_object_get(s, "pattern");
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    if (pat) {
        if (!json_is_string(pat)) return jfail(j, path, "%s", "pattern must be a string");
        if (mn || mx) return jfail(j, path, "%s", "pattern together with minLength/maxLength is not supported");
        const char *p = json_string_value(pat);
        size_t n = strlen(p);
        buf_puts(b, "\"\\\"\" ");
        if (!(n > 0 && p[0] == '^')) buf_puts(b, "%/.*/ ");
        buf_puts(b, "%/");
        for (size_t i = 0; i < n; i++) {
            if (p[i] == '/') buf_puts(b, "\\/");
            else if (p[i] == '\\' && i + 1 < n) { buf_append(b, p + i, 2); i++; }
            else buf_append(b, p + i, 1);
        }
        buf_puts(b, "/ ");
        int anchored_end = n > 0 && p[n - 1] == '$' && !(n > 1 && p[n - 2] == '\\');
        if (!anchored_end) buf_puts(b, "%/.*/ ");
        buf_puts(b, "\"\\\"\"");
        return 0;
    }
    long lo = 0, hi = -1;
    if (mn) {
        if (!json_is_integer(mn) || json_integer_value(mn) < 0 || json_integer_value(mn) > GRAMMAR_MAX_REPEAT)
            return jfail(j, path, "%s", "minLength must be an integer in [0, 1000]");
        lo = (long)json_integer_value(mn);
    }
    if (mx) {
        if (!json_is_integer(mx) || json_integer_value(mx) < lo || json_integer_value(mx) > GRAMMAR_MAX_REPEAT)
            return jfail(j, path, "%s", "maxLength must be an integer in [minLength, 1000]");
        hi = (long)json_integer_value(mx);
    }
    if (lo == 0 && hi < 0) buf_puts(b, "json-string");
    else if (hi < 0) buf_printf(b, "\"\\\"\" json-char{%ld,} \"\\\"\"", lo);
    else buf_printf(b, "\"\\\"\" json-char{%ld,%ld} \"\\\"\"", lo, hi);
    j->need_value = 1;
    return 0;
}

static int object_body(J *j, json_t *s, const char *path, int depth, Buf *b) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return jfail(j, path, "%s", "properties must be an object");
    if (req && !json_is_array(req)) return jfail(j, path, "%s", "required must be an array");
    size_t np = props ? json_object_size(props) : 0;
    if (np == 0) {
        if (req && json_array_size(req)) return jfail(j, path, "%s", "required names properties that are not listed");
        if (!add || json_is_true(add)) { j->need_value = 1; buf_puts(b, "json-object"); return 0; }
        if (json_is_false(add)) { buf_puts(b, "\"{\" " WS " \"}\""); return 0; }
        if (!json_is_object(add)) return jfail(j, path, "%s", "additionalProperties must be a boolean or a schema");
        char sub[512];
        snprintf(sub, sizeof sub, "%s/additionalProperties", path);
        int v = schema_rule(j, add, sub, depth + 1);
        if (v < 0) return -1;
        j->need_value = 1;
        buf_printf(b, "\"{\" " WS " ( json-string " WS " \":\" " WS " s%d ( " WS " \",\" " WS " json-string " WS
                      " \":\" " WS " s%d )* )? " WS " \"}\"", v, v);
        return 0;
    }
    if (add && !json_is_false(add))
        return jfail(j, path, "%s", "additionalProperties other than false next to properties is not supported");
    if (np > 256) return jfail(j, path, "%s", "more than 256 properties");
    const char *keys[256];
    int vals[256], reqd[256];
    size_t k = 0;
    const char *key;
    json_t *val;
    json_object_foreach(props, key, val) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, key);
        keys[k] = key;
        vals[k] = schema_rule(j, val, sub, depth + 1);
        if (vals[k] < 0) return -1;
        reqd[k] = 0;
        k++;
    }
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) return jfail(j, path, "%s", "required must list strings");
        int found = 0;
        for (size_t q = 0; q < np; q++)
            if (!strcmp(keys[q], json_string_value(r))) { reqd[q] = 1; found = 1; }
        if (!found) return jfail(j, path, "required property \"%s\" is not in properties", json_string_value(r));
    }
    /* kv_i: "key" ws ":" ws value; R_i: the rest after something was written
     * (",' kv_i, optional unless required); F_i: nothing written yet */
    int base = j->n_rules;
    j->n_rules += 3 * (int)np + 2;
    for (size_t i = 0; i < np; i++) {
        buf_printf(j->out, "s%d ::= ", base + (int)i);
        json_t *ks = json_string(keys[i]);
        if (!ks) return jfail(j, path, "%s", "out of memory");
        lit_json(j, j->out, ks);
        json_decref(ks);
        buf_printf(j->out, " " WS " \":\" " WS " s%d\n", vals[i]);
    }
    int R0 = base + (int)np, F0 = base + 2 * (int)np + 1; /* R_i = R0 + i (i = np: empty); F_i = F0 + i */
    for (size_t i = 0; i <= np; i++) {
        if (i == np) { buf_printf(j->out, "s%d ::= \"\"\n", R0 + (int)i); continue; }
        buf_printf(j->out, "s%d ::= ( " WS " \",\" " WS " s%d )%s s%d\n", R0 + (int)i, base + (int)i,
                   reqd[i] ? "" : "?", R0 + (int)i + 1);
    }
    for (size_t i = 0; i < np; i++) {
        if (reqd[i]) buf_printf(j->out, "s%d ::= s%d s%d\n", F0 + (int)i, base + (int)i, R0 + (int)i + 1);
        else if (i + 1 < np)
            buf_printf(j->out, "s%d ::= s%d s%d | s%d\n", F0 + (int)i, base + (int)i, R0 + (int)i + 1, F0 + (int)i + 1);
        else buf_printf(j->out, "s%d ::= s%d s%d | \"\"\n", F0 + (int)i, base + (int)i, R0 + (int)i + 1);
    }
    buf_printf(b, "\"{\" " WS " s%d " WS " \"}\"", F0);
    return 0;
}

static int array_body(J *j, json_t *s, const char *path, int depth, Buf *b) {
    json_t *items = json_object_get(s, "items");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    long lo = 0, hi = -1;
    if (mn) {
        if (!json_is_integer(mn) || json_integer_value(mn) < 0 || json_integer_value(mn) > 1000)
            return jfail(j, path, "%s", "minItems must be an integer in [0, 1000]");
        lo = (long)json_integer_value(mn);
    }
    if (mx) {
        if (!json_is_integer(mx) || json_integer_value(mx) < lo || json_integer_value(mx) > 1000)
            return jfail(j, path, "%s", "maxItems must be an integer in [minItems, 1000]");
        hi = (long)json_integer_value(mx);
    }
    int it;
    if (!items || json_is_true(items)) { j->need_value = 1; it = -1; }
    else {
        if (!json_is_object(items)) return jfail(j, path, "%s", "items must be a schema object");
        char sub[512];
        snprintf(sub, sizeof sub, "%s/items", path);
        it = schema_rule(j, items, sub, depth + 1);
        if (it < 0) return -1;
    }
    char item[32];
    if (it < 0) snprintf(item, sizeof item, "json-value");
    else snprintf(item, sizeof item, "s%d", it);
    if (hi == 0) { buf_puts(b, "\"[\" " WS " \"]\""); return 0; }
    char rep[64];
    long rlo = lo > 0 ? lo - 1 : 0;
    if (hi < 0) snprintf(rep, sizeof rep, "{%ld,}", rlo);
    else snprintf(rep, sizeof rep, "{%ld,%ld}", rlo, hi - 1);
    buf_printf(b, "\"[\" " WS " ( %s ( " WS " \",\" " WS " %s )%s )%s " WS " \"]\"", item, item, rep, lo > 0 ? "" : "?");
    return 0;
}

static int type_body(J *j, json_t *s, const char *t, const char *path, int depth, Buf *b) {
    if (!strcmp(t, "string")) return string_body(j, s, path, b);
    if (!strcmp(t, "object")) return object_body(j, s, path, depth, b);
    if (!strcmp(t, "array")) return array_body(j, s, path, depth, b);
    if (!strcmp(t, "number")) { j->need_value = 1; buf_puts(b, "json-number"); return 0; }
    if (!strcmp(t, "integer")) { j->need_value = 1; buf_puts(b, "json-integer"); return 0; }
    if (!strcmp(t, "boolean")) { buf_puts(b, "( \"true\" | \"false\" )"); return 0; }
    if (!strcmp(t, "null")) { buf_puts(b, "\"null\""); return 0; }
    return jfail(j, path, "type \"%s\" is not a JSON Schema type", t);
}

/* A new rule for schema s; returns its number. */
static int schema_rule(J *j, json_t *s, const char *path, int depth) {
    if (j->failed) return -1;
    if (depth > MAX_SCHEMA_DEPTH) return jfail(j, path, "%s", "schema nested too deeply");
    int r = j->n_rules++;
    Buf b = { 0 };
    int rc = 0;
    if (json_is_true(s)) { j->need_value = 1; buf_puts(&b, "json-value"); goto done; }
    if (!json_is_object(s)) { rc = jfail(j, path, "%s", "a schema must be an object or true"); goto done; }
    const char *key;
    json_t *val;
    json_object_foreach(s, key, val) {
        if (in_list(key, ANNOTATIONS) || in_list(key, KNOWN)) continue;
        rc = jfail(j, path, "keyword \"%s\" is not supported", key);
        goto done;
    }
    json_t *ref = json_object_get(s, "$ref"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    json_t *any = json_object_get(s, "anyOf"), *ty = json_object_get(s, "type");
    if (ref) {
        if (!json_is_string(ref)) { rc = jfail(j, path, "%s", "$ref must be a string"); goto done; }
        int t = ref_rule(j, json_string_value(ref), path, depth);
        if (t < 0) { rc = -1; goto done; }
        buf_printf(&b, "s%d", t);
    } else if (cn) {
        rc = lit_json(j, &b, cn);
    } else if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0) { rc = jfail(j, path, "%s", "enum must be a non-empty array"); goto done; }
        for (size_t i = 0; i < json_array_size(en) && rc == 0; i++) {
            if (i) buf_puts(&b, " | ");
            rc = lit_json(j, &b, json_array_get(en, i));
        }
    } else if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0) { rc = jfail(j, path, "%s", "anyOf must be a non-empty array"); goto done; }
        for (size_t i = 0; i < json_array_size(any); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/anyOf/%zu", path, i);
            int t = schema_rule(j, json_array_get(any, i), sub, depth + 1);
            if (t < 0) { rc = -1; goto done; }
            buf_printf(&b, "%ss%d", i ? " | " : "", t);
        }
    } else if (json_is_string(ty)) {
        rc = type_body(j, s, json_string_value(ty), path, depth, &b);
    } else if (json_is_array(ty) && json_array_size(ty) > 0) {
        for (size_t i = 0; i < json_array_size(ty) && rc == 0; i++) {
            json_t *t = json_array_get(ty, i);
            if (!json_is_string(t)) { rc = jfail(j, path, "%s", "type must list strings"); break; }
            if (i) buf_puts(&b, " | ");
            buf_puts(&b, "( ");
            rc = type_body(j, s, json_string_value(t), path, depth, &b);
            buf_puts(&b, " )");
        }
    } else if (ty) {
        rc = jfail(j, path, "%s", "type must be a string or a non-empty list of strings");
    } else if (json_object_get(s, "properties")) {
        rc = object_body(j, s, path, depth, &b);
    } else {
        j->need_value = 1;
        buf_puts(&b, "json-value");
    }
done:
    if (rc == 0 && !j->failed) {
        buf_printf(j->out, "s%d ::= %s\n", r, b.p ? b.p : "\"\"");
    }
    buf_free(&b);
    return j->failed || rc < 0 ? -1 : r;
}

int grammar_json_schema_to_gbnf(json_t *schema, const char *root_name, Buf *out, Err *err) {
    J j = { .root = schema, .out = out, .err = err };
    int r = schema_rule(&j, schema, "", 0);
    if (r < 0) return -1;
    buf_printf(out, "%s ::= s%d\n", root_name, r);
    if (j.need_value) generic_rules(out);
    return 0;
}
