/* log.h -- the one way library code under src/ tells a person something:
 * load reports, warnings, refusals that have no caller to return them to.
 *
 * Contract
 * - ds4_log() formats one message (printf rules) and hands it, whole, to the
 *   process-wide hook: one call is one message, so a hook never sees half a
 *   line. The text is exactly what the library has always written: usually one
 *   line ending in '\n' (a message built in parts arrives as one).
 * - The default hook writes those bytes to stderr and nothing else; binaries
 *   that install no hook print what they always printed.
 * - ds4_log_set_hook(fn, ud) replaces the hook for the whole process; NULL
 *   restores the default. It may be called from any thread; a message being
 *   delivered while the hook changes goes to the old or the new one, whole.
 * - A hook must not call ds4_log_set_hook(); it may call ds4_log().
 * - No library file writes to stderr or stdout itself (tests/repo/
 *   test_lib_stdio.sh); the binaries in app/ and tools/ print their own output.
 */
#ifndef DS4_LOG_H
#define DS4_LOG_H

#include <stddef.h>

typedef enum {
    DS4_LOG_DEBUG,   /* asked for with a flag (--debug, --ssd-streaming-stats) */
    DS4_LOG_INFO,    /* load reports, listening, shutting down */
    DS4_LOG_WARN,    /* something degraded but the process goes on */
    DS4_LOG_ERROR,   /* something refused or failed */
} ds4_log_level;

/* text: the message's bytes (NUL-terminated, len of them). */
typedef void (*ds4_log_hook)(void *ud, ds4_log_level level, const char *text, size_t len);

void ds4_log_set_hook(ds4_log_hook fn, void *ud);
void ds4_log(ds4_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends formatted text to the NUL-terminated message in buf (cap bytes),
 * for a message built in parts that must reach the hook as one; text past
 * the buffer's end is cut. */
void ds4_log_append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
