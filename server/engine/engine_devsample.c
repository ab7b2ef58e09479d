/*
 * engine_devsample.c - the engine's state for sampling on the device
 * (EngineBackend.sample_launch / sample_wait): one row builder per launch
 * slot (a step's rows stay readable until it ends, while the next step's are
 * built), sized at engine creation by engine_devsample_caps. The results and
 * the packed kept sets are the backend's (pinned, per slot).
 * Host memory: DEV_SAMPLE_SLOTS * (max_running_seqs * ~100 bytes + the
 * builder's lists, 5 * 4 bytes per list entry, and bitsets).
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
    if (!e->be.sample_launch || !e->be.sample_wait || !e->be.fetch_logits ||
        e->cfg.device_sampling == ENGINE_DEVSAMPLE_OFF)
        return;
    DevSampleCaps caps;
    engine_devsample_caps(&e->cfg, e->mc.vocab, &caps);
    EngineDevSample *d = xcalloc(1, sizeof *d);
    for (int k = 0; k < DEV_SAMPLE_SLOTS; k++) d->b[k] = dev_sample_builder_create(&caps);
    e->dev = d;
    if (e->cfg.verbose) log_info("engine: sampling on the device (%d rows)", caps.max_rows);
}

void engine_devsample_free(Engine *e) {
    EngineDevSample *d = e->dev;
    if (!d) return;
    for (int k = 0; k < DEV_SAMPLE_SLOTS; k++) dev_sample_builder_free(d->b[k]);
    free(d);
    e->dev = NULL;
}
