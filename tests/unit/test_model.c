/* test_model.c -- DS4 binding: the config read from the converted tiny model
 * equals its transformers config.json; mutated files (a dropped tensor, a
 * wrong shape or type, a missing key, another architecture) fail with one
 * "not a DeepSeek V4 GGUF: ..." line naming the problem; the released Flash
 * type mixes (IQ2_XXS/Q2_K or Q4_K experts, Q8_0 attention, F16 HC/compressor/
 * indexer) bind and run. Variants are rewritten from $BUILD/ds4tiny/A-f32.gguf
 * with the shared layout table (ds4_layout) for keys, names and mix types. */
#include "check.h"
#include "models/dsv4/ds4_layout.h"
#include "engine/engine.h"
#include "format/gguf.h"
#include "models/dsv4/model.h"
#include "kernels/quant.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *src_path(void) {
    static char p[512];
    const char *b = getenv("BUILD"), *d = getenv("DS4_TINY_GGUF_DIR");
    if (d) snprintf(p, sizeof p, "%s/A-f32.gguf", d);
    else snprintf(p, sizeof p, "%s/ds4tiny/A-f32.gguf", b ? b : "build");
    return p;
}

/* ---- config vs the transformers config ---- */

static int jint(const cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valueint; }
static double jnum(const cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valuedouble; }

static void test_config(const ds4_model *m) {
    FILE *f = fopen("tests/fixtures/ds4tiny/A/config.json", "rb");
    CHECK(f != NULL, "config.json");
    if (!f) return;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    const ds4_config *c = &m->cfg;
    CHECK(c->n_layer == jint(j, "num_hidden_layers"), "layers %d", c->n_layer);
    CHECK(c->n_embd == jint(j, "hidden_size") && c->n_vocab == jint(j, "vocab_size"), "embd/vocab");
    CHECK(c->n_head == jint(j, "num_attention_heads") && c->head_dim == jint(j, "head_dim"), "heads");
    CHECK(c->n_rot == (int)(jint(j, "head_dim") * jnum(j, "partial_rotary_factor")), "rot %d", c->n_rot);
    CHECK(c->q_lora == jint(j, "q_lora_rank") && c->o_lora == jint(j, "o_lora_rank") &&
          c->o_groups == jint(j, "o_groups"), "lora/groups");
    CHECK(c->window == jint(j, "sliding_window"), "window %d", c->window);
    CHECK(c->n_idx_head == jint(j, "index_n_heads") && c->idx_head_dim == jint(j, "index_head_dim") &&
          c->idx_topk == jint(j, "index_topk"), "indexer");
    CHECK(c->n_hc == jint(j, "hc_mult") && c->sinkhorn_iters == jint(j, "hc_sinkhorn_iters"), "hc");
    CHECK(c->n_expert == jint(j, "n_routed_experts") && c->n_expert_used == jint(j, "num_experts_per_tok") &&
          c->n_ff_exp == jint(j, "moe_intermediate_size"), "experts");
    CHECK(fabs(c->expert_weights_scale - jnum(j, "routed_scaling_factor")) < 1e-6, "scale");
    const cJSON *lt = cJSON_GetObjectItem(j, "layer_types"), *mt = cJSON_GetObjectItem(j, "mlp_layer_types");
    const cJSON *rates = cJSON_GetObjectItem(j, "compress_rates");
    int hash = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const char *kind = cJSON_GetArrayItem(lt, l)->valuestring;
        int want = strcmp(kind, "sliding_attention") ? jint(rates, kind) : 0;
        CHECK(c->compress_ratio[l] == want, "layer %d ratio %d want %d", l, c->compress_ratio[l], want);
        hash += !strcmp(cJSON_GetArrayItem(mt, l)->valuestring, "hash_moe");
        CHECK(fabsf(c->clamp_exp[l] - (float)jnum(j, "swiglu_limit")) < 1e-6f &&
              fabsf(c->clamp_shexp[l] - (float)jnum(j, "swiglu_limit")) < 1e-6f, "clamps layer %d", l);
        const ds4_layer *L = &m->layers[l];
        CHECK((L->comp_kv.data != NULL) == (want != 0), "compressor presence layer %d", l);
        CHECK((L->idx_q_b.data != NULL) == (want == 4), "indexer presence layer %d", l);
        CHECK((L->tid2eid != NULL) == (l < hash), "hash routing layer %d", l);
        CHECK((L->exp_probs_b != NULL) == (l >= hash), "router bias layer %d", l);
    }
    CHECK(c->n_hash_layer == hash, "hash layers %d want %d", c->n_hash_layer, hash);
    const cJSON *rc = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "rope_parameters"), "compress");
    CHECK(fabs(c->compress_rope_base - jnum(rc, "rope_theta")) < 1e-3 && fabs(c->yarn_factor - jnum(rc, "factor")) < 1e-6 &&
          c->yarn_orig_ctx == (uint64_t)jint(rc, "original_max_position_embeddings"), "yarn");
    cJSON_Delete(j);
}

/* ---- rewriting the source model with one change ---- */

typedef struct {
    const char *drop;            /* tensor to leave out */
    const char *reshape;         /* tensor whose ne[1] is decremented (ne[0] if 1-D) */
    const char *retype;          /* tensor written as I32 bits */
    int mix;                     /* -1, or a ds4_mix whose matrix types are applied */
    bool no_keys, wrong_arch;
    void (*edit)(ds4_hparams *); /* changes the metadata written (tensors stay) */
} mutation;

/* Type the mix gives `name`, found through the shared layout table. */
static int mix_type(const ds4_hparams *hp, const char *name, int mix) {
    char buf[160];
    for (int id = 0; id < DS4_T_COUNT; id++)
        for (int l = 0; l < (int)hp->n_layer; l++) {
            if (!ds4_tensor_present(hp, (enum ds4_tensor_id)id, l)) continue;
            ds4_tensor_name((enum ds4_tensor_id)id, l, buf, sizeof buf);
            if (!strcmp(buf, name)) return (int)ds4_tensor_type((enum ds4_tensor_id)id, (enum ds4_mix)mix);
        }
    return -1;
}

static bool rewrite(const char *dst, const mutation *mu) {
    char err[256];
    ds4_gguf *g = ds4_gguf_open(src_path(), err, sizeof err);
    if (!g) { fprintf(stderr, "%s\n", err); return false; }
    ds4_hparams hp;
    if (ds4_hparams_read(g, &hp, err, sizeof err)) { fprintf(stderr, "%s\n", err); ds4_gguf_close(g); return false; }
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    if (mu->wrong_arch) ds4_gguf_w_str(w, "general.architecture", "llama");
    else if (mu->no_keys) { ds4_gguf_w_str(w, "general.architecture", "deepseek4"); ds4_gguf_w_u32(w, "deepseek4.block_count", 6); }
    else {
        if (mu->edit) mu->edit(&hp);
        ds4_hparams_write(w, &hp);
    }
    size_t nt = ds4_gguf_n_tensors(g);
    void **owned = calloc(nt, sizeof(void *));
    for (size_t i = 0; i < nt; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        char name[160];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (mu->drop && !strcmp(name, mu->drop)) continue;
        uint64_t ne[DS4_GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof ne);
        uint32_t type = t->type;
        const void *data = t->data;
        if (mu->reshape && !strcmp(name, mu->reshape)) ne[t->n_dims > 1 ? 1 : 0]--;
        if (mu->retype && !strcmp(name, mu->retype)) type = DS4_TYPE_I32;
        int want = mu->mix >= 0 ? mix_type(&hp, name, mu->mix) : -1;
        if (want >= 0 && (uint32_t)want != type && t->type == DS4_TYPE_F32) {
            const int64_t row = (int64_t)ne[0], rows = (int64_t)(t->n_elements / ne[0]);
            size_t rb = ds4_type_row_bytes((uint32_t)want, (uint64_t)row);
            char *q = malloc(rb * (size_t)rows);
            for (int64_t r = 0; r < rows; r++)
                ds4_quantize_row((uint32_t)want, (const float *)t->data + r * row, q + (size_t)r * rb, row, NULL);
            owned[i] = q;
            data = q;
            type = (uint32_t)want;
        }
        ds4_gguf_w_tensor(w, name, type, t->n_dims, ne, data);
    }
    int rc = ds4_gguf_writer_write_file(w, dst, NULL, NULL, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    ds4_gguf_writer_free(w);
    for (size_t i = 0; i < nt; i++) free(owned[i]);
    free(owned);
    ds4_gguf_close(g);
    return rc == 0;
}

/* Binds dst; returns the model (NULL with err filled on failure). */
static ds4_model *bind(const char *path, ds4_gguf **g, char *err, size_t errlen) {
    *g = ds4_gguf_open(path, err, errlen);
    if (!*g) return NULL;
    ds4_model *m = ds4_model_bind(*g, err, errlen);
    if (!m) { ds4_gguf_close(*g); *g = NULL; }
    return m;
}

static void expect_error(const char *tmp, mutation mu, const char *needle) {
    char err[512] = "";
    ds4_gguf *g;
    CHECK(rewrite(tmp, &mu), "rewrite for %s", needle);
    ds4_model *m = bind(tmp, &g, err, sizeof err);
    CHECK(m == NULL, "mutated file (%s) must not bind", needle);
    CHECK(!strncmp(err, "not a DeepSeek V4 GGUF: ", 24) && strstr(err, needle), "error \"%s\" should name %s", err,
          needle);
    if (m) { ds4_model_free(m); ds4_gguf_close(g); }
}

/* Metadata the forward pass does not implement (crafted from the valid
 * file, one field at a time): each is refused with a line naming the key. */
static void beta_fast_zero(ds4_hparams *hp) { hp->yarn_beta_fast = 0; }
static void beta_slow_negative(ds4_hparams *hp) { hp->yarn_beta_slow = -1; }
static void betas_reversed(ds4_hparams *hp) { float f = hp->yarn_beta_fast; hp->yarn_beta_fast = hp->yarn_beta_slow; hp->yarn_beta_slow = f; }
static void yarn_factor_below_one(ds4_hparams *hp) { hp->yarn_factor = 0.5f; }
static void yarn_orig_ctx_zero(ds4_hparams *hp) { hp->yarn_orig_ctx = 0; }
static void compress_rope_base_one(ds4_hparams *hp) { hp->compress_rope_base = 1; }
static void indexer_top_k_zero(ds4_hparams *hp) { hp->idx_topk = 0; }
static void expert_top_k_zero(ds4_hparams *hp) { hp->n_expert_used = 0; }
static void ratio_one(ds4_hparams *hp) { hp->compress_ratio[2] = 1; }
static void ratio_huge(ds4_hparams *hp) { hp->compress_ratio[3] = 1u << 20; }
static void kind_window_compressed(ds4_hparams *hp) { hp->attn_kind[2] = DS4_ATTN_WINDOW; }
static void kind_compressed_window(ds4_hparams *hp) { hp->attn_kind[0] = DS4_ATTN_HCA; }
static void kind_out_of_range(ds4_hparams *hp) { hp->attn_kind[3] = 7; }
/* The kind, not the ratio, decides the compressor's width: a ratio-4 layer
 * declared HCA wants a D-wide (not 2D) compressor, a ratio-16 one declared
 * CSA a 2D-wide one, so the unchanged tensors no longer fit. */
static void kind_hca_at_4(ds4_hparams *hp) { hp->attn_kind[2] = DS4_ATTN_HCA; }
static void kind_csa_at_16(ds4_hparams *hp) { hp->attn_kind[3] = DS4_ATTN_CSA; }

static void test_unsupported_metadata(const char *tmp) {
    static const struct { void (*edit)(ds4_hparams *); const char *needle; } cases[] = {
        {beta_fast_zero, "yarn_beta_fast = 0, must be > 0"},
        {beta_slow_negative, "yarn_beta_slow = -1, must be > 0"},
        {betas_reversed, "the pair is reversed"},
        {yarn_factor_below_one, "rope.scaling.factor = 0.5, must be >= 1"},
        {yarn_orig_ctx_zero, "original_context_length = 0"},
        {compress_rope_base_one, "compress_rope_freq_base = 1, must be > 1"},
        {indexer_top_k_zero, "indexer.top_k = 0 out of range"},
        {expert_top_k_zero, "expert_used_count = 0 out of range"},
        {ratio_one, "compress_ratios[2] = 1; supported"},
        {ratio_huge, "compress_ratios[3] = 1048576; supported"},
        {kind_window_compressed, "layer_kinds[2] = 0 does not fit compress ratio 4"},
        {kind_compressed_window, "layer_kinds[0] = 2 does not fit compress ratio 0"},
        {kind_out_of_range, "layer_kinds[3] is not 0 (window), 1 (CSA) or 2 (HCA)"},
        {kind_hca_at_4, "blk.2.attn_compressor_ape.weight has shape"},
        {kind_csa_at_16, "blk.3.attn_compressor_ape.weight has shape"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(tmp, (mutation){.edit = cases[i].edit, .mix = -1}, cases[i].needle);
}

/* The released type mixes at tiny dims: bind, report bits, and run. */
static void test_mix(const char *tmp, int mix, int bits) {
    char err[512];
    mutation mu = {.mix = mix};
    CHECK(rewrite(tmp, &mu), "rewrite mix %s", ds4_mix_name((enum ds4_mix)mix));
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = tmp;
    p.n_threads = 2;
    p.quiet = true;
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    CHECK(e != NULL, "mix %s: %s", ds4_mix_name((enum ds4_mix)mix), err);
    if (!e) return;
    CHECK(ds4_engine_expert_bits(e) == bits, "expert bits %d", ds4_engine_expert_bits(e));
    ds4_session *s = ds4_session_new(e, 32, err, sizeof err);
    int32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = (i * 37 + 3) % ds4_engine_n_vocab(e);
    CHECK(ds4_session_prefill(s, toks, 20, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    const float *lg = ds4_session_logits(s);
    bool finite = true;
    for (int v = 0; v < ds4_engine_n_vocab(e); v++) finite &= isfinite(lg[v]);
    CHECK(finite, "mix %s logits finite", ds4_mix_name((enum ds4_mix)mix));
    ds4_session_free(s);
    ds4_engine_free(e);
}

int main(void) {
    ds4_quant_init();
    char err[512];
    ds4_gguf *g;
    ds4_model *m = bind(src_path(), &g, err, sizeof err);
    CHECK(m != NULL, "bind %s: %s", src_path(), err);
    if (!m) return check_done("test_model");
    test_config(m);
    CHECK(ds4_model_expert_bits(m) == 32, "f32 experts");
    ds4_model_free(m);
    ds4_gguf_close(g);

    char tmp[64];
    snprintf(tmp, sizeof tmp, "/tmp/ds4-test-model-%d.gguf", (int)getpid());
    expect_error(tmp, (mutation){.drop = "blk.3.attn_compressor_gate.weight", .mix = -1}, "missing tensor blk.3.attn_compressor_gate.weight");
    expect_error(tmp, (mutation){.drop = "blk.1.ffn_gate_tid2eid.weight", .mix = -1}, "blk.1.ffn_gate_tid2eid.weight");
    expect_error(tmp, (mutation){.drop = "output.weight", .mix = -1}, "missing tensor output.weight");
    expect_error(tmp, (mutation){.reshape = "blk.4.indexer.attn_q_b.weight", .mix = -1}, "blk.4.indexer.attn_q_b.weight has shape");
    expect_error(tmp, (mutation){.reshape = "blk.0.attn_sinks.weight", .mix = -1}, "blk.0.attn_sinks.weight has shape");
    expect_error(tmp, (mutation){.retype = "blk.2.attn_q_b.weight", .mix = -1}, "blk.2.attn_q_b.weight has type I32");
    expect_error(tmp, (mutation){.retype = "blk.5.ffn_norm.weight", .mix = -1}, "blk.5.ffn_norm.weight must be");
    expect_error(tmp, (mutation){.no_keys = true, .mix = -1}, "deepseek4.embedding_length");
    expect_error(tmp, (mutation){.wrong_arch = true, .mix = -1}, "architecture");

    test_unsupported_metadata(tmp);
    test_mix(tmp, DS4_MIX_Q2, 2);
    test_mix(tmp, DS4_MIX_Q4, 4);
    unlink(tmp);
    return check_done("test_model");
}
