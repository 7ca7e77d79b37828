/* engine_kvdisk.c -- the disk KV cache's host over engine sessions. */
#include "engine/engine_kvdisk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static char *session_key_text(void *ud, const ds4_session *s, size_t *len) {
    const ds4_engine *e = ud;
    return ds4_tokenizer_decode(ds4_engine_tokenizer(e), ds4_session_tokens(s), (size_t)ds4_session_n_tokens(s), false,
                                len);
}

static int session_load(void *ud, ds4_session *s, const ds4_source *src, size_t n, const char *key_text, size_t key_len,
                        char *err, size_t errlen) {
    if (ds4_session_load_payload_from(s, src, n, err, errlen)) return -1;
    size_t len = 0;
    char *text = session_key_text(ud, s, &len);
    const bool same = text && len == key_len && !memcmp(text, key_text, len);
    free(text);
    if (same) return 0;
    char why[256];
    snprintf(err, errlen, "its %d tokens do not decode to its key text; the session is now empty",
             ds4_session_n_tokens(s));
    ds4_session_rewind(s, 0, why, sizeof why);
    return -1;
}

ds4_kvdisk *ds4_engine_kvdisk_open(const ds4_kvdisk_opts *o, ds4_engine *e, struct ds4_toolmem *mem,
                                   ds4_kvdisk_log_fn log, void *log_ud, char *err, size_t errlen) {
    const ds4_special_ids *sp = ds4_tokenizer_specials(ds4_engine_tokenizer(e));
    const ds4_kvdisk_host host = {
        .ud = e,
        .quant_bits = (uint8_t)ds4_engine_expert_bits(e),
        .user_tok = sp->user,
        .assistant_tok = sp->assistant,
        .n_tokens = ds4_session_n_tokens,
        .ctx = ds4_session_ctx,
        .key_text = session_key_text,
        .payload_bytes = ds4_session_payload_bytes,
        .save_payload = ds4_session_save_payload_to,
        .load_payload = session_load,
    };
    return ds4_kvdisk_open(o, &host, mem, log, log_ud, err, errlen);
}
