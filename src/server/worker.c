#include "server/worker.h"

#include <unistd.h>

#include "server/batcher.h"
#include "server/endpoints.h"
#include "server/job.h"

void *ds4_srv_worker_main(void *server_state) {
    server *s = server_state;
    for (;;) {
        bool stopping;
        job *j = ds4_queue_take(s, &stopping);
        if (!j) break;
        if (stopping) {
            ds4_job_error(s, j, 503, "server shutting down", NULL, NULL, 0);
        } else if (ds4_http_peer_gone(j->conn)) {
            ds4_srv_trace(s, "queued request dropped: client went away");
            j->keep_alive = false;
        } else {
            if (s->batcher) ds4_batcher_busy(s->batcher, true);
            if (j->req.api == DS4_API_COMPLETIONS) ds4_srv_run_completions(s, j);
            else ds4_srv_run_chat(s, j);
            if (s->batcher) ds4_batcher_busy(s->batcher, false);
            /* test only: the window in which a client that has read its
             * answer sends the next turn while this slot is still busy,
             * open while the test's gate file exists (a fixed sleep would
             * make the test race it) */
            while (s->o.test_linger_gate && !access(s->o.test_linger_gate, F_OK) && !atomic_load(&ds4_srv_stop))
                usleep(10000);
        }
        ds4_queue_finish(s, j);
    }
    return NULL;
}
