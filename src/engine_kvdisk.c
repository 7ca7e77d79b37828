/* engine_kvdisk.c -- the disk KV cache's host over engine sessions. */
#include "engine_kvdisk.h"

#include "tokenizer.h"

static char *session_key_text(void *ud, const ds4_session *s, size_t *len) {
    const ds4_engine *e = ud;
    return ds4_tokenizer_decode(ds4_engine_tokenizer(e), ds4_session_tokens(s), (size_t)ds4_session_n_tokens(s), false,
                                len);
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
        .load_payload = ds4_session_load_payload_from,
    };
    return ds4_kvdisk_open(o, &host, mem, log, log_ud, err, errlen);
}
