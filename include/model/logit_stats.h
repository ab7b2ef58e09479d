/*
 * logit_stats.h - how far one set of logits is from a reference: per-row
 * KL(ref || other) in nats, top-1 agreement, max |difference|. Used by the
 * precision tests and the precision report (bench), not on request paths.
 */
#ifndef SAMPLER_LOGIT_STATS_H
#define SAMPLER_LOGIT_STATS_H

typedef struct LogitStats {
    double mean_kl, max_kl;  /* over rows */
    double top1;             /* fraction of rows with the same argmax */
    double max_abs;          /* max |ref - other| over all elements (NaN propagates) */
} LogitStats;

/* ref, other: [rows, vocab] f32 */
LogitStats logit_stats(const float *ref, const float *other, int rows, int vocab);

#endif
