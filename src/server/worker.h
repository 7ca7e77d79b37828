/* worker.h -- the inference worker: the one thread that touches the engine.
 *
 * Contract
 * - ds4_srv_worker_main() takes jobs from the queue (queue.h) until it is stopped
 *   and empty, runs each with its endpoint (endpoints.h) and reports it
 *   finished. Jobs left when the server stops get 503; a job whose client
 *   left before it started is dropped without running.
 */
#ifndef DS4_WORKER_H
#define DS4_WORKER_H

void *ds4_srv_worker_main(void *server_state);

#endif
