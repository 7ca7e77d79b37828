/* metrics.h -- the counters behind GET /metrics (Prometheus text format
 * 0.0.4), as llama-server and vLLM expose them.
 *
 * Contract
 * - One set of counters per process; every function is thread-safe (the
 *   connection threads and every slot's worker record into it).
 * - Counters only grow: requests by endpoint and HTTP status, prompt /
 *   cached / generated tokens, prefill and decode tokens with the seconds
 *   they took (a scraper derives recent tokens/s from their rates; the
 *   tokens/s gauges are the averages since start, as llama-server's),
 *   prompts by how their prefix was reused (live session, disk cache, cold),
 *   speculative decoding's verification passes and drafted / kept tokens.
 * - A request that got no response because its client had closed the
 *   connection (ds4_metrics_request() with status 0) is counted under
 *   status="client_closed", never a made-up HTTP code: a query on real
 *   statuses ("5..") stays true, and the totals still add up to every
 *   request read.
 * - ds4_metrics_render() appends the exposition text, with the gauges the
 *   caller passes in (slots, busy slots, queued requests, KV bytes
 *   allocated, tokens held and the bytes of state they fill: the sessions'
 *   payload sizes, what saving each to the disk cache would write) and,
 *   with a disk cache, its saves: files written, failures by reason
 *   (no_space, other), writes that met a full disk, files evicted to make
 *   room on one, and a 0/1 gauge for "the latest save failed for lack of
 *   space" (the cache is not keeping up with the disk).
 */
#ifndef DS4_METRICS_H
#define DS4_METRICS_H

#include <stdint.h>

#include "base/json_util.h"
#include "kvdisk/kvdisk.h"

/* status: of the response head sent, 0 when none was (the client left) */
void ds4_metrics_request(const char *path, int status);
void ds4_metrics_tokens(int prompt, int cached, int generated);
void ds4_metrics_prefill(int tokens, double seconds);
void ds4_metrics_decode(int tokens, double seconds);
/* speculative decoding: verification passes, drafted tokens, drafted tokens
 * kept, and the steps the draft model ran on */
void ds4_metrics_spec(uint64_t passes, uint64_t drafted, uint64_t accepted, uint64_t model_runs);
/* how: the prompt planner's reuse description (prefix.h) */
void ds4_metrics_prefix(const char *how);

typedef struct {
    int slots, slots_busy, queued;
    uint64_t kv_bytes;                  /* allocated for every slot's session */
    uint64_t kv_tokens, kv_state_bytes; /* the tokens the sessions hold, and the state they fill */
    const ds4_kvdisk_stats *kv_disk;    /* the disk cache's saves (kvdisk.h); NULL: no disk cache */
} ds4_metrics_gauges;
void ds4_metrics_render(ds4_buf *out, const ds4_metrics_gauges *g);

#endif
