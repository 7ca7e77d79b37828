/* model_family.c -- the registry of model families (model_family.h,
 * chat_spec.h): which family a file or a tokenizer belongs to, and the
 * refusal line for an engine option a family does not support. */
#include "models/model_family.h"

#include "format/gguf.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <string.h>

static const ds4_family *const FAMILIES[] = {&ds4_family_dsv4, &ds4_family_glm};

/* A file no family claims goes to DeepSeek V4, whose binder names the first
 * thing missing ("not a DeepSeek V4 GGUF: ..."). */
const ds4_family *ds4_family_detect(const struct ds4_gguf *g) {
    for (size_t i = 0; i < sizeof FAMILIES / sizeof *FAMILIES; i++)
        if (ds4_gguf_arch_is(g, FAMILIES[i]->arch)) return FAMILIES[i];
    return &ds4_family_dsv4;
}

bool ds4_family_refuse(const ds4_family *f, const ds4_engine_params *p, char *err, size_t errlen) {
    if (p->dist.tp && p->layers) {
        snprintf(err, errlen, "--layers does not go with --tensor-parallel: each of its two processes holds every "
                              "layer (and half of every layer's routed experts)");
        return false;
    }
    const char *refused = p->ssd.enabled && !(f->features & DS4_FEAT_SSD_STREAMING) ? "--ssd-streaming"
                          : p->numerics > 0 && !(f->features & DS4_FEAT_NUMERICS)
                              ? "--numerics ds4 (DeepSeek V4's FP8/FP4 storage simulation)"
                          : p->gpu.backend == DS4_BACKEND_CUDA && !(f->features & DS4_FEAT_CUDA) ? "--cuda"
                          : p->layers && !(f->features & DS4_FEAT_LAYERS) ? "--layers"
                          : p->dist.tp && !(f->features & DS4_FEAT_TP) ? "--tensor-parallel"
                          /* a family with tensor parallelism takes its two roles */
                          : p->dist.role != DS4_DIST_NONE && !(f->features & DS4_FEAT_ROLE) &&
                                    !(p->dist.tp && (f->features & DS4_FEAT_TP))
                              ? "--role"
                                                                                           : NULL;
    if (!refused) return true;
    snprintf(err, errlen, "%s: %s %s", p->model_path, refused, f->refusal);
    return false;
}

const ds4_chat_spec *ds4_chat_spec_for(const struct ds4_tokenizer *t) {
    return t && ds4_tokenizer_family(t) == DS4_TOK_FAMILY_GLM ? &ds4_chat_spec_glm : &ds4_chat_spec_dsv4;
}

bool ds4_chat_alias_thinking(const char *model, bool *thinking) {
    static const struct { const char *model; bool thinking; } ALIASES[] = {
        {"deepseek-chat", false}, {"deepseek-reasoner", true}};
    for (size_t i = 0; i < sizeof ALIASES / sizeof *ALIASES; i++)
        if (!strcmp(model, ALIASES[i].model)) { *thinking = ALIASES[i].thinking; return true; }
    return false;
}
