/* endpoints.h -- the inference endpoints the worker runs, one job at a time,
 * on the live session: chat completions, Responses and Messages
 * (endpoint_chat.c) and legacy completions (endpoint_completions.c).
 *
 * Contract
 * - Each runs the whole job: plan the prompt (prefix.h), reject what does
 *   not fit the context, prefill (job.h), generate with the shared loop
 *   (generate.h), and write the complete response or stream; it sets
 *   j->keep_alive. Errors go out in the family's shape (ds4_job_error()).
 */
#ifndef DS4_ENDPOINTS_H
#define DS4_ENDPOINTS_H

#include "server/server_state.h"

void ds4_srv_run_chat(server *s, job *j);
void ds4_srv_run_completions(server *s, job *j);

#endif
