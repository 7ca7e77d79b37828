/* ds4-convert -- HF DeepSeek V4 checkpoint (config.json + safetensors) to a
 * DS4-layout GGUF.
 *
 *   ds4-convert HF_DIR OUT.gguf --type f32|f16|q8_0|q2|q4
 *               [--imatrix FILE] [--vocab tokenizer.json [--vocab-added FILE]]
 *               [--name NAME] [--layers A:B|A:output]
 *               [--threads N (default: all CPUs)]
 *
 * Inputs. Hyperparameters come from HF_DIR/config.json (transformers'
 * DeepseekV4Config fields, legacy spellings included); nothing is defaulted to
 * Flash values. Tensors are found under any of three namings: the official
 * DeepSeek checkpoint ("layers.N.attn.wq_a.weight", FP8 E4M3 matrices with a
 * 128x128 block scale, FP4 E2M1 experts packed two per byte in I8/U8 with a
 * scale per 32 inputs, int64 tid2eid; scales are "<base>.scale" or
 * "<base>.weight_scale_inv", stored as F8_E8M0 or U8 exponents (2^(e-127)) or
 * as floats), transformers' save_pretrained
 * output (the official names under "model.", kv_norm saved as "attn.norm"),
 * and transformers' module names ("model.layers.N.self_attn.q_a_proj.weight",
 * merged experts.gate_up_proj).
 *
 * --mtp writes the MTP support file instead (ds4_layout.h: the model's keys,
 * the block named mtp.0.* and its projections, norms and HC merge), from the
 * checkpoint's "mtp.0." tensors (official names, or under "model."), for
 * ds4 --mtp.
 *
 * --layers writes a layer-range file (ds4_layout.h): only those layers'
 * tensors (the embedding with layer 0, the output head with "output") plus
 * the ds4.slice.* keys, as ds4-make-model --slice does; every tensor it holds
 * is byte-identical to the same tensor of the whole conversion.
 *
 * Output. The DS4 layout of ds4_layout.h with every deepseek4.* key. --type
 * picks the mix (ds4_layout.h): f32/f16 turn every float matrix into that
 * type; q8_0 keeps the released non-expert types (F16 embedding/HC/router/
 * compressor/indexer, Q8_0 attention/shared/head) with Q8_0 experts; q2/q4
 * are the released mixes. Norms, sinks, HC scale/base, router bias stay F32
 * and tid2eid I32 in every mix.
 *
 * IQ2_XXS needs per-column importance: from --imatrix (llama.cpp's formats,
 * entries named by GGUF tensor name with ne0 values per expert or one shared
 * vector: the GGUF "<name>.in_sum2" / "<name>.counts" pair, or the legacy
 * imatrix.dat), else Σ over rows of W² of that expert matrix. K-quants use
 * the imatrix when one is given.
 *
 * Tokenizer: --vocab (default HF_DIR/tokenizer.json when present), with
 * --vocab-added overlaying another file's added_tokens (the V4 specials over
 * the V3 base file); its token count must equal vocab_size. Without one the
 * GGUF has no tokenizer keys (the tiny oracle models have none).
 *
 * GLM 5.2: a config.json of transformers' GlmMoeDsaForCausalLM (model_type
 * glm_moe_dsa) gives the GLM layout of glm_layout.h instead: every glm-dsa.*
 * key (indexer.types from indexer_types, or from index_topk_freq /
 * index_skip_topk_offset), kv_b_proj split per head into attn_k_b
 * (transposed) and attn_v_b, experts stacked, the MTP block
 * (model.layers.<num_hidden_layers>.*) when the checkpoint has it. Mixes:
 * f32/f16 as above; q8_0, q2, q4 keep norms/router/indexer head weights F32
 * and every other matrix Q8_0, with Q8_0 / Q2_K / Q4_K routed experts. No
 * tokenizer is written for GLM yet.
 *
 * Memory: sources are mmapped; one output tensor and one source row block
 * are in RAM at a time.
 */
#include "options/cli_args.h"
#include "models/dsv4/ds4_layout.h"
#include "models/glm/glm_layout.h"
#include "format/gguf.h"
#include "models/dsv4/model.h"
#include "kernels/quant.h"
#include "format/safetensors.h"
#include "base/threadpool.h"
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("ds4-convert: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* ---------------------------------------------------------------- config.json */

static const cJSON *jget(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = jget(o, k);
    if (!cJSON_IsNumber(v)) die("config.json: missing number '%s'", k);
    return v->valuedouble;
}

static uint32_t ju32(const cJSON *o, const char *k) {
    double v = jnum(o, k);
    if (v < 0 || v > UINT32_MAX || v != floor(v)) die("config.json: '%s' is not a u32", k);
    return (uint32_t)v;
}

static uint32_t ju32_or(const cJSON *o, const char *k, uint32_t dflt) {
    return jget(o, k) ? ju32(o, k) : dflt;
}

/* YaRN settings live in rope_parameters.compress (current transformers) or in
 * rope_scaling (legacy and official configs). */
static const cJSON *yarn_object(const cJSON *cfg) {
    const cJSON *rp = jget(cfg, "rope_parameters");
    const cJSON *c = rp ? jget(rp, "compress") : NULL;
    if (cJSON_IsObject(c)) return c;
    if (cJSON_IsObject(rp) && jget(rp, "factor")) return rp;
    const cJSON *rs = jget(cfg, "rope_scaling");
    if (cJSON_IsObject(rs)) return rs;
    die("config.json: no YaRN parameters (rope_parameters.compress or rope_scaling)");
    return NULL;
}

/* transformers' layer_types name the kind of each layer (CSA: overlapping
 * compressor and indexer; HCA: plain compressor); the ratio per type comes
 * from compress_rates, the legacy compress_rate_csa/hca, else
 * DeepseekV4Config's own defaults (the config class applies them too), and
 * need not be 4 for CSA. */
static void layer_type(const cJSON *cfg, const char *type, uint32_t *ratio, uint32_t *kind) {
    const cJSON *rates = jget(cfg, "compress_rates");
    const bool csa = !strcmp(type, "compressed_sparse_attention");
    if (!strcmp(type, "sliding_attention")) { *ratio = 0; *kind = DS4_ATTN_WINDOW; return; }
    if (!csa && strcmp(type, "heavily_compressed_attention")) die("config.json: unknown layer type '%s'", type);
    *kind = csa ? DS4_ATTN_CSA : DS4_ATTN_HCA;
    if (cJSON_IsObject(rates) && cJSON_IsNumber(jget(rates, type))) *ratio = ju32(rates, type);
    else *ratio = csa ? ju32_or(cfg, "compress_rate_csa", 4) : ju32_or(cfg, "compress_rate_hca", 128);
    if (*ratio < 2) die("config.json: %s compresses by %u; a compressed layer needs a ratio >= 2", type, *ratio);
}

static cJSON *load_config(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) die("%s: %s", path, strerror(errno));
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) die("%s: cannot size the file", path);
    char *text = malloc((size_t)len + 1);
    if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) die("%s: read error", path);
    fclose(f);
    cJSON *cfg = cJSON_ParseWithLength(text, (size_t)len);
    free(text);
    if (!cJSON_IsObject(cfg)) die("%s: not a JSON object", path);
    return cfg;
}

/* The family: transformers' GlmMoeDsaForCausalLM (model_type glm_moe_dsa)
 * is GLM; anything else goes through the DeepSeek V4 reader, which names
 * what it misses. */
static bool config_is_glm(const cJSON *cfg) {
    const cJSON *mt = jget(cfg, "model_type"), *arch = jget(cfg, "architectures");
    if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "glm_moe_dsa")) return true;
    const cJSON *a;
    cJSON_ArrayForEach(a, arch)
        if (cJSON_IsString(a) && !strcmp(a->valuestring, "GlmMoeDsaForCausalLM")) return true;
    return false;
}

static void read_config(cJSON *cfg, ds4_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->n_layer = ju32(cfg, "num_hidden_layers");
    if (hp->n_layer == 0 || hp->n_layer > DS4_MAX_LAYERS) die("num_hidden_layers %u unsupported", hp->n_layer);
    hp->n_ctx_train = ju32(cfg, "max_position_embeddings");
    hp->n_embd = ju32(cfg, "hidden_size");
    hp->n_vocab = ju32(cfg, "vocab_size");
    hp->n_head = ju32(cfg, "num_attention_heads");
    hp->n_head_kv = ju32_or(cfg, "num_key_value_heads", 1);
    hp->key_length = hp->value_length = ju32(cfg, "head_dim");
    if (jget(cfg, "qk_rope_head_dim")) hp->n_rot = ju32(cfg, "qk_rope_head_dim");
    else hp->n_rot = (uint32_t)lround(jnum(cfg, "partial_rotary_factor") * hp->key_length);
    hp->q_lora_rank = ju32(cfg, "q_lora_rank");
    hp->o_lora_rank = ju32(cfg, "o_lora_rank");
    hp->o_groups = ju32(cfg, "o_groups");
    hp->sliding_window = ju32(cfg, "sliding_window");

    const cJSON *lt = jget(cfg, "layer_types"), *cr = jget(cfg, "compress_ratios");
    if (cJSON_IsArray(lt)) {
        if ((uint32_t)cJSON_GetArraySize(lt) < hp->n_layer) die("config.json: layer_types too short");
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const cJSON *t = cJSON_GetArrayItem(lt, (int)l);
            if (!cJSON_IsString(t)) die("config.json: layer_types[%u] is not a string", l);
            layer_type(cfg, t->valuestring, &hp->compress_ratio[l], &hp->attn_kind[l]);
        }
    } else if (cJSON_IsArray(cr)) {
        /* The official list has one more entry (the MTP layer); only the first n_layer count. */
        if ((uint32_t)cJSON_GetArraySize(cr) < hp->n_layer) die("config.json: compress_ratios too short");
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const cJSON *v = cJSON_GetArrayItem(cr, (int)l);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0) die("config.json: compress_ratios[%u] invalid", l);
            hp->compress_ratio[l] = (uint32_t)v->valuedouble;
        }
        /* the official checkpoint's own rule: ratio 4 overlaps and is indexed */
        ds4_hparams_default_kinds(hp);
    } else {
        die("config.json: neither layer_types nor compress_ratios");
    }

    hp->rope_base = (float)jnum(cfg, "rope_theta");
    hp->compress_rope_base = (float)jnum(cfg, "compress_rope_theta");
    const cJSON *y = yarn_object(cfg);
    hp->yarn_factor = (float)jnum(y, "factor");
    hp->yarn_orig_ctx = ju32(y, "original_max_position_embeddings");
    hp->yarn_beta_fast = (float)jnum(y, "beta_fast");
    hp->yarn_beta_slow = (float)jnum(y, "beta_slow");
    const cJSON *af = jget(y, "attention_factor");
    if (cJSON_IsNumber(af) && af->valuedouble != 1.0)
        fprintf(stderr, "ds4-convert: warning: YaRN attention_factor %g is not representable; "
                "DS4 never scales cos/sin (sheet 6.4)\n", af->valuedouble);
    hp->rms_eps = (float)jnum(cfg, "rms_norm_eps");
    hp->idx_n_head = ju32(cfg, "index_n_heads");
    hp->idx_head_dim = ju32(cfg, "index_head_dim");
    hp->idx_topk = ju32(cfg, "index_topk");
    hp->hc_count = ju32(cfg, "hc_mult");
    hp->hc_sinkhorn_iters = ju32(cfg, "hc_sinkhorn_iters");
    hp->hc_eps = (float)jnum(cfg, "hc_eps");
    hp->n_expert = ju32(cfg, "n_routed_experts");
    hp->n_expert_used = ju32(cfg, "num_experts_per_tok");
    hp->expert_ff = ju32(cfg, "moe_intermediate_size");
    hp->n_expert_shared = ju32(cfg, "n_shared_experts");

    const cJSON *mt = jget(cfg, "mlp_layer_types");
    if (cJSON_IsArray(mt)) {
        /* Hash layers must form a prefix: the GGUF stores only their count. */
        uint32_t n = 0;
        bool seen_topk = false;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const cJSON *t = cJSON_GetArrayItem(mt, (int)l);
            if (!cJSON_IsString(t)) die("config.json: mlp_layer_types[%u] is not a string", l);
            bool hash = !strcmp(t->valuestring, "hash_moe");
            if (hash && seen_topk) die("config.json: hash_moe layers must come first");
            if (!hash && strcmp(t->valuestring, "moe")) die("config.json: unknown mlp layer type '%s'", t->valuestring);
            seen_topk |= !hash;
            n += hash;
        }
        hp->n_hash_layer = n;
    } else {
        hp->n_hash_layer = ju32(cfg, "num_hash_layers");
    }
    hp->expert_weights_scale = (float)jnum(cfg, "routed_scaling_factor");
    const cJSON *norm = jget(cfg, "norm_topk_prob");
    if (!cJSON_IsBool(norm)) die("config.json: missing bool 'norm_topk_prob'");
    hp->expert_weights_norm = cJSON_IsTrue(norm);
    const cJSON *sf = jget(cfg, "scoring_func");
    if (!cJSON_IsString(sf) || strcmp(sf->valuestring, "sqrtsoftplus"))
        die("config.json: scoring_func must be \"sqrtsoftplus\" (the only DS4 router)");
    hp->expert_gating_func = 4;
    float limit = (float)jnum(cfg, "swiglu_limit");
    for (uint32_t l = 0; l < hp->n_layer; l++) hp->swiglu_clamp_exp[l] = hp->swiglu_clamp_shexp[l] = limit;
    hp->nextn_predict_layers = ju32_or(cfg, "num_nextn_predict_layers", 0);
    cJSON_Delete(cfg);

    char err[256];
    if (ds4_hparams_check(hp, err, sizeof err)) die("config.json: %s", err);
}

/* GlmMoeDsaConfig fields (GLM sheet section 2). mtp: the checkpoint holds
 * the MTP block (model.layers.<num_hidden_layers>.*); a transformers save
 * does not, and the file then has no nextn block. */
static void read_glm_config(const cJSON *cfg, bool mtp, glm_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    const uint32_t trunk = ju32(cfg, "num_hidden_layers");
    hp->n_nextn = mtp ? ju32_or(cfg, "num_nextn_predict_layers", 0) : 0;
    if (trunk == 0 || trunk + hp->n_nextn > GLM_MAX_LAYERS)
        die("config.json: num_hidden_layers %u (+%u MTP) unsupported (at most %d blocks)", trunk, hp->n_nextn,
            GLM_MAX_LAYERS);
    hp->n_block = trunk + hp->n_nextn;
    hp->n_ctx_train = ju32(cfg, "max_position_embeddings");
    hp->n_embd = ju32(cfg, "hidden_size");
    hp->n_vocab = ju32(cfg, "vocab_size");
    hp->n_head = ju32(cfg, "num_attention_heads");
    hp->n_head_kv = 1;   /* MLA runs as MQA over the latent (llama.cpp writes 1) */
    hp->n_rot = ju32(cfg, "qk_rope_head_dim");
    hp->key_length_mla = ju32(cfg, "qk_nope_head_dim") + hp->n_rot;
    hp->value_length_mla = ju32(cfg, "v_head_dim");
    hp->q_lora_rank = ju32(cfg, "q_lora_rank");
    hp->kv_lora_rank = ju32(cfg, "kv_lora_rank");
    hp->key_length = hp->kv_lora_rank + hp->n_rot;
    hp->value_length = hp->kv_lora_rank;
    hp->dense_ff = ju32(cfg, "intermediate_size");
    hp->n_leading_dense = ju32_or(cfg, "first_k_dense_replace", 0);
    /* transformers also saves the per-layer kinds; the layout has dense layers only in front */
    const cJSON *mlt = jget(cfg, "mlp_layer_types");
    for (uint32_t l = 0; cJSON_IsArray(mlt) && l < trunk; l++) {
        const cJSON *v = cJSON_GetArrayItem(mlt, (int)l);
        const char *want = l < hp->n_leading_dense ? "dense" : "sparse";
        if (!cJSON_IsString(v) || strcmp(v->valuestring, want))
            die("config.json: mlp_layer_types[%u] must be \"%s\" (first_k_dense_replace %u dense layers, then MoE)",
                l, want, hp->n_leading_dense);
    }
    hp->n_expert = ju32(cfg, "n_routed_experts");
    hp->n_expert_used = ju32(cfg, "num_experts_per_tok");
    hp->expert_ff = ju32(cfg, "moe_intermediate_size");
    hp->n_expert_shared = ju32_or(cfg, "n_shared_experts", 1);
    hp->n_expert_groups = ju32_or(cfg, "n_group", 1);
    hp->n_expert_groups_used = ju32_or(cfg, "topk_group", 1);
    hp->expert_weights_scale = (float)jnum(cfg, "routed_scaling_factor");
    const cJSON *norm = jget(cfg, "norm_topk_prob");
    hp->expert_weights_norm = !norm || cJSON_IsTrue(norm);
    hp->expert_gating_func = 2;
    const cJSON *sf = jget(cfg, "scoring_func");
    if (sf && (!cJSON_IsString(sf) || strcmp(sf->valuestring, "sigmoid")))
        die("config.json: scoring_func must be \"sigmoid\" (GLM's router)");
    hp->rms_eps = (float)jnum(cfg, "rms_norm_eps");
    const cJSON *rp = jget(cfg, "rope_parameters");
    const cJSON *rope = cJSON_IsObject(rp) ? rp : cfg;
    hp->rope_base = (float)jnum(rope, "rope_theta");
    const cJSON *rt = jget(rope, "rope_type");
    if ((rt && (!cJSON_IsString(rt) || strcmp(rt->valuestring, "default"))) || cJSON_IsObject(jget(cfg, "rope_scaling")))
        die("config.json: only rope_type \"default\" is supported for GLM (GLM 5.2 uses it); no YaRN");
    hp->idx_n_head = ju32(cfg, "index_n_heads");
    hp->idx_head_dim = ju32(cfg, "index_head_dim");
    hp->idx_topk = ju32(cfg, "index_topk");
    /* indexer_types as given, else GlmMoeDsaConfig's rule from the frequency
     * and offset (defaults 1 / 2: every layer full); written to the file
     * either way so it never depends on llama.cpp's context-length guess. */
    hp->indexer_types_key = true;
    const cJSON *it = jget(cfg, "indexer_types");
    if (cJSON_IsArray(it)) {
        if ((uint32_t)cJSON_GetArraySize(it) != trunk) die("config.json: indexer_types needs %u entries", trunk);
        for (uint32_t l = 0; l < trunk; l++) {
            const cJSON *v = cJSON_GetArrayItem(it, (int)l);
            if (!cJSON_IsString(v) || (strcmp(v->valuestring, "full") && strcmp(v->valuestring, "shared")))
                die("config.json: indexer_types[%u] must be \"full\" or \"shared\"", l);
            hp->indexer_full[l] = !strcmp(v->valuestring, "full");
        }
    } else {
        const int64_t freq = ju32_or(cfg, "index_topk_freq", 1), offset = ju32_or(cfg, "index_skip_topk_offset", 2);
        if (freq == 0) die("config.json: index_topk_freq is 0");
        for (uint32_t l = 0; l < trunk; l++) {
            const int64_t shifted = (int64_t)l - offset + 1;
            hp->indexer_full[l] = (shifted < 0 ? 0 : shifted) % freq == 0;
        }
    }
    char err[256];
    if (ds4_glm_hparams_check(hp, err, sizeof err)) die("config.json: %s", err);
}

/* ---------------------------------------------------------------- sources */

/* Source name alternatives per tensor, after the "layers.N." / "model.layers.N."
 * (or ""/"model." for globals) prefix: official name first, then transformers'. */
static const char *const src_names[DS4_T_COUNT][3] = {
    [DS4_T_TOKEN_EMBD] = {"embed.weight", "embed_tokens.weight"},
    [DS4_T_OUTPUT_HC_FN] = {"hc_head_fn", "hc_head.hc_fn"},
    [DS4_T_OUTPUT_HC_SCALE] = {"hc_head_scale", "hc_head.hc_scale"},
    [DS4_T_OUTPUT_HC_BASE] = {"hc_head_base", "hc_head.hc_base"},
    [DS4_T_OUTPUT_NORM] = {"norm.weight"},
    [DS4_T_OUTPUT] = {"head.weight", "lm_head.weight"},
    [DS4_T_HC_ATTN_FN] = {"hc_attn_fn", "attn_hc.fn"},
    [DS4_T_HC_ATTN_SCALE] = {"hc_attn_scale", "attn_hc.scale"},
    [DS4_T_HC_ATTN_BASE] = {"hc_attn_base", "attn_hc.base"},
    [DS4_T_ATTN_NORM] = {"attn_norm.weight", "input_layernorm.weight"},
    [DS4_T_ATTN_Q_A] = {"attn.wq_a.weight", "self_attn.q_a_proj.weight"},
    [DS4_T_ATTN_Q_A_NORM] = {"attn.q_norm.weight", "self_attn.q_a_norm.weight"},
    [DS4_T_ATTN_Q_B] = {"attn.wq_b.weight", "self_attn.q_b_proj.weight"},
    [DS4_T_ATTN_KV] = {"attn.wkv.weight", "self_attn.kv_proj.weight"},
    [DS4_T_ATTN_KV_A_NORM] = {"attn.kv_norm.weight", "attn.norm.weight", "self_attn.kv_norm.weight"},
    [DS4_T_ATTN_SINKS] = {"attn.attn_sink", "self_attn.sinks"},
    [DS4_T_ATTN_OUTPUT_A] = {"attn.wo_a.weight", "self_attn.o_a_proj.weight"},
    [DS4_T_ATTN_OUTPUT_B] = {"attn.wo_b.weight", "self_attn.o_b_proj.weight"},
    [DS4_T_HC_FFN_FN] = {"hc_ffn_fn", "ffn_hc.fn"},
    [DS4_T_HC_FFN_SCALE] = {"hc_ffn_scale", "ffn_hc.scale"},
    [DS4_T_HC_FFN_BASE] = {"hc_ffn_base", "ffn_hc.base"},
    [DS4_T_FFN_NORM] = {"ffn_norm.weight", "post_attention_layernorm.weight"},
    [DS4_T_FFN_GATE_INP] = {"ffn.gate.weight", "mlp.gate.weight"},
    /* experts: per-expert official names ("%u" = expert), then the merged tensor */
    [DS4_T_FFN_GATE_EXPS] = {"ffn.experts.%u.w1.weight", "mlp.experts.gate_up_proj"},
    [DS4_T_FFN_UP_EXPS] = {"ffn.experts.%u.w3.weight", "mlp.experts.gate_up_proj"},
    [DS4_T_FFN_DOWN_EXPS] = {"ffn.experts.%u.w2.weight", "mlp.experts.down_proj"},
    [DS4_T_FFN_GATE_SHEXP] = {"ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    [DS4_T_FFN_UP_SHEXP] = {"ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    [DS4_T_FFN_DOWN_SHEXP] = {"ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
    [DS4_T_FFN_GATE_TID2EID] = {"ffn.gate.tid2eid", "mlp.gate.tid2eid"},
    [DS4_T_EXP_PROBS_B] = {"ffn.gate.bias", "mlp.gate.e_score_correction_bias"},
    [DS4_T_COMP_APE] = {"attn.compressor.ape", "self_attn.compressor.position_bias"},
    [DS4_T_COMP_KV] = {"attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"},
    [DS4_T_COMP_GATE] = {"attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"},
    [DS4_T_COMP_NORM] = {"attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"},
    [DS4_T_IDX_Q_B] = {"attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"},
    [DS4_T_IDX_PROJ] = {"attn.indexer.weights_proj.weight",
                        "self_attn.compressor.indexer.scorer.weights_proj.weight",
                        "self_attn.compressor.indexer.weights_proj.weight"},
    [DS4_T_IDX_COMP_APE] = {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"},
    [DS4_T_IDX_COMP_KV] = {"attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"},
    [DS4_T_IDX_COMP_GATE] = {"attn.indexer.compressor.wgate.weight",
                             "self_attn.compressor.indexer.gate_proj.weight"},
    [DS4_T_IDX_COMP_NORM] = {"attn.indexer.compressor.norm.weight",
                             "self_attn.compressor.indexer.kv_norm.weight"},
};

enum encoding { ENC_PLAIN, ENC_FP8_BLOCK, ENC_FP4 };

/* One source matrix: rows of `cols` values, decoded with its encoding. */
typedef struct {
    const ds4_st_tensor *w, *scale;
    enum encoding enc;
    uint64_t rows;          /* rows of the whole source tensor (all experts if merged) */
} part;

enum expert_part { EXP_NONE, EXP_GATE, EXP_UP, EXP_DOWN };

typedef struct {
    char name[96];
    int layer;
    const char *const *alts;      /* up to 3 source name alternatives (NULL-terminated if fewer) */
    enum expert_part expert;      /* routed expert stack: which projection */
    bool ids;                     /* tid2eid: integer ids, not rows */
    bool transpose;               /* GLM attn_k_b: output rows are source columns (below) */
    uint32_t type;
    int n_dims;
    uint64_t ne[4];
    part *parts;            /* one per expert (per-expert source) or a single one */
    int n_parts;
    uint64_t src_rows_per_matrix; /* merged experts / kv_b heads: source rows per output matrix */
    uint64_t row_offset;          /* merged gate_up: 0 for gate, F for up; kv_b: 0 for k, nope for v */
    const float *imatrix;         /* ne0 per matrix, or NULL */
    bool imatrix_per_expert;
} out_tensor;

static const ds4_st_tensor *find_prefixed(const ds4_st *st, int layer, const char *suffix) {
    static const char *const gpre[] = {"", "model."};
    static const char *const lpre[] = {"layers.%d.", "model.layers.%d."};
    static const char *const mpre[] = {"mtp.0.", "model.mtp.0."};
    char name[256], pre[64];
    for (int i = 0; i < 2; i++) {
        snprintf(pre, sizeof pre, layer == DS4_LAYER_MTP ? mpre[i] : layer < 0 ? gpre[i] : lpre[i], layer);
        snprintf(name, sizeof name, "%s%s", pre, suffix);
        const ds4_st_tensor *t = ds4_st_find(st, name);
        if (t) return t;
    }
    return NULL;
}

/* The FP8 block scale sits next to the weight as "<base>.scale" (official) or
 * "<base>.weight_scale_inv" (HF FP8 convention). */
static const ds4_st_tensor *find_scale(const ds4_st *st, const char *wname) {
    char base[256];
    snprintf(base, sizeof base, "%s", wname);
    char *dot = strrchr(base, '.');
    if (dot && !strcmp(dot, ".weight")) *dot = 0;
    static const char *const suffixes[] = {".scale", ".weight_scale_inv", "_scale", "_scale_inv"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char n[300];
        snprintf(n, sizeof n, "%s%s", base, suffixes[i]);
        const ds4_st_tensor *t = ds4_st_find(st, n);
        if (t) return t;
    }
    return NULL;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* Checks a source tensor against the expected matrix (rows x cols in total)
 * and classifies its encoding. */
static void bind_part(const ds4_st *st, part *p, const ds4_st_tensor *w, uint64_t rows, uint64_t cols,
                      const char *what) {
    p->w = w;
    p->rows = rows;
    p->scale = NULL;
    p->enc = ENC_PLAIN;
    uint64_t last = w->n_dims ? w->shape[w->n_dims - 1] : 1;
    bool packed = (w->dtype == DS4_ST_I8 || w->dtype == DS4_ST_U8) && last * 2 == cols;
    if (w->dtype == DS4_ST_F4 && last == cols && w->n_elements == rows * cols) packed = true;
    if (packed) {
        p->enc = ENC_FP4;
        p->scale = find_scale(st, w->name);
        if (!p->scale || p->scale->n_elements != rows * ceil_div(cols, 32))
            die("%s: FP4 tensor %s needs a scale of %llu x %llu", what, w->name,
                (unsigned long long)rows, (unsigned long long)ceil_div(cols, 32));
        if (cols % 32) die("%s: FP4 tensor %s has %llu columns, not a multiple of 32", what, w->name,
                           (unsigned long long)cols);
    } else {
        if (w->n_elements != rows * cols || (w->n_dims > 0 && last != cols))
            die("%s: source %s has %llu elements (last dim %llu), expected %llu x %llu", what, w->name,
                (unsigned long long)w->n_elements, (unsigned long long)last, (unsigned long long)rows,
                (unsigned long long)cols);
        if (w->dtype == DS4_ST_F8_E4M3) {
            p->enc = ENC_FP8_BLOCK;
            p->scale = find_scale(st, w->name);
            if (!p->scale || p->scale->n_elements != ceil_div(rows, 128) * ceil_div(cols, 128))
                die("%s: FP8 tensor %s needs a %llu x %llu block scale", what, w->name,
                    (unsigned long long)ceil_div(rows, 128), (unsigned long long)ceil_div(cols, 128));
        }
    }
}

static void resolve(const ds4_st *st, out_tensor *o) {
    const char *const *alts = o->alts;
    const uint64_t cols = o->ne[0], rows = o->ne[1] * o->ne[3], n_mat = o->ne[2];
    if (o->expert != EXP_NONE) {
        char n[128];
        snprintf(n, sizeof n, alts[0], 0u);
        if (find_prefixed(st, o->layer, n)) {
            o->n_parts = (int)n_mat;
            o->parts = calloc(n_mat, sizeof *o->parts);
            for (uint32_t e = 0; e < n_mat; e++) {
                snprintf(n, sizeof n, alts[0], e);
                const ds4_st_tensor *w = find_prefixed(st, o->layer, n);
                if (!w) die("%s: missing source for expert %u (%s)", o->name, e, n);
                bind_part(st, &o->parts[e], w, rows, cols, o->name);
            }
            return;
        }
        const ds4_st_tensor *w = find_prefixed(st, o->layer, alts[1]);
        if (!w) die("%s: no source tensor (tried %s, %s)", o->name, n, alts[1]);
        bool gate_up = o->expert != EXP_DOWN;
        o->src_rows_per_matrix = gate_up ? 2 * rows : rows;
        o->row_offset = o->expert == EXP_UP ? rows : 0;
        o->n_parts = 1;
        o->parts = calloc(1, sizeof *o->parts);
        bind_part(st, o->parts, w, n_mat * o->src_rows_per_matrix, cols, o->name);
        return;
    }
    for (int i = 0; i < 3 && alts[i]; i++) {
        const ds4_st_tensor *w = find_prefixed(st, o->layer, alts[i]);
        if (!w) continue;
        o->n_parts = 1;
        o->parts = calloc(1, sizeof *o->parts);
        bind_part(st, o->parts, w, rows * n_mat, cols, o->name);
        if (o->ids && w->dtype != DS4_ST_I64 && w->dtype != DS4_ST_I32)
            die("%s: tid2eid source %s must be I64 or I32", o->name, w->name);
        return;
    }
    die("%s: no source tensor (tried %s%s%s)", o->name, alts[0], alts[1] ? ", " : "", alts[1] ? alts[1] : "");
}

/* Block scales: U8 scale tensors hold UE8M0 exponents too (transformers'
 * MXFP convention), any float dtype holds the multiplier itself. */
static void read_scales(const ds4_st_tensor *t, uint64_t first, uint64_t n, float *out) {
    if (t->dtype == DS4_ST_U8)
        for (uint64_t i = 0; i < n; i++) out[i] = ds4_e8m0_to_f32(((const uint8_t *)t->data)[first + i]);
    else
        ds4_st_read_f32(t, first, n, out);
}

/* Decodes source row r of a part into out[cols]. */
static void read_row(const part *p, uint64_t r, uint64_t cols, float *out) {
    switch (p->enc) {
    case ENC_PLAIN:
        ds4_st_read_f32(p->w, r * cols, cols, out);
        break;
    case ENC_FP8_BLOCK: {
        uint64_t scols = ceil_div(cols, 128);
        float sc[scols];
        ds4_st_read_f32(p->w, r * cols, cols, out);
        read_scales(p->scale, (r / 128) * scols, scols, sc);
        for (uint64_t c = 0; c < cols; c++) out[c] *= sc[c / 128];
        break;
    }
    case ENC_FP4: {
        const uint8_t *q = (const uint8_t *)p->w->data + r * (cols / 2);
        uint64_t scols = cols / 32;
        float sc[scols];
        read_scales(p->scale, r * scols, scols, sc);
        for (uint64_t c = 0; c < cols; c += 2) {
            out[c] = ds4_fp4_e2m1_to_f32(q[c / 2] & 15) * sc[c / 32];
            out[c + 1] = ds4_fp4_e2m1_to_f32(q[c / 2] >> 4) * sc[c / 32];
        }
        break;
    }
    }
}

/* ---------------------------------------------------------------- imatrix */

typedef struct { char *name; float *v; uint32_t n; } imat_entry;
typedef struct { imat_entry *e; size_t n; } imatrix;

static void imatrix_check(const char *path, const imat_entry *e) {
    for (uint32_t j = 0; j < e->n; j++)
        if (!(e->v[j] >= 0) || !isfinite(e->v[j]))
            die("%s: entry %s has a negative or non-finite value", path, e->name);
}

/* llama.cpp's legacy imatrix.dat: i32 count, then per entry i32 name length,
 * name, i32 calls, i32 value count, f32 values. */
static void imatrix_load_dat(const char *path, FILE *f, imatrix *im) {
    int32_t n;
    if (fread(&n, 4, 1, f) != 1 || n < 0 || n > 1000000) die("%s: not an imatrix file", path);
    im->e = calloc((size_t)n, sizeof *im->e);
    im->n = (size_t)n;
    for (int32_t i = 0; i < n; i++) {
        int32_t len, ncall, nval;
        if (fread(&len, 4, 1, f) != 1 || len <= 0 || len > 4096) die("%s: entry %d: bad name length", path, i);
        im->e[i].name = calloc((size_t)len + 1, 1);
        if (fread(im->e[i].name, 1, (size_t)len, f) != (size_t)len || fread(&ncall, 4, 1, f) != 1 ||
            fread(&nval, 4, 1, f) != 1 || nval <= 0 || nval > (1 << 28))
            die("%s: entry %d truncated", path, i);
        im->e[i].n = (uint32_t)nval;
        im->e[i].v = malloc((size_t)nval * sizeof(float));
        if (fread(im->e[i].v, 4, (size_t)nval, f) != (size_t)nval) die("%s: entry %d truncated", path, i);
        imatrix_check(path, &im->e[i]);
    }
}

/* llama.cpp's GGUF imatrix: per weight "<name>.in_sum2" F32 [ne0, n_mat]
 * (sums of squared inputs) and "<name>.counts" F32 [1, n_mat]; the importance
 * is their quotient. A matrix that saw no tokens gets neutral weights. */
static void imatrix_load_gguf(const char *path, imatrix *im) {
    char err[512];
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    if (!g) die("%s", err);
    im->e = calloc(ds4_gguf_n_tensors(g), sizeof *im->e);
    for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *s = ds4_gguf_tensor_at(g, i);
        static const char suf[] = ".in_sum2";
        if (s->name.len <= sizeof suf - 1 || memcmp(s->name.ptr + s->name.len - (sizeof suf - 1), suf, sizeof suf - 1))
            continue;
        imat_entry *e = &im->e[im->n++];
        size_t base_len = s->name.len - (sizeof suf - 1);
        e->name = calloc(base_len + sizeof ".counts", 1);
        memcpy(e->name, s->name.ptr, base_len);
        memcpy(e->name + base_len, ".counts", sizeof ".counts");
        const ds4_gguf_tensor *c = ds4_gguf_find_tensor(g, e->name);
        e->name[base_len] = 0;
        uint64_t n_mat = s->ne[1];
        if (s->type != DS4_TYPE_F32 || !c || c->type != DS4_TYPE_F32 || c->n_elements != n_mat ||
            s->n_elements > (1u << 28))
            die("%s: %s needs an F32 .in_sum2 [ne0, n] and .counts [1, n]", path, e->name);
        e->n = (uint32_t)s->n_elements;
        e->v = malloc(s->n_elements * sizeof(float));
        uint64_t ne0 = s->ne[0];
        for (uint64_t m = 0; m < n_mat; m++) {
            float cnt;
            memcpy(&cnt, (const uint8_t *)c->data + 4 * m, 4);
            for (uint64_t k = 0; k < ne0; k++) {
                float v;
                memcpy(&v, (const uint8_t *)s->data + 4 * (m * ne0 + k), 4);
                e->v[m * ne0 + k] = cnt > 0 ? v / cnt : 1.0f;
            }
        }
        imatrix_check(path, e);
    }
    ds4_gguf_close(g);
}

static void imatrix_load(const char *path, imatrix *im) {
    FILE *f = fopen(path, "rb");
    if (!f) die("%s: %s", path, strerror(errno));
    char magic[4] = {0};
    bool gguf = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (gguf) {
        fclose(f);
        imatrix_load_gguf(path, im);
        return;
    }
    rewind(f);
    imatrix_load_dat(path, f, im);
    fclose(f);
}

static void imatrix_bind(const imatrix *im, out_tensor *o) {
    for (size_t i = 0; i < im->n; i++) {
        if (strcmp(im->e[i].name, o->name)) continue;
        if (im->e[i].n == o->ne[0] * o->ne[2]) o->imatrix_per_expert = true;
        else if (im->e[i].n != o->ne[0])
            die("imatrix entry %s has %u values, expected %llu or %llu", o->name, im->e[i].n,
                (unsigned long long)o->ne[0], (unsigned long long)(o->ne[0] * o->ne[2]));
        o->imatrix = im->e[i].v;
        return;
    }
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    out_tensor *t;
    size_t n;
    double t0_bytes, done_bytes;   /* output bytes: all / written so far */
    double t_start;
    ds4_pool *pool;
    /* A failure while writing is reported through the writer (fill returns
     * -1), which then deletes its temporary file; the first message wins. */
    atomic_int failed;
    char err[512];
} plan;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void plan_fail(plan *pl, const char *fmt, ...) {
    if (atomic_exchange(&pl->failed, 1)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pl->err, sizeof pl->err, fmt, ap);
    va_end(ap);
}

/* One matrix's rows, quantized in parallel (each thread its own row buffer). */
typedef struct {
    plan *pl;
    const out_tensor *o;
    const part *p;
    uint64_t base, m, rows, cols;
    size_t row_bytes;
    const float *im;
    uint8_t *out;
    float *bufs;
} rows_job;

/* Quantizes output row r of matrix m from row[cols]; false (and the plan
 * failed) on a non-finite value or an unproducible row. */
static bool quantize_row_checked(plan *pl, const out_tensor *o, const float *row, uint64_t cols, uint64_t m,
                                 uint64_t r, const float *im, uint8_t *dst, size_t row_bytes) {
    for (uint64_t c = 0; c < cols; c++)
        if (!isfinite(row[c])) {
            plan_fail(pl, "%s: non-finite source value at matrix %llu row %llu col %llu", o->name,
                      (unsigned long long)m, (unsigned long long)r, (unsigned long long)c);
            return false;
        }
    if (ds4_quantize_row(o->type, row, dst, (int64_t)cols, im) != row_bytes) {
        plan_fail(pl, "%s: cannot produce %s rows of %llu", o->name, ds4_type_name(o->type), (unsigned long long)cols);
        return false;
    }
    return true;
}

static void quantize_rows(void *ctx, int task, int n_tasks, int thread) {
    const rows_job *j = ctx;
    float *row = j->bufs + (size_t)thread * j->cols;
    uint64_t r0 = j->rows * (uint64_t)task / (uint64_t)n_tasks, r1 = j->rows * (uint64_t)(task + 1) / (uint64_t)n_tasks;
    for (uint64_t r = r0; r < r1 && !atomic_load(&j->pl->failed); r++) {
        read_row(j->p, j->base + r, j->cols, row);
        if (!quantize_row_checked(j->pl, j->o, row, j->cols, j->m, r, j->im, j->out + r * j->row_bytes, j->row_bytes))
            return;
    }
}

/* GLM attn_k_b: head m's source block is `cols` rows (k_nope dims) of
 * `rows` values (latent dims) from row m * src_rows_per_matrix; output row j
 * of head m is column j of that block (llama.cpp's converter stores W_k,h
 * transposed so decode can multiply the query into the latent). Small
 * (kv_lora x qk_nope per head): one thread. */
static int fill_transposed(plan *pl, const out_tensor *o, uint8_t *out) {
    const uint64_t cols = o->ne[0], rows = o->ne[1], n_mat = o->ne[2];
    const size_t row_bytes = ds4_type_row_bytes(o->type, cols);
    float *block = malloc(cols * rows * sizeof(float)), *row = malloc(cols * sizeof(float));
    if (!block || !row) {
        plan_fail(pl, "%s: out of memory", o->name);
    } else {
        for (uint64_t m = 0; m < n_mat && !atomic_load(&pl->failed); m++) {
            for (uint64_t i = 0; i < cols; i++)
                read_row(o->parts, m * o->src_rows_per_matrix + o->row_offset + i, rows, block + i * rows);
            for (uint64_t r = 0; r < rows && !atomic_load(&pl->failed); r++) {
                for (uint64_t i = 0; i < cols; i++) row[i] = block[i * rows + r];
                quantize_row_checked(pl, o, row, cols, m, r, o->imatrix, out + (m * rows + r) * row_bytes, row_bytes);
            }
        }
    }
    free(block);
    free(row);
    return atomic_load(&pl->failed) ? -1 : 0;
}

/* tid2eid: int64/int32 source ids to I32, refusing values that do not fit. */
static int fill_ids(plan *pl, const out_tensor *o, uint8_t *out) {
    const ds4_st_tensor *w = o->parts[0].w;
    for (uint64_t i = 0; i < w->n_elements; i++) {
        int64_t v;
        if (w->dtype == DS4_ST_I64) memcpy(&v, (const uint8_t *)w->data + 8 * i, 8);
        else { int32_t v32; memcpy(&v32, (const uint8_t *)w->data + 4 * i, 4); v = v32; }
        int32_t v32 = (int32_t)v;
        if (v != v32) {
            plan_fail(pl, "%s: value %lld does not fit in I32", o->name, (long long)v);
            return -1;
        }
        memcpy(out + 4 * i, &v32, 4);
    }
    return 0;
}

static int fill_rows(plan *pl, const out_tensor *o, uint8_t *out) {
    const uint64_t cols = o->ne[0], rows = o->ne[1] * o->ne[3], n_mat = o->ne[2];
    const size_t row_bytes = ds4_type_row_bytes(o->type, cols);
    /* IQ2_XXS without a measured imatrix: Σ_rows W² per expert matrix. */
    bool need_imp = o->type == DS4_TYPE_IQ2_XXS && !o->imatrix;
    float *imp = need_imp ? malloc(cols * sizeof(float)) : NULL;
    rows_job j = {.pl = pl, .o = o, .cols = cols, .rows = rows, .row_bytes = row_bytes,
                  .bufs = malloc((size_t)ds4_pool_threads(pl->pool) * cols * sizeof(float))};
    for (uint64_t m = 0; m < n_mat && !atomic_load(&pl->failed); m++) {
        j.p = &o->parts[o->n_parts > 1 ? m : 0];
        j.base = (o->n_parts > 1 ? 0 : m * o->src_rows_per_matrix) + o->row_offset;
        j.m = m;
        j.out = out + m * rows * row_bytes;
        j.im = o->imatrix ? o->imatrix + (o->imatrix_per_expert ? m * cols : 0) : NULL;
        if (need_imp) {
            memset(imp, 0, cols * sizeof(float));
            for (uint64_t r = 0; r < rows; r++) {
                read_row(j.p, j.base + r, cols, j.bufs);
                for (uint64_t c = 0; c < cols; c++) imp[c] += j.bufs[c] * j.bufs[c];
            }
            j.im = imp;
        }
        uint64_t tasks = (uint64_t)ds4_pool_threads(pl->pool) * 4;
        ds4_pool_run(pl->pool, quantize_rows, &j, (int)(tasks < rows ? tasks : rows));
    }
    free(j.bufs);
    free(imp);
    return atomic_load(&pl->failed) ? -1 : 0;
}

static int fill(void *ctx, size_t ti, void *dst, size_t n_bytes) {
    plan *pl = ctx;
    const out_tensor *o = &pl->t[ti];
    int rc = o->ids ? fill_ids(pl, o, dst) : o->transpose ? fill_transposed(pl, o, dst) : fill_rows(pl, o, dst);
    if (rc != 0) return -1;
    pl->done_bytes += (double)n_bytes;
    double el = now_s() - pl->t_start, frac = pl->done_bytes / pl->t0_bytes;
    fprintf(stderr, "[%4zu/%zu] %-40s %-8s [%llu, %llu, %llu] %5.1f%%  %.0fs, ~%.0fs left\n", ti + 1, pl->n,
            o->name, ds4_type_name(o->type), (unsigned long long)o->ne[0], (unsigned long long)o->ne[1],
            (unsigned long long)o->ne[2], 100.0 * frac, el, frac > 0 ? el * (1 - frac) / frac : 0.0);
    return 0;
}

/* The next output tensor of the plan; the caller fills name, shape, type. */
static out_tensor *new_out(plan *pl, int layer, const char *const *alts, enum expert_part expert) {
    out_tensor *o = &pl->t[pl->n++];
    memset(o, 0, sizeof *o);
    o->layer = layer;
    o->alts = alts;
    o->expert = expert;
    return o;
}

static void check_row_type(const out_tensor *o) {
    if (ds4_type_row_bytes(o->type, o->ne[0]) == 0)
        die("%s: row length %llu is not a multiple of the %s block (%zu)", o->name,
            (unsigned long long)o->ne[0], ds4_type_name(o->type), ds4_type_block_elems(o->type));
}

static void add_plan(plan *pl, const ds4_st *st, const ds4_hparams *hp, enum ds4_mix mix,
                     const imatrix *im, const ds4_layer_slice *slice, enum ds4_tensor_id id, int layer) {
    if (!ds4_tensor_present(hp, id, layer) ||
        (slice && !ds4_tensor_in_slice(id, layer, slice->first, slice->last, slice->output)))
        return;
    out_tensor *o = new_out(pl, layer, src_names[id], id == DS4_T_FFN_GATE_EXPS ? EXP_GATE
                            : id == DS4_T_FFN_UP_EXPS ? EXP_UP : id == DS4_T_FFN_DOWN_EXPS ? EXP_DOWN : EXP_NONE);
    o->ids = id == DS4_T_FFN_GATE_TID2EID;
    ds4_tensor_name(id, layer, o->name, sizeof o->name);
    o->n_dims = ds4_tensor_shape(hp, id, layer, o->ne);
    o->type = ds4_tensor_type(id, mix);
    check_row_type(o);
    resolve(st, o);
    if (im) imatrix_bind(im, o);
}

/* The MTP-only tensors after "mtp.0.": official names, then module-style. */
static const char *const mtp_src_names[DS4_MTP_COUNT][3] = {
    [DS4_MTP_E_PROJ] = {"e_proj.weight"},
    [DS4_MTP_H_PROJ] = {"h_proj.weight"},
    [DS4_MTP_ENORM] = {"enorm.weight"},
    [DS4_MTP_HNORM] = {"hnorm.weight"},
    [DS4_MTP_NORM] = {"norm.weight"},
    [DS4_MTP_HC_HEAD_FN] = {"hc_head_fn", "hc_head.hc_fn"},
    [DS4_MTP_HC_HEAD_SCALE] = {"hc_head_scale", "hc_head.hc_scale"},
    [DS4_MTP_HC_HEAD_BASE] = {"hc_head_base", "hc_head.hc_base"},
};

/* The MTP support file's plan: the block as layer DS4_LAYER_MTP of its own
 * hparams, then the MTP-only tensors. */
static void add_plan_mtp(plan *pl, const ds4_st *st, const ds4_hparams *main_hp, enum ds4_mix mix) {
    static ds4_hparams block;
    ds4_hparams_mtp_block(main_hp, &block);
    for (int id = 0; id < DS4_T_COUNT; id++)
        add_plan(pl, st, &block, mix, NULL, NULL, (enum ds4_tensor_id)id, DS4_LAYER_MTP);
    for (int id = 0; id < DS4_MTP_COUNT; id++) {
        out_tensor *o = new_out(pl, DS4_LAYER_MTP, mtp_src_names[id], EXP_NONE);
        ds4_mtp_tensor_name((enum ds4_mtp_tensor_id)id, o->name, sizeof o->name);
        o->n_dims = ds4_mtp_tensor_shape(&block, (enum ds4_mtp_tensor_id)id, o->ne);
        o->type = ds4_mtp_tensor_type((enum ds4_mtp_tensor_id)id, mix);
        check_row_type(o);
        resolve(st, o);
    }
}

/* GLM source names after "model.layers.N." (or "model."/"" for globals):
 * transformers' GlmMoeDsa module names (GLM sheet section 4.2); experts
 * per expert or merged. attn_k_b / attn_v_b both come from kv_b_proj. */
static const char *const glm_src_names[GLM_T_COUNT][3] = {
    [GLM_T_TOKEN_EMBD] = {"embed_tokens.weight"},
    [GLM_T_OUTPUT_NORM] = {"norm.weight"},
    [GLM_T_OUTPUT] = {"lm_head.weight"},
    [GLM_T_ATTN_NORM] = {"input_layernorm.weight"},
    [GLM_T_ATTN_Q_A] = {"self_attn.q_a_proj.weight"},
    [GLM_T_ATTN_Q_A_NORM] = {"self_attn.q_a_layernorm.weight"},
    [GLM_T_ATTN_Q_B] = {"self_attn.q_b_proj.weight"},
    [GLM_T_ATTN_KV_A_MQA] = {"self_attn.kv_a_proj_with_mqa.weight"},
    [GLM_T_ATTN_KV_A_NORM] = {"self_attn.kv_a_layernorm.weight"},
    [GLM_T_ATTN_K_B] = {"self_attn.kv_b_proj.weight"},
    [GLM_T_ATTN_V_B] = {"self_attn.kv_b_proj.weight"},
    [GLM_T_ATTN_OUTPUT] = {"self_attn.o_proj.weight"},
    [GLM_T_FFN_NORM] = {"post_attention_layernorm.weight"},
    [GLM_T_IDX_Q_B] = {"self_attn.indexer.wq_b.weight"},
    [GLM_T_IDX_K] = {"self_attn.indexer.wk.weight"},
    [GLM_T_IDX_K_NORM] = {"self_attn.indexer.k_norm.weight"},
    [GLM_T_IDX_K_NORM_B] = {"self_attn.indexer.k_norm.bias"},
    [GLM_T_IDX_PROJ] = {"self_attn.indexer.weights_proj.weight"},
    [GLM_T_FFN_GATE] = {"mlp.gate_proj.weight"},
    [GLM_T_FFN_UP] = {"mlp.up_proj.weight"},
    [GLM_T_FFN_DOWN] = {"mlp.down_proj.weight"},
    [GLM_T_FFN_GATE_INP] = {"mlp.gate.weight"},
    [GLM_T_EXP_PROBS_B] = {"mlp.gate.e_score_correction_bias"},
    [GLM_T_FFN_GATE_EXPS] = {"mlp.experts.%u.gate_proj.weight", "mlp.experts.gate_up_proj"},
    [GLM_T_FFN_UP_EXPS] = {"mlp.experts.%u.up_proj.weight", "mlp.experts.gate_up_proj"},
    [GLM_T_FFN_DOWN_EXPS] = {"mlp.experts.%u.down_proj.weight", "mlp.experts.down_proj"},
    [GLM_T_FFN_GATE_SHEXP] = {"mlp.shared_experts.gate_proj.weight"},
    [GLM_T_FFN_UP_SHEXP] = {"mlp.shared_experts.up_proj.weight"},
    [GLM_T_FFN_DOWN_SHEXP] = {"mlp.shared_experts.down_proj.weight"},
    [GLM_T_NEXTN_EH_PROJ] = {"eh_proj.weight"},
    [GLM_T_NEXTN_ENORM] = {"enorm.weight"},
    [GLM_T_NEXTN_HNORM] = {"hnorm.weight"},
    [GLM_T_NEXTN_SHARED_HEAD_NORM] = {"shared_head.norm.weight"},
    [GLM_T_NEXTN_EMBED_TOKENS] = {"embed_tokens.weight"},
    [GLM_T_NEXTN_SHARED_HEAD_HEAD] = {"shared_head.head.weight"},
};

/* Whether block `layer` of the checkpoint has GLM tensor id's source. */
static bool glm_source_present(const ds4_st *st, enum glm_tensor_id id, int layer) {
    char n[128];
    snprintf(n, sizeof n, glm_src_names[id][0], 0u);
    return find_prefixed(st, layer, n) || (glm_src_names[id][1] && find_prefixed(st, layer, glm_src_names[id][1]));
}

static void add_plan_glm(plan *pl, const ds4_st *st, const glm_hparams *hp, enum ds4_mix mix,
                         const imatrix *im, enum glm_tensor_id id, int layer) {
    const enum glm_tensor_scope scope = ds4_glm_tensor_table[id].scope;
    if (scope == GLM_SCOPE_NEXTN_EXTRA) {
        if (layer < 0 || !glm_block_nextn(hp, layer) || !glm_source_present(st, id, layer)) return;
    } else if (!ds4_glm_tensor_present(hp, id, layer)) {
        return;
    }
    /* Indexer weights of shared layers and the MTP block are unused by both
     * reference implementations: converted when the checkpoint has them. */
    const bool idx_optional = scope == GLM_SCOPE_INDEXER && (glm_block_nextn(hp, layer) || !hp->indexer_full[layer]);
    if ((idx_optional || ds4_glm_tensor_table[id].optional) && !glm_source_present(st, id, layer)) return;
    out_tensor *o = new_out(pl, layer, glm_src_names[id], id == GLM_T_FFN_GATE_EXPS ? EXP_GATE
                            : id == GLM_T_FFN_UP_EXPS ? EXP_UP : id == GLM_T_FFN_DOWN_EXPS ? EXP_DOWN : EXP_NONE);
    ds4_glm_tensor_name(id, layer, o->name, sizeof o->name);
    o->n_dims = ds4_glm_tensor_shape(hp, id, layer, o->ne);
    o->type = ds4_glm_tensor_type(id, mix);
    check_row_type(o);
    if (id == GLM_T_ATTN_K_B || id == GLM_T_ATTN_V_B) {
        /* kv_b_proj: per head, qk_nope rows (k) then v_head rows (v), each
         * kv_lora wide (GLM sheet section 4.3). */
        const uint64_t nope = hp->key_length_mla - hp->n_rot, dv = hp->value_length_mla;
        const ds4_st_tensor *w = find_prefixed(st, layer, o->alts[0]);
        if (!w) die("%s: no source tensor (tried %s)", o->name, o->alts[0]);
        o->n_parts = 1;
        o->parts = calloc(1, sizeof *o->parts);
        if (!o->parts) die("out of memory");
        bind_part(st, o->parts, w, (uint64_t)hp->n_head * (nope + dv), hp->kv_lora_rank, o->name);
        o->src_rows_per_matrix = nope + dv;
        o->row_offset = id == GLM_T_ATTN_V_B ? nope : 0;
        o->transpose = id == GLM_T_ATTN_K_B;
    } else {
        resolve(st, o);
    }
    if (im) imatrix_bind(im, o);
}

/* The checkpoint has the MTP block when block num_hidden_layers exists. */
static bool glm_checkpoint_has_mtp(const ds4_st *st, const cJSON *cfg) {
    return find_prefixed(st, (int)ju32(cfg, "num_hidden_layers"), glm_src_names[GLM_T_NEXTN_EH_PROJ][0]) != NULL;
}

/* Source tensors no output tensor reads usually mean a naming mismatch; the
 * MTP block (mtp.*) is knowingly skipped (it is not part of the main layout). */
static void warn_unused(const ds4_st *st, const plan *pl) {
    size_t n = ds4_st_n_tensors(st), unused = 0;
    if (!n) return;
    const ds4_st_tensor *base = ds4_st_tensor_at(st, 0);
    bool *used = calloc(n, 1);
    for (size_t i = 0; i < pl->n; i++)
        for (int k = 0; k < pl->t[i].n_parts; k++) {
            used[pl->t[i].parts[k].w - base] = true;
            if (pl->t[i].parts[k].scale) used[pl->t[i].parts[k].scale - base] = true;
        }
    for (size_t i = 0; i < n; i++) {
        const char *name = base[i].name;
        if (used[i] || !strncmp(name, "mtp.", 4) || !strncmp(name, "model.mtp.", 10)) continue;
        if (unused++ < 5) fprintf(stderr, "ds4-convert: warning: source tensor %s is not used\n", name);
    }
    if (unused > 5) fprintf(stderr, "ds4-convert: warning: ... %zu unused source tensors in all\n", unused);
    free(used);
}

static void usage(void) {
    fputs("usage: ds4-convert HF_DIR OUT.gguf --type f32|f16|q8_0|q2|q4 [--imatrix FILE]\n"
          "                   [--vocab tokenizer.json [--vocab-added FILE]] [--name NAME] [--threads N]\n"
          "                   [--layers A:B|A:output] [--mtp]\n", stderr);
    exit(2);
}

int main(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type = NULL, *imatrix_path = NULL, *vocab = NULL, *name = NULL;
    const char *threads = "0", *vocab_added = NULL, *layers = NULL;
    bool mtp = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **opt = !strcmp(a, "--type") ? &type : !strcmp(a, "--imatrix") ? &imatrix_path
                         : !strcmp(a, "--vocab") ? &vocab : !strcmp(a, "--name") ? &name
                         : !strcmp(a, "--threads") ? &threads
                         : !strcmp(a, "--vocab-added") ? &vocab_added
                         : !strcmp(a, "--layers") ? &layers : NULL;
        if (opt) {
            if (++i >= argc) usage();
            *opt = argv[i];
        } else if (!strcmp(a, "--mtp")) {
            mtp = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
        } else if (a[0] == '-') {
            ds4_cli_unknown_option("ds4-convert", a);
            exit(2);
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            usage();
        }
    }
    if (!in || !out || !type) usage();
    int mix = ds4_mix_from_name(type);
    if (mix < 0) die("unknown --type %s (f32, f16, q8_0, q2, q4)", type);

    char err[512];
    ds4_layer_slice slice = DS4_SLICE_ALL;
    if (layers && !ds4_layer_slice_parse(layers, &slice, err, sizeof err)) die("%s", err);
    cJSON *cfg = load_config(in);
    ds4_st *st = ds4_st_open(in, err, sizeof err);
    if (!st) die("%s", err);
    const bool glm = config_is_glm(cfg);
    static ds4_hparams hp;
    static glm_hparams ghp;
    if (glm) {
        if (layers) die("--layers: GLM files are written whole");
        if (mtp) die("--mtp: GLM checkpoints keep their MTP block in the main file");
        read_glm_config(cfg, glm_checkpoint_has_mtp(st, cfg), &ghp);
        cJSON_Delete(cfg);
    } else {
        read_config(cfg, &hp);
        if (!ds4_layer_slice_resolve(&slice, (int)hp.n_layer, err, sizeof err)) die("--layers %s", err);
        if (mtp && layers) die("--mtp writes the MTP block alone: no --layers");
        if (mtp) hp.nextn_predict_layers = 1;
    }
    const uint32_t n_vocab = glm ? ghp.n_vocab : hp.n_vocab;
    ds4_quant_init();

    imatrix im = {0};
    if (imatrix_path) imatrix_load(imatrix_path, &im);
    const imatrix *imp = imatrix_path ? &im : NULL;

    static plan pl;
    pl.pool = ds4_pool_new(atoi(threads));
    const int n_blocks = glm ? (int)ghp.n_block : (int)hp.n_layer;
    pl.t = calloc((size_t)(glm ? GLM_T_COUNT : DS4_T_COUNT) * (size_t)(n_blocks + 1), sizeof *pl.t);
    if (!pl.t) die("out of memory");
    if (mtp) add_plan_mtp(&pl, st, &hp, (enum ds4_mix)mix);
    for (int l = -1; l < n_blocks && !mtp; l++) {
        if (glm)
            for (int id = 0; id < GLM_T_COUNT; id++)
                add_plan_glm(&pl, st, &ghp, (enum ds4_mix)mix, imp, (enum glm_tensor_id)id, l);
        else
            for (int id = 0; id < DS4_T_COUNT; id++)
                add_plan(&pl, st, &hp, (enum ds4_mix)mix, imp, &slice, (enum ds4_tensor_id)id, l);
    }

    /* a layer range (or the MTP block alone) leaves other sources unused on purpose */
    if (!layers && !mtp) warn_unused(st, &pl);

    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    if (glm) ds4_glm_hparams_write(w, &ghp);
    else ds4_hparams_write(w, &hp);
    char dflt_name[256];
    if (!name) {
        const char *b = strrchr(in, '/');
        snprintf(dflt_name, sizeof dflt_name, "%s", b && b[1] ? b + 1 : in);
        name = dflt_name;
    }
    ds4_gguf_w_str(w, "general.name", name);
    if (glm) ds4_glm_file_keys_write(w, (enum ds4_mix)mix);
    else ds4_file_keys_write(w, (enum ds4_mix)mix);
    if (layers) ds4_slice_keys_write(w, (uint32_t)slice.first, (uint32_t)slice.last, slice.output);
    if (imatrix_path) {
        ds4_gguf_w_str(w, "quantize.imatrix.file", imatrix_path);
        ds4_gguf_w_u32(w, "quantize.imatrix.entries_count", (uint32_t)im.n);
    }
    char tok_path[4096];
    /* ds4's tokenizer import is DeepSeek's; GLM's vocabulary (glm4
     * pre-tokenizer, padded to vocab_size) is not converted yet */
    if (glm && vocab) die("--vocab: GLM tokenizers are not converted yet");
    if (!vocab && !glm && !mtp) {
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", in);
        if (!access(tok_path, R_OK)) vocab = tok_path;
    }
    if (vocab) {
        /* The embedding rows and the token list must describe the same ids. */
        ds4_tokenizer *tok = ds4_tokenizer_from_hf_json(vocab, vocab_added, err, sizeof err);
        if (!tok) die("%s: %s", vocab, err);
        int32_t n_tok = ds4_tokenizer_n_vocab(tok);
        ds4_tokenizer_free(tok);
        if ((uint32_t)n_tok != n_vocab)
            die("%s has %d tokens but vocab_size is %u", vocab, n_tok, n_vocab);
        if (ds4_tokenizer_gguf_from_hf_json(w, vocab, vocab_added, err, sizeof err)) die("%s: %s", vocab, err);
    }

    for (size_t i = 0; i < pl.n; i++) {
        out_tensor *o = &pl.t[i];
        ds4_gguf_w_tensor(w, o->name, o->type, (uint32_t)o->n_dims, o->ne, NULL);
        pl.t0_bytes += (double)ds4_type_row_bytes(o->type, o->ne[0]) * (double)(o->ne[1] * o->ne[2] * o->ne[3]);
    }
    fprintf(stderr, "ds4-convert: %s -> %s (%s, %zu tensors, %.1f MiB, %d source shard%s%s)\n", in, out,
            ds4_mix_name((enum ds4_mix)mix), pl.n, pl.t0_bytes / 1048576.0, ds4_st_n_shards(st),
            ds4_st_n_shards(st) == 1 ? "" : "s", vocab ? ", with tokenizer" : ", no tokenizer");
    pl.t_start = now_s();
    if (ds4_gguf_writer_write_file(w, out, fill, &pl, err, sizeof err))
        die("%s", atomic_load(&pl.failed) ? pl.err : err);
    ds4_gguf_writer_free(w);
    for (size_t i = 0; i < pl.n; i++) free(pl.t[i].parts);
    free(pl.t);
    ds4_pool_free(pl.pool);
    for (size_t i = 0; i < im.n; i++) { free(im.e[i].name); free(im.e[i].v); }
    free(im.e);
    ds4_st_close(st);
    return 0;
}
