/*
 * engine_devsample.c - the engine's state for sampling on the device
 * (EngineBackend.sample): the row builder, the results and one host buffer of
 * kept ids per row, all sized at engine creation by engine_devsample_caps.
 * Host memory: max_running_seqs * (vocab * 4 + ~200) bytes plus the
 * builder's lists (5 * 4 bytes per list entry) and bitsets.
 *
 * Not here: when a step samples on the device (engine_step.c), the rows
 * (sampling_device.c), the kernels (kernels/cuda/sampling.cu).
 */
#include <stdlib.h>

#include "engine_internal.h"
#include "log.h"

void engine_devsample_caps(const EngineConfig *c, int vocab, DevSampleCaps *caps) {
    int words = (vocab + 63) / 64;
    caps->max_rows = c->max_running_seqs;
    caps->vocab = vocab;
    long list = (long)c->max_running_seqs * ((long)c->max_model_len + 64);
    caps->max_list = list > (1l << 28) ? 1 << 28 : (int)list;
    caps->max_words = c->max_running_seqs * 2 * words;
}

void engine_devsample_init(Engine *e) {
    if (!e->be.sample || !e->be.fetch_logits || e->cfg.device_sampling == ENGINE_DEVSAMPLE_OFF) return;
    DevSampleCaps caps;
    engine_devsample_caps(&e->cfg, e->mc.vocab, &caps);
    EngineDevSample *d = xcalloc(1, sizeof *d);
    d->b = dev_sample_builder_create(&caps);
    d->out = xcalloc((size_t)caps.max_rows, sizeof *d->out);
    d->masks = xcalloc((size_t)caps.max_rows, sizeof *d->masks);
    d->mask_ptr = xcalloc((size_t)caps.max_rows, sizeof *d->mask_ptr);
    for (int i = 0; i < caps.max_rows; i++) d->masks[i] = xmalloc((size_t)e->mc.vocab * sizeof(int32_t));
    e->dev = d;
    if (e->cfg.verbose)
        log_info("engine: sampling on the device (%d rows, %.1f MiB of host mask buffers)", caps.max_rows,
                 (double)caps.max_rows * e->mc.vocab * 4 / 1048576.0);
}

void engine_devsample_free(Engine *e) {
    EngineDevSample *d = e->dev;
    if (!d) return;
    for (int i = 0; i < e->cfg.max_running_seqs; i++) free(d->masks[i]);
    free(d->masks);
    free(d->mask_ptr);
    free(d->out);
    dev_sample_builder_free(d->b);
    free(d);
    e->dev = NULL;
}
