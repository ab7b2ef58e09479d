/*
 * logit_stats.c - KL / top-1 / max-abs between two logit matrices (see
 * logit_stats.h). Double precision so the statistic itself adds no error.
 */
#include "logit_stats.h"

#include <math.h>

LogitStats logit_stats(const float *ref, const float *other, int rows, int vocab) {
    LogitStats s = {0};
    for (int t = 0; t < rows; t++) {
        const float *a = ref + (long)t * vocab, *b = other + (long)t * vocab;
        double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0, kl = 0;
        int ia = 0, ib = 0;
        for (int i = 0; i < vocab; i++) {
            if (a[i] > ma) { ma = a[i]; ia = i; }
            if (b[i] > mb) { mb = b[i]; ib = i; }
            double d = fabs((double)a[i] - b[i]);
            if (!(d <= s.max_abs)) s.max_abs = d;
        }
        for (int i = 0; i < vocab; i++) { za += exp(a[i] - ma); zb += exp(b[i] - mb); }
        double lza = log(za), lzb = log(zb);
        for (int i = 0; i < vocab; i++) {
            double la = a[i] - ma - lza, lb = b[i] - mb - lzb;
            kl += exp(la) * (la - lb);
        }
        s.mean_kl += kl / rows;
        if (!(kl <= s.max_kl)) s.max_kl = kl;
        s.top1 += (ia == ib) / (double)rows;
    }
    return s;
}
