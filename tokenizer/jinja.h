/*
 * jinja.h - internals of the chat-template interpreter: tokens, the AST
 * and the helpers shared by the parser (jinja_parse.c), the evaluator
 * (jinja_eval.c) and the value printers (jinja_value.c). Values are jansson
 * json_t (NULL = Jinja's Undefined). Not a public API: see chat_template.h.
 */
#ifndef SAMPLER_JINJA_H
#define SAMPLER_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "chat_template.h"
#include "check.h"

/* ---- AST ---- */
typedef enum {
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NEG, N_POS, N_NOT,
    N_BIN, N_AND, N_OR, N_COND, N_LIST, N_DICT,
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SET_ATTR, N_BREAK, N_CONTINUE, N_BODY
} NodeKind;

typedef enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_EQ, OP_NE, OP_LT,
               OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN } BinOp;

typedef struct Node Node;
struct Node {
    NodeKind kind;
    int line;
    char *name;        /* NAME, ATTR attr, CALL/FILTER/TEST name, SET target, SET_ATTR attr, FOR targets "a,b" */
    json_t *lit;       /* LIT value, TEXT string */
    Node *a, *b, *c;   /* operands; FOR: a iter, b filter; SET: a value; SET_ATTR: a value, name attr, c=obj name node */
    BinOp op;
    bool negate;       /* TEST: "is not" */
    Node **kids; int n_kids;      /* args, list items, dict keys+values, body statements, IF conditions */
    char **kw; Node **kwv; int n_kw; /* keyword arguments */
    Node **bodies; int n_bodies;  /* IF: one per branch (+ else); FOR: body, else */
    char **targets; int n_targets;/* FOR loop variables */
};

/* Parse a template into a N_BODY tree; NULL with e filled ("line N: ..."). */
Node *jinja_parse(const char *src, Err *e);
void jinja_node_free(Node *n);

/* ---- rendering state shared by jinja_eval.c and jinja_builtins.c ---- */
typedef struct StrBuf { char *s; size_t n, cap; } StrBuf;
typedef struct Render {
    StrBuf out;
    json_t *frames[256]; int n_frames;
    json_t *undef;             /* stored for variables set to Undefined */
    json_t *ns[64]; int n_ns;  /* objects made by namespace() */
    Err *e;
    bool failed;
    int ctl;                   /* 1 break, 2 continue */
    long steps;                /* statements run, against MAX_STEPS */
    uint64_t made;             /* work units of the values built so far, against MAX_WORK */
} Render;

typedef struct Args { json_t *pos[8]; int n; char *kw[8]; json_t *kwv[8]; int nkw; } Args;

/* Budgets that stop a pathological template instead of the process. */
#define JINJA_MAX_STEPS 10000000L
#define JINJA_MAX_BYTES (64u << 20)
#define JINJA_MAX_ITEMS 1000000u
/* The whole render's budget for building values by operators (a byte of a
 * string is a unit, an item of a list JINJA_ITEM_UNITS): each value is bounded
 * by MAX_BYTES / MAX_ITEMS, and this bounds how many such values a template
 * may build (`x * 1000000` in a loop), so a hostile template costs ~a second. */
#define JINJA_MAX_WORK (1ull << 30)
#define JINJA_ITEM_UNITS 64u
/* Fails (and returns true) if a value of n bytes or items would exceed the budget. */
bool jtoo_big(Render *r, int line, size_t n, size_t limit);
/* jtoo_big for a value an operator builds, also charged to the render's
 * MAX_WORK: n bytes (limit MAX_BYTES) or n items (limit MAX_ITEMS). */
bool jmake(Render *r, int line, size_t n, size_t limit);
/* Record a render error (400) once; returns NULL for convenience. */
/* Evaluate an expression: a new reference, or NULL for Undefined (or error: r->failed). */
json_t *jeval(Render *r, Node *n);
json_t *jfail(Render *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
json_t *jstr_new(const char *s, size_t n);
json_t *jsb_take(StrBuf *b);          /* the buffer as a string value; frees b */
json_t *jto_str(json_t *v);           /* Python str(v) */
size_t jn_chars(const char *s, size_t n);
int32_t jnext_cp(const char *s, size_t n, size_t *i);
bool jpy_space(int32_t c);
void jput_cp(StrBuf *b, int32_t cp);
size_t *jcp_offsets(const char *s, size_t n, size_t *count); /* byte offset of each code point, + end */
bool jis_ns(Render *r, json_t *v);
json_t *jiter_list(Render *r, int line, json_t *v);  /* list(v): chars, keys or items */
json_t *jstr_case(json_t *s, int mode);               /* 0 lower 1 upper 2 title 3 capitalize */
void jargs_eval(Render *r, Node *n, Args *a);
void jargs_free(Args *a);
json_t *jargs_get(Args *a, int i, const char *name, bool *found); /* positional i or keyword; borrowed */
json_t *jcall_method(Render *r, Node *n, json_t *obj, Args *a);
json_t *jcall_func(Render *r, Node *n, Args *a);
json_t *japply_filter(Render *r, int line, const char *name, json_t *v, Args *a);
int japply_test(Render *r, int line, const char *name, json_t *v, Args *a, int first_arg); /* 1, 0, -1 error */

/* Render root with the variables of context (copied, not modified). */
int jinja_render(Node *root, json_t *context, char **out, Err *e);

/* ---- values (jinja_value.c) ---- */
void sb_put(StrBuf *b, const char *s, size_t n);
void sb_puts(StrBuf *b, const char *s);
void sb_putc(StrBuf *b, char c);

bool jv_truthy(json_t *v);
/* Python str(v) appended to b (Undefined prints nothing). */
void jv_str(StrBuf *b, json_t *v);
void jv_repr(StrBuf *b, json_t *v);
/* Python float repr ("0.1", "1e+16", "1.0"). */
void jv_float(StrBuf *b, double d);
/* json.dumps(v, ensure_ascii, indent (<0: none), separators, sort_keys); -1 if not serializable. */
int jv_json(StrBuf *b, json_t *v, bool ensure_ascii, int indent, const char *item_sep, const char *key_sep,
            bool sort_keys, int depth);
bool jv_equal(json_t *a, json_t *b);
/* Python ordering of numbers or strings; -2 if not comparable. */
int jv_cmp(json_t *a, json_t *b);
const char *jv_type_name(json_t *v);

#endif
