/*
 * delta_plan.h - the plan's layout, private to server/delta: shared by the
 * container path (delta_apply.c) and whole-tensor replacement
 * (delta_replace.c), so both commit, verify and undo through the same code.
 * Not a public header: callers use delta.h.
 */
#ifndef SAMPLER_DELTA_PLAN_H
#define SAMPLER_DELTA_PLAN_H

#include "delta.h"

typedef struct PlanT {
    const DeltaEntry *e;
    uint8_t *data;     /* [numel * es] the live tensor */
    int es;
    DeltaDecoded d;    /* new values; after commit's swap, the old ones (the undo log) */
    Err err;
    int rc;
} PlanT;

struct DeltaPlan {
    DeltaFile *f;      /* a parsed container, or entries built by delta_prepare_replace */
    int noop, committed;
    int n;
    PlanT *t;          /* [n] */
};

/* Bind every entry of p->f to the live tensor via tgt->lookup (checks name,
 * dtype, shape against wv and the storage; refuses overlapping storage). 422. */
int delta_plan_bind(DeltaPlan *p, const DeltaTarget *tgt, const WeightVersion *wv, Err *err);
/* XXH3 of t's tensor as it would be after the update, without writing it;
 * *n_diff = elements whose bits change. */
uint64_t delta_predicted_hash(const PlanT *t, int64_t *n_diff);

#endif
