/* engine_kvdisk.h -- binds the disk KV cache (kvdisk.h, state layer) to
 * engine sessions, so front ends open a cache over an engine.
 *
 * Contract
 * - The host it supplies: the key text is the engine tokenizer's decode of
 *   the session's tokens (specials as text); payloads stream through
 *   ds4_session_save_payload_to() / ds4_session_load_payload_from(), and a
 *   restored session whose tokens do not decode to the file's key text is
 *   emptied and refused; quant
 *   bits and the <|User|> / <|Assistant|> ids come from the engine's model.
 * - The engine must outlive the cache.
 */
#ifndef DS4_ENGINE_KVDISK_H
#define DS4_ENGINE_KVDISK_H

#include "engine/engine.h"
#include "kvdisk/kvdisk.h"

ds4_kvdisk *ds4_engine_kvdisk_open(const ds4_kvdisk_opts *o, ds4_engine *e, struct ds4_toolmem *mem,
                                   ds4_kvdisk_log_fn log, void *log_ud, char *err, size_t errlen);

#endif
