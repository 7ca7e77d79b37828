/* listeners.c -- the accept loop's handling of one poll() result; see
 * listeners.h for the contract. */
#include "server/listeners.h"
#include "base/log.h"

#include <stdio.h>
#include <unistd.h>

int ds4_listeners_dispatch(struct pollfd *listeners, int n, void (*on_ready)(int fd, void *ud), void *ud) {
    int open_count = 0;
    for (int i = 0; i < n; i++) {
        struct pollfd *l = &listeners[i];
        if (l->fd < 0) continue;
        if (l->revents & POLLIN) {
            on_ready(l->fd, ud);
        } else if (l->revents & (POLLERR | POLLHUP | POLLNVAL)) {
            ds4_log(DS4_LOG_WARN, "ds4-server: a listening socket failed; closing it\n");
            /* POLLNVAL: the descriptor is already gone, nothing to close. */
            if (!(l->revents & POLLNVAL)) close(l->fd);
            l->fd = -1;
            continue;
        }
        open_count++;
    }
    return open_count;
}
