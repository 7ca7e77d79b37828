/* listeners.h -- what the accept loop does with one poll() result over its
 * listening sockets.
 *
 * Contract
 * - ds4_listeners_dispatch() walks the n pollfds after poll() returned:
 *   each open listener (fd >= 0) with POLLIN is handed to on_ready(fd, ud);
 *   one reporting POLLERR, POLLHUP or POLLNVAL without POLLIN is closed and
 *   its fd set to -1, because poll() would report it again at once and the
 *   loop would spin on it at full CPU. Closed slots (fd < 0) are skipped,
 *   which poll() itself also does.
 * - Returns how many listeners are still open; 0 means the server can no
 *   longer accept anything.
 */
#ifndef DS4_LISTENERS_H
#define DS4_LISTENERS_H

#include <poll.h>

int ds4_listeners_dispatch(struct pollfd *listeners, int n, void (*on_ready)(int fd, void *ud), void *ud);

#endif
