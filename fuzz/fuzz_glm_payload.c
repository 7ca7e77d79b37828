/* Fuzz target: the GLM session payload loader (glm_payload.h) over a small
 * synthetic geometry (3 layers, the first and last with indexer keys; latent
 * 8, rope 4, indexer 4; vocab 16; ctx 32). Invariants (abort() on
 * violation): a refused payload leaves the state exactly as it was (n_pos,
 * rows, tokens, logits), or empty when a row held a value no state holds
 * (NaN, Inf, past DS4_KV_MAX_ABS: the rows are read in place); a payload
 * that loads is written back byte for byte (up to the saved-context field,
 * which names the target's context); the
 * streaming load over a source cut short never claims success. */
#include "models/glm/glm_kv.h"
#include "models/glm/glm_payload.h"
#include "models/dsv4/kv_payload.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { CTX = 32, VOCAB = 16 };

static glm_kv *kv;
static int32_t toks[CTX];
static float logits[VOCAB];

static void init(void) {
    static glm_hparams hp;
    hp.n_block = 3;
    hp.kv_lora_rank = 8;
    hp.n_rot = 4;
    hp.idx_head_dim = 4;
    hp.indexer_full[0] = hp.indexer_full[2] = true;
    kv = ds4_glm_kv_new(&hp, CTX);
    if (!kv) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!kv) init();
    /* a known state before each load, so a refusal can be checked against it */
    kv->n_pos = 3;
    for (int i = 0; i < 3; i++) toks[i] = i;
    memset(logits, 0, sizeof logits);
    const size_t state = (size_t)kv->bytes;
    unsigned char *before = malloc(state + 1);
    if (!before) abort();
    memcpy(before, kv->block, state);
    char err[256];
    if (!ds4_glm_payload_load(kv, toks, logits, VOCAB, data, size, err, sizeof err)) {
        /* rows are read in place: one holding a value no state holds leaves the state empty */
        const bool emptied = kv->n_pos == 0 && strstr(err, "rows hold");
        if (!emptied && (kv->n_pos != 3 || memcmp(before, kv->block, state) || toks[0] != 0 || toks[2] != 2)) abort();
        free(before);
        return 0;
    }
    free(before);
    const size_t n = ds4_glm_payload_bytes(kv, VOCAB);
    if (n != size) abort();
    unsigned char *out = malloc(n);
    if (!out) abort();
    ds4_glm_payload_write(kv, toks, logits, VOCAB, out);
    /* field 3 (saved context) becomes this state's; the empty-session logits are zeros */
    if (memcmp(out, data, 12) || memcmp(out + 16, data + 16, kv->n_pos ? n - 16 : 24)) abort();
    /* the same bytes cut short never load */
    if (n > 1) {
        ds4_memory_stream m = {.src = data, .left = n - 1};
        const ds4_source src = ds4_memory_source(&m);
        if (ds4_glm_payload_load_from(kv, toks, logits, VOCAB, &src, n, err, sizeof err)) abort();
    }
    free(out);
    return 0;
}
