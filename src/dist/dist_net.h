/* dist_net.h -- the NNG plumbing both distributed modes share: the
 * pipeline (dist.h) and tensor parallelism (tp.h).
 *
 * Contract
 * - ds4_dist_tls: the --dist-tls-* material read once as PEM text (all
 *   NULL: plain TCP); ds4_dist_scheme() the URL scheme it implies.
 * - ds4_dist_listen() / ds4_dist_dial() start a listener or a dialer on a
 *   socket, under mutual TLS when t holds it (each end presents its
 *   certificate and requires the peer's, signed by the CA; a dialer also
 *   requires it to name the host it dials). A dial does not wait for the
 *   connection: NNG retries until the peer is up, and whoever waits for an
 *   answer bounds the wait.
 * - ds4_dist_on_pipe_removed: an nng_pipe_notify callback storing the
 *   socket id of a closed connection into the atomic_int it is given.
 * - ds4_dist_recv_limit() caps what one message may claim: NNG closes a
 *   connection whose length prefix says more, before it buffers the body.
 * - ds4_dist_request() sends one message and decodes the one answer
 *   (unsealed with key when given). ds4_dist_handshake() is the worker's
 *   side of the registration (dist_proto.h: KNOCK, the coordinator's proof
 *   checked before anything is said, the HELLO sealed under the handshake
 *   key): 0 welcomed, 1 refused, -1 no valid answer, -2 no answer in time;
 *   the coordinator's line or the failure in line. With nonces (may be
 *   NULL) it leaves the worker's and the coordinator's nonces there (Nw,
 *   Nc), from which a tensor-parallel link derives its keys; with pipe
 *   (may be NULL) the id of the connection the answer came on (the one
 *   registered). ds4_dist_request's pipe likewise.
 */
#ifndef DS4_DIST_NET_H
#define DS4_DIST_NET_H

#include <nng/nng.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/dist.h"
#include "dist/dist_proto.h"

typedef struct {
    char *cert, *key, *ca;
} ds4_dist_tls;

double ds4_dist_now(void);   /* monotonic seconds */
bool ds4_dist_tls_load(const ds4_dist_params *p, ds4_dist_tls *t, char *err, size_t errlen);
void ds4_dist_tls_free(ds4_dist_tls *t);
const char *ds4_dist_scheme(const ds4_dist_tls *t);
int ds4_dist_listen(nng_socket s, const char *url, const ds4_dist_tls *t, nng_listener *l);   /* l may be NULL */
int ds4_dist_dial(nng_socket s, const char *url, const ds4_dist_tls *t);
void ds4_dist_on_pipe_removed(nng_pipe pipe, nng_pipe_ev ev, void *closed);
void ds4_dist_recv_limit(nng_socket s, size_t max);
/* 0, the transport's error (NNG_ETIMEDOUT: no answer in time), or -1 for an
 * answer that is not a valid frame; a line in err either way; *buf is the
 * caller's to nng_free() on 0. Frees msg. */
int ds4_dist_request(nng_socket s, uint8_t *msg, size_t len, const uint8_t *key, void **buf, size_t *blen,
                     ds4_dist_frame *f, uint32_t *pipe, char *err, size_t errlen);
int ds4_dist_handshake(nng_socket control, const char *secret, ds4_dist_hello me, uint8_t nonces[2][DS4_DIST_NONCE_BYTES],
                       uint32_t *pipe, char *line, size_t linelen);

#endif
