/* dist_net.c -- the NNG plumbing both distributed modes share (see dist_net.h). */
#include "dist/dist_net.h"
#include "dist/dist_proto.h"

#include <nng/supplemental/tls/tls.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double ds4_dist_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One request, one reply: the reply, unsealed with key when one is given,
 * is decoded into *f over *buf (caller nng_free()s). 0, the transport's
 * error (NNG_ETIMEDOUT: no answer in time), or -1 for an answer that is
 * not a valid frame; a line in err either way. */
int ds4_dist_request(nng_socket s, uint8_t *msg, size_t len, const uint8_t *key, void **buf, size_t *blen,
                     ds4_dist_frame *f, uint32_t *pipe, char *err, size_t errlen) {
    int rv = msg ? nng_send(s, msg, len, 0) : NNG_ENOMEM;
    free(msg);
    nng_msg *m = NULL;
    if (rv == 0) rv = nng_recvmsg(s, &m, 0);
    if (rv) { snprintf(err, errlen, "%s", nng_strerror(rv)); return rv; }
    if (pipe) *pipe = nng_pipe_id(nng_msg_get_pipe(m));
    *blen = nng_msg_len(m);
    *buf = nng_alloc(*blen ? *blen : 1);
    if (*buf) memcpy(*buf, nng_msg_body(m), *blen);
    nng_msg_free(m);
    if (!*buf) { snprintf(err, errlen, "out of memory"); return NNG_ENOMEM; }
    size_t frame_len = *blen;
    if (key && !ds4_dist_unseal(*buf, *blen, key, DS4_DIST_SEAL_BYTES, &frame_len)) {
        snprintf(err, errlen, "the coordinator's answer fails the handshake seal");
    } else if (ds4_dist_decode(*buf, frame_len, f, err, errlen)) {
        return 0;
    }
    nng_free(*buf, *blen);
    *buf = NULL;
    return -1;
}

void ds4_dist_on_pipe_removed(nng_pipe pipe, nng_pipe_ev ev, void *closed) {
    (void)ev;
    atomic_store((atomic_int *)closed, nng_socket_id(nng_pipe_socket(pipe)));
}

void ds4_dist_tls_free(ds4_dist_tls *t) {
    free(t->cert); free(t->key); free(t->ca);
    *t = (ds4_dist_tls){0};
}

static char *read_text(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long n = -1;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) && (text = malloc((size_t)n + 1)) &&
        fread(text, 1, (size_t)n, f) == (size_t)n) {
        text[n] = 0;
    } else {
        snprintf(err, errlen, "cannot read %s%s", path, f && n >= 0 && !text ? ": out of memory" : "");
        free(text);
        text = NULL;
    }
    if (f) fclose(f);
    return text;
}

bool ds4_dist_tls_load(const ds4_dist_params *p, ds4_dist_tls *t, char *err, size_t errlen) {
    *t = (ds4_dist_tls){0};
    if (!p->tls_cert) return true;
    if ((t->cert = read_text(p->tls_cert, err, errlen)) && (t->key = read_text(p->tls_key, err, errlen)) &&
        (t->ca = read_text(p->tls_ca, err, errlen)))
        return true;
    ds4_dist_tls_free(t);
    return false;
}

const char *ds4_dist_scheme(const ds4_dist_tls *t) { return t->cert ? "tls+tcp" : "tcp"; }

/* Mutual TLS: each end presents this host's certificate and requires the
 * peer's, signed by the CA; a dialing end (host given) also requires it to
 * name that host. */
static int tls_config(const ds4_dist_tls *t, const char *host, nng_tls_config **out) {
    int rv = nng_tls_config_alloc(out, host ? NNG_TLS_MODE_CLIENT : NNG_TLS_MODE_SERVER);
    if (rv) return rv;
    rv = nng_tls_config_own_cert(*out, t->cert, t->key, NULL);
    if (!rv) rv = nng_tls_config_ca_chain(*out, t->ca, NULL);
    if (!rv) rv = nng_tls_config_auth_mode(*out, NNG_TLS_AUTH_MODE_REQUIRED);
    if (!rv && host) rv = nng_tls_config_server_name(*out, host);
    if (rv) nng_tls_config_free(*out);
    return rv;
}

/* Starts a listener on url (TLS configured when t holds it); *l may be NULL. */
int ds4_dist_listen(nng_socket s, const char *url, const ds4_dist_tls *t, nng_listener *l) {
    nng_listener mine;
    if (!l) l = &mine;
    int rv = nng_listener_create(l, s, url);
    nng_tls_config *cfg = NULL;
    if (!rv && t->cert && !(rv = tls_config(t, NULL, &cfg))) {
        rv = nng_listener_set_ptr(*l, NNG_OPT_TLS_CONFIG, cfg);
        nng_tls_config_free(cfg);   /* the listener holds its own reference */
    }
    if (!rv) rv = nng_listener_start(*l, 0);
    return rv;
}

/* Dials url without waiting for the connection (NNG retries until the peer
 * is up). */
int ds4_dist_dial(nng_socket s, const char *url, const ds4_dist_tls *t) {
    nng_dialer d;
    int rv = nng_dialer_create(&d, s, url);
    if (!rv && t->cert) {
        nng_url *u = NULL;
        nng_tls_config *cfg = NULL;
        if (!(rv = nng_url_parse(&u, url)) && !(rv = tls_config(t, u->u_hostname, &cfg))) {
            rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
            nng_tls_config_free(cfg);
        }
        nng_url_free(u);
    }
    if (!rv) rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK);
    return rv;
}

/* Caps what one message on socket s may claim: NNG closes a connection
 * whose length prefix says more, before it allocates or reads the body. */
void ds4_dist_recv_limit(nng_socket s, size_t max) { nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, max); }

/* Registration (dist_proto.h): KNOCK with a fresh nonce, check the
 * coordinator's proof before saying anything, then the HELLO sealed under
 * the handshake key. 0 welcomed, 1 refused, -1 no valid answer, -2 no
 * answer in time; the coordinator's line or the failure in line. */
int ds4_dist_handshake(nng_socket control, const char *secret, ds4_dist_hello me, uint8_t nonces[2][DS4_DIST_NONCE_BYTES],
                       uint32_t *pipe, char *line, size_t linelen) {
    uint8_t nonce_w[DS4_DIST_NONCE_BYTES], nonce_c[DS4_DIST_NONCE_BYTES], proof[DS4_DIST_SEAL_BYTES],
        key[DS4_DIST_SEAL_BYTES];
    if (!ds4_dist_random(nonce_w, sizeof nonce_w)) { snprintf(line, linelen, "cannot draw a random nonce"); return -1; }
    size_t len, blen;
    void *buf;
    ds4_dist_frame f;
    uint8_t *knock = ds4_dist_encode_challenge(nonce_w, NULL, &len);
    int rv = ds4_dist_request(control, knock, len, NULL, &buf, &blen, &f, NULL, line, linelen);
    if (rv) return rv == NNG_ETIMEDOUT ? -2 : -1;
    const bool challenged = f.type == DS4_DIST_CHALLENGE;
    if (challenged) {
        memcpy(nonce_c, f.challenge.nonce, sizeof nonce_c);
        ds4_dist_handshake_key(secret, DS4_DIST_COORDINATOR_PROOF, nonce_w, nonce_c, proof);
    } else {
        snprintf(line, linelen, "%.*s", f.type == DS4_DIST_REFUSED ? (int)f.result.text_len : 0, f.result.text);
    }
    const bool proven = challenged && ds4_dist_same(proof, f.challenge.proof, sizeof proof);
    nng_free(buf, blen);
    if (!challenged) return 1;
    if (!proven) {
        snprintf(line, linelen, "refused: the coordinator does not prove it holds this secret (wrong --dist-secret "
                                "here or there, or not the coordinator)");
        return 1;
    }
    ds4_dist_handshake_key(secret, DS4_DIST_HANDSHAKE_KEY, nonce_w, nonce_c, key);
    if (nonces) {
        memcpy(nonces[0], nonce_w, DS4_DIST_NONCE_BYTES);
        memcpy(nonces[1], nonce_c, DS4_DIST_NONCE_BYTES);
    }
    me.challenge = nonce_c;
    uint8_t *hello = ds4_dist_encode_hello(&me, &len);
    hello = ds4_dist_seal(hello, &len, key, sizeof key);
    if ((rv = ds4_dist_request(control, hello, len, key, &buf, &blen, &f, pipe, line, linelen)))
        return rv == NNG_ETIMEDOUT ? -2 : -1;
    const bool welcome = f.type == DS4_DIST_WELCOME;
    snprintf(line, linelen, "%.*s", welcome || f.type == DS4_DIST_REFUSED ? (int)f.result.text_len : 0, f.result.text);
    nng_free(buf, blen);
    return welcome ? 0 : 1;
}
