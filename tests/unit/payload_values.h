/* payload_values.h -- test helper shared by the DSV4 and GLM payload tests:
 * a payload whose logits or layer rows hold a value no session state holds
 * (NaN, +-Inf, 3e38, just past DS4_KV_MAX_ABS) is refused with one line
 * naming it; a bad logit leaves the target as it was, a bad row leaves it
 * empty (the rows are read in place); the bound itself (+-65504) is
 * accepted. The family's layout gives where its logits and rows start. The
 * target ends holding the good payload again. */
#ifndef DS4_TEST_PAYLOAD_VALUES_H
#define DS4_TEST_PAYLOAD_VALUES_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/engine.h"

static inline void payload_values_refused(ds4_session *target, const unsigned char *payload, size_t bytes,
                                          size_t logits_off, size_t rows_off, int n_vocab, const char *family) {
    static const float bad_values[] = {NAN, INFINITY, -INFINITY, 3e38f, -3e38f, 65536.0f};
    char err[256];
    unsigned char *q = malloc(bytes);
    CHECK(q && ds4_session_load_payload(target, payload, bytes, err, sizeof err) == 0, "%s good payload: %s", family,
          err);
    if (!q) return;
    const int held = ds4_session_n_tokens(target);
    const size_t places[] = {logits_off + 4 * (size_t)(n_vocab / 2), rows_off, rows_off + (bytes - rows_off) / 2 / 4 * 4,
                             bytes - 4};
    for (size_t v = 0; v < sizeof bad_values / sizeof bad_values[0]; v++)
        for (size_t k = 0; k < sizeof places / sizeof places[0]; k++) {
            const bool row = places[k] >= rows_off;
            memcpy(q, payload, bytes);
            memcpy(q + places[k], &bad_values[v], 4);
            err[0] = 0;
            const int rc = ds4_session_load_payload(target, q, bytes, err, sizeof err);
            CHECK(rc == -1 && strstr(err, row ? "rows hold" : "logit") && strstr(err, "not a value a session holds") &&
                      !strchr(err, '\n'),
                  "%s payload with %g at byte %zu: rc %d, %s", family, (double)bad_values[v], places[k], rc, err);
            CHECK(ds4_session_n_tokens(target) == (row ? 0 : held), "%s payload with %g at byte %zu left %d tokens",
                  family, (double)bad_values[v], places[k], ds4_session_n_tokens(target));
            if (row) ds4_session_load_payload(target, payload, bytes, err, sizeof err);
        }
    for (int sign = -1; sign <= 1; sign += 2) {
        const float edge = (float)sign * 65504.0f;
        memcpy(q, payload, bytes);
        memcpy(q + places[0], &edge, 4);
        memcpy(q + places[1], &edge, 4);
        CHECK(ds4_session_load_payload(target, q, bytes, err, sizeof err) == 0, "%s payload holding %g refused: %s",
              family, (double)edge, err);
    }
    CHECK(ds4_session_load_payload(target, payload, bytes, err, sizeof err) == 0, "%s good payload again: %s", family,
          err);
    free(q);
}
#endif
