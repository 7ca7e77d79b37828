/* route_key.h -- what a request's prompt starts with, for choosing the slot
 * whose session already holds that start (queue.h).
 *
 * Contract
 * - ds4_route_key() writes a request's key: a run of sections, each a
 *   4-byte length and its bytes, in the order the prompt renders them: the
 *   rendering choices (API family, chat profile, thinking mode), the tool
 *   definitions, then one section per message (role, content, reasoning,
 *   tool calls, tool-call id); for the legacy completions API the prompt
 *   text or token ids, cut into 256-byte sections. The key is built from
 *   the decoded request, so JSON member order, spacing and sampling
 *   parameters do not change it.
 * - ds4_route_shared() is the bytes (section contents) of the whole
 *   sections two keys share from the start. Sharing a section means the
 *   prompts render the same up to its end; a prefix inside a section (two
 *   user messages that start alike, a template's first tokens) counts as
 *   nothing, and the rendering choices must match but weigh nothing, so an
 *   unrelated request shares 0 with every slot. A key cut short (a slot
 *   keeps only the start of long ones) shares at most its whole sections;
 *   ds4_route_shared(a, a) is a key's own weight.
 * - Out of memory gives an empty key (b->oom): routing then only loses the
 *   match.
 */
#ifndef DS4_ROUTE_KEY_H
#define DS4_ROUTE_KEY_H

#include <stddef.h>

#include "base/json_util.h"
#include "server/request.h"

void ds4_route_key(const ds4_request *r, ds4_buf *b);
size_t ds4_route_shared(const char *a, size_t na, const char *b, size_t nb);

#endif
