/*
 * structured.c - response_format, structured_outputs, guided_* and forced
 * tool_choice to a compiled grammar (structured.h has the fields).
 *
 * Not here: the grammar engine (server/engine/grammar_*.c), applying the
 * mask (engine_step.c).
 */
#include <stdlib.h>
#include <string.h>

#include "structured.h"
#include "log.h"

void structured_init(Server *s) {
    pthread_mutex_init(&s->grammar_mu, NULL);
    s->gvocab = NULL;
    s->grammars = NULL;
}

void structured_free(Server *s) {
    grammar_cache_free(s->grammars);
    grammar_vocab_free(s->gvocab);
    s->grammars = NULL;
    s->gvocab = NULL;
    pthread_mutex_destroy(&s->grammar_mu);
}

/* The token trie, built once (about a second at 151,936 ids): every id below
 * the model's vocab with bytes and not a special token. */
static GrammarCache *cache_of(Server *s) {
    pthread_mutex_lock(&s->grammar_mu);
    if (!s->grammars) {
        int V = s->vocab;
        const char **b = calloc((size_t)V, sizeof *b);
        int32_t *l = calloc((size_t)V, sizeof *l);
        if (b && l) {
            for (int i = 0; i < V; i++) {
                const char *p = NULL;
                size_t n = 0;
                l[i] = -1;
                if (i < tokenizer_vocab_size(s->tok) && !tokenizer_is_special(s->tok, i) &&
                    tokenizer_token_bytes(s->tok, i, &p, &n) == 0 && n > 0) {
                    b[i] = p;
                    l[i] = (int32_t)n;
                }
            }
            s->gvocab = grammar_vocab_create(V, b, l);
            s->grammars = grammar_cache_create(s->gvocab, GRAMMAR_CACHE_CAP);
        }
        free(b);
        free(l);
    }
    GrammarCache *c = s->grammars;
    pthread_mutex_unlock(&s->grammar_mu);
    return c;
}

int structured_grammar(Server *s, GrammarKind kind, const char *src, size_t len, Grammar **out, Err *err) {
    GrammarCache *c = cache_of(s);
    ENSURE(err, c, 503, "out of memory building the grammar vocabulary");
    return grammar_cache_get(c, kind, src, len, out, err);
}

/* A JSON value as compact text (kept key order). */
static char *dump(json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); }

static int from_json(Server *s, GrammarKind kind, json_t *v, const char *param, Grammar **out, Err *err) {
    if (json_is_string(v)) return structured_grammar(s, kind, json_string_value(v), json_string_length(v), out, err);
    char *t = dump(v);
    ENSURE(err, t, 503, "%s: out of memory", param);
    int rc = structured_grammar(s, kind, t, strlen(t), out, err);
    free(t);
    return rc;
}

static int from_string(Server *s, GrammarKind kind, json_t *v, const char *param, Grammar **out, Err *err) {
    ENSURE(err, json_is_string(v), 400, "%s: must be a string", param);
    return structured_grammar(s, kind, json_string_value(v), json_string_length(v), out, err);
}

/* Prefix the message with the parameter (http.c makes it the "param"). */
static int named(Err *err, const char *param, int rc) {
    if (rc < 0 && strncmp(err->msg, param, strlen(param)) != 0) {
        char m[sizeof err->msg + 64];
        snprintf(m, sizeof m, "%s: %s", param, err->msg);
        m[sizeof err->msg - 1] = 0;
        memcpy(err->msg, m, sizeof err->msg);
    }
    return rc;
}

static int response_format(Server *s, json_t *rf, Grammar **out, Err *err) {
    ENSURE(err, json_is_object(rf), 400, "response_format: must be an object with a \"type\"");
    json_t *ty = json_object_get(rf, "type");
    ENSURE(err, json_is_string(ty), 400, "response_format: must be an object with a \"type\"");
    const char *t = json_string_value(ty);
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) return named(err, "response_format", structured_grammar(s, GRAMMAR_JSON_OBJECT, "", 0, out, err));
    if (!strcmp(t, "json_schema")) {
        json_t *js = json_object_get(rf, "json_schema");
        ENSURE(err, json_is_object(js), 400, "response_format: json_schema must be an object with a \"schema\"");
        json_t *sc = json_object_get(js, "schema");
        ENSURE(err, sc && (json_is_object(sc) || json_is_true(sc)), 400,
               "response_format: json_schema.schema must be a JSON Schema object");
        json_t *strict = json_object_get(js, "strict");
        ENSURE(err, !strict || json_is_boolean(strict) || json_is_null(strict), 400,
               "response_format: json_schema.strict must be a boolean");
        /* strict or not, the output is held to the schema (never less than asked) */
        return named(err, "response_format", from_json(s, GRAMMAR_JSON_SCHEMA, sc, "response_format", out, err));
    }
    return ERR(err, 400, "response_format: type \"%s\" is not supported (text, json_object, json_schema)", t);
}

/* The tool's name and parameter schema in any of the three shapes. */
static int tool_fields(json_t *tool, const char **name, json_t **params) {
    json_t *fn = json_object_get(tool, "function");
    json_t *src = json_is_object(fn) ? fn : tool;
    json_t *n = json_object_get(src, "name");
    if (!json_is_string(n)) return -1;
    *name = json_string_value(n);
    *params = json_object_get(src, "parameters");
    if (!*params) *params = json_object_get(src, "input_schema");
    return 0;
}

/* Copy GBNF text, prefixing every rule name (outside "literals", [classes],
 * /regexes/ and {counts}) except `keep` (already unique). */
static void prefix_rules(Buf *b, const char *s, size_t n, const char *pfx, const char *keep) {
    size_t i = 0, kl = strlen(keep);
    while (i < n) {
        char c = s[i];
        char close = c == '"' ? '"' : c == '[' ? ']' : c == '/' ? '/' : c == '{' ? '}' : 0;
        if (close) {
            size_t j = i + 1;
            while (j < n && s[j] != close) j += s[j] == '\\' ? 2 : 1;
            if (j > n) j = n;
            buf_append(b, s + i, (j < n ? j + 1 : n) - i);
            i = j + 1;
            continue;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t j = i;
            while (j < n && ((s[j] >= 'a' && s[j] <= 'z') || (s[j] >= 'A' && s[j] <= 'Z') || (s[j] >= '0' && s[j] <= '9') ||
                             s[j] == '_' || s[j] == '-' || s[j] == '.'))
                j++;
            if (!(j - i == kl && !memcmp(s + i, keep, kl))) buf_puts(b, pfx);
            buf_append(b, s + i, j - i);
            i = j;
            continue;
        }
        buf_append(b, &c, 1);
        i++;
    }
}

int structured_tool_grammar(Server *s, json_t *tools, const char *name, int parallel, Grammar **out, Err *err) {
    *out = NULL;
    ENSURE(err, json_is_array(tools) && json_array_size(tools) > 0, 400,
           "tool_choice: a forced tool call needs a non-empty \"tools\" list");
    Buf b = { 0 };
    int n_calls = 0, rc = 0;
    Buf calls = { 0 };
    for (size_t i = 0; i < json_array_size(tools) && rc == 0; i++) {
        const char *tn;
        json_t *params;
        if (tool_fields(json_array_get(tools, i), &tn, &params) < 0) {
            rc = ERR(err, 400, "tools: tool %zu has no string \"name\"", i);
            break;
        }
        if (name && strcmp(name, tn) != 0) continue;
        json_t *ps = params && !json_is_null(params) ? json_incref(params) : json_pack("{s:s}", "type", "object");
        char root[32];
        snprintf(root, sizeof root, "t%zu-args", i);
        Buf g = { 0 };
        rc = grammar_json_schema_to_gbnf(ps, root, &g, err);
        json_decref(ps);
        if (rc < 0) {
            buf_free(&g);
            char m[2 * sizeof err->msg];
            snprintf(m, sizeof m, "tools: parameters of \"%.100s\": %s", tn, err->msg);
            m[sizeof err->msg - 1] = 0;
        memcpy(err->msg, m, sizeof err->msg);
            break;
        }
        /* the rules of this tool's schema, each name prefixed so tools do not collide */
        char pfx[32];
        snprintf(pfx, sizeof pfx, "t%zu-", i);
        prefix_rules(&b, g.p, g.n, pfx, root);
        buf_free(&g);
        /* the call: what tool_parse.h reads back */
        json_t *nm = json_string(tn);
        char *nj = nm ? dump(nm) : NULL;
        json_decref(nm);
        if (!nj) { rc = ERR(err, 503, "out of memory"); break; }
        buf_printf(&b, "t%zu-call ::= \"<tool_call>\\n{\\\"name\\\": ", i);
        for (const char *p = nj; *p; p++) {
            if (*p == '"' || *p == '\\') buf_printf(&b, "\\%c", *p);
            else buf_append(&b, p, 1);
        }
        free(nj);
        buf_printf(&b, ", \\\"arguments\\\": \" t%zu-args \"}\\n</tool_call>\"\n", i);
        buf_printf(&calls, "%st%zu-call", n_calls ? " | " : "", i);
        n_calls++;
    }
    if (rc == 0 && n_calls == 0) rc = ERR(err, 400, "tool_choice: no tool named \"%s\" in tools", name ? name : "");
    if (rc == 0) {
        if (name || !parallel) buf_printf(&b, "root ::= %s\n", calls.p);
        else buf_printf(&b, "root ::= ( %s ) ( \"\\n\" ( %s ) )*\n", calls.p, calls.p);
        rc = structured_grammar(s, GRAMMAR_GBNF, b.p, b.n, out, err);
        if (rc < 0 && err->code == 400) /* our own text: a schema the engine refused after all */
            named(err, "tools", rc);
    }
    buf_free(&b);
    buf_free(&calls);
    return rc;
}

/* tool_choice: 0 (nothing forced), 1 (grammar set), <0 error. */
static int tool_choice(Server *s, json_t *body, int tools_on, Grammar **out, Err *err) {
    json_t *tc = json_object_get(body, "tool_choice");
    if (!tc || json_is_null(tc) || json_is_string(tc)) {
        const char *v = tc && json_is_string(tc) ? json_string_value(tc) : "auto";
        if (!strcmp(v, "auto") || !strcmp(v, "none")) return 0;
        ENSURE(err, !strcmp(v, "required"), 400, "tool_choice: must be \"auto\", \"none\", \"required\" or "
               "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        ENSURE(err, tools_on, 400, "tool_choice: \"required\" needs tools and the server's tool-call parser "
               "(--tool-call-parser)");
        json_t *par = json_object_get(body, "parallel_tool_calls");
        ENSURE(err, !par || json_is_boolean(par) || json_is_null(par), 400, "parallel_tool_calls: must be a boolean");
        return structured_tool_grammar(s, json_object_get(body, "tools"), NULL, !json_is_false(par), out, err) < 0 ? -1 : 1;
    }
    json_t *fn = json_object_get(tc, "function");
    json_t *nm = json_is_object(fn) ? json_object_get(fn, "name") : json_object_get(tc, "name");
    ENSURE(err, json_is_object(tc) && json_is_string(nm), 400,
           "tool_choice: must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    ENSURE(err, tools_on, 400, "tool_choice: a named function needs tools and the server's tool-call parser "
           "(--tool-call-parser)");
    return structured_tool_grammar(s, json_object_get(body, "tools"), json_string_value(nm), 0, out, err) < 0 ? -1 : 1;
}

int structured_parse(Server *s, json_t *body, int chat, int tools_on, GenParams *p, Err *err) {
    p->grammar = NULL;
    const char *set_by = NULL;
    Grammar *g = NULL;
    int rc = 0;
#define ONE(name)                                                                                                 \
    do {                                                                                                          \
        if (g && set_by) {                                                                                        \
            grammar_unref(g);                                                                                     \
            return ERR(err, 400, "%s: only one structured-output constraint per request (%s is set too)", name,   \
                       set_by);                                                                                   \
        }                                                                                                         \
        set_by = name;                                                                                            \
    } while (0)
    json_t *v;
    if ((v = json_object_get(body, "response_format")) && !json_is_null(v)) {
        Grammar *x = NULL;
        if ((rc = response_format(s, v, &x, err)) < 0) return rc;
        if (x) { g = x; set_by = "response_format"; }
    }
    struct { const char *key; GrammarKind kind; int json; } guided[] = {
        { "guided_json", GRAMMAR_JSON_SCHEMA, 1 }, { "guided_regex", GRAMMAR_REGEX, 0 },
        { "guided_choice", GRAMMAR_CHOICE, 1 }, { "guided_grammar", GRAMMAR_GBNF, 0 },
    };
    for (size_t i = 0; i < sizeof guided / sizeof guided[0]; i++) {
        if (!(v = json_object_get(body, guided[i].key)) || json_is_null(v)) continue;
        Grammar *x = NULL;
        if (guided[i].kind == GRAMMAR_CHOICE && !json_is_array(v))
            rc = ERR(err, 400, "%s: must be a list of strings", guided[i].key);
        else rc = guided[i].json ? from_json(s, guided[i].kind, v, guided[i].key, &x, err)
                                 : from_string(s, guided[i].kind, v, guided[i].key, &x, err);
        if (rc < 0) { if (g) grammar_unref(g); return named(err, guided[i].key, rc); }
        if (g) { grammar_unref(x); ONE(guided[i].key); }
        g = x;
        set_by = guided[i].key;
    }
    if ((v = json_object_get(body, "guided_whitespace_pattern")) && !json_is_null(v)) {
        if (g) grammar_unref(g);
        return ERR(err, 400, "guided_whitespace_pattern: is not supported (JSON allows one space, or a newline and up to "
                   "24 spaces or tabs of indent, between tokens)");
    }
    if ((v = json_object_get(body, "structured_outputs")) && !json_is_null(v)) {
        if (!json_is_object(v)) { if (g) grammar_unref(g); return ERR(err, 400, "structured_outputs: must be an object"); }
        struct { const char *key; GrammarKind kind; int json; } so[] = {
            { "json", GRAMMAR_JSON_SCHEMA, 1 }, { "regex", GRAMMAR_REGEX, 0 }, { "choice", GRAMMAR_CHOICE, 1 },
            { "grammar", GRAMMAR_GBNF, 0 }, { "json_object", GRAMMAR_JSON_OBJECT, 0 },
        };
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (json_is_null(x)) continue;
            size_t i = 0;
            while (i < sizeof so / sizeof so[0] && strcmp(so[i].key, k) != 0) i++;
            if (i == sizeof so / sizeof so[0]) {
                if (!strcmp(k, "disable_any_whitespace") || !strcmp(k, "disable_additional_properties") ||
                    !strcmp(k, "disable_fallback") || !strcmp(k, "whitespace_pattern") || !strcmp(k, "structural_tag")) {
                    if (!strcmp(k, "whitespace_pattern") || !strcmp(k, "structural_tag")) {
                        if (g) grammar_unref(g);
                        return ERR(err, 400, "structured_outputs: \"%s\" is not supported", k);
                    }
                    continue; /* booleans whose meaning we always have (no fallback, no extra properties) */
                }
                if (g) grammar_unref(g);
                return ERR(err, 400, "structured_outputs: unknown field \"%s\" (json, regex, choice, grammar, json_object)", k);
            }
            Grammar *y = NULL;
            if (so[i].kind == GRAMMAR_JSON_OBJECT) {
                if (!json_is_true(x)) continue;
                rc = structured_grammar(s, GRAMMAR_JSON_OBJECT, "", 0, &y, err);
            } else if (so[i].kind == GRAMMAR_CHOICE && !json_is_array(x))
                rc = ERR(err, 400, "choice must be a list of strings");
            else rc = so[i].json ? from_json(s, so[i].kind, x, "structured_outputs", &y, err)
                                 : from_string(s, so[i].kind, x, "structured_outputs", &y, err);
            if (rc < 0) { if (g) grammar_unref(g); return named(err, "structured_outputs", rc); }
            if (g) { grammar_unref(y); ONE("structured_outputs"); }
            g = y;
            set_by = "structured_outputs";
        }
    }
    if (chat) {
        Grammar *x = NULL;
        rc = tool_choice(s, body, tools_on, &x, err);
        if (rc < 0) { if (g) grammar_unref(g); return rc; }
        if (rc == 1) {
            if (g) { grammar_unref(x); ONE("tool_choice"); }
            g = x;
        }
    }
#undef ONE
    p->grammar = g;
    return 0;
}
