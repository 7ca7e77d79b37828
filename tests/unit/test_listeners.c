/* test_listeners.c -- the accept loop's poll-result handling (issue 9, item
 * 2.9): a listener in error without POLLIN used to stay in the poll set, so
 * every poll() returned at once and the loop spun at full CPU. The oracle is
 * poll() itself: after dispatch, the same set must not be ready again. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "server/listeners.h"

typedef struct {
    int n_calls;
    int last_fd;
} ready_log;

static void note_ready(int fd, void *ud) {
    ready_log *log = ud;
    log->n_calls++;
    log->last_fd = fd;
}

static int fcntl_closed(int fd) {
    return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

/* A descriptor closed under the loop reports POLLNVAL from the real poll(). */
static void invalid_listener_is_retired(void) {
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0, "socketpair");
    int healthy[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, healthy) == 0, "socketpair");
    close(pair[0]);
    struct pollfd set[2] = {{.fd = pair[0], .events = POLLIN}, {.fd = healthy[0], .events = POLLIN}};
    CHECK(poll(set, 2, 0) == 1 && (set[0].revents & POLLNVAL), "the closed listener reports POLLNVAL");
    ready_log log = {0, -1};
    CHECK(ds4_listeners_dispatch(set, 2, note_ready, &log) == 1, "one listener stays open");
    CHECK(set[0].fd == -1, "the failed listener is retired");
    CHECK(set[1].fd == healthy[0], "the quiet listener is kept");
    CHECK(log.n_calls == 0, "nothing is accepted from a failed listener (%d calls)", log.n_calls);
    /* The regression itself: the next poll must wait, not return at once. */
    CHECK(poll(set, 2, 0) == 0, "the set is quiet after dispatch, so the loop cannot spin");
    close(pair[1]);
    close(healthy[0]);
    close(healthy[1]);
}

/* POLLERR / POLLHUP as a socket reports them: the descriptor is open and
 * must be closed, not leaked. */
static void erroring_listener_is_closed(void) {
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0, "socketpair");
    struct pollfd set[1] = {{.fd = pair[0], .events = POLLIN, .revents = POLLERR}};
    ready_log log = {0, -1};
    CHECK(ds4_listeners_dispatch(set, 1, note_ready, &log) == 0, "no listener left");
    CHECK(set[0].fd == -1 && log.n_calls == 0, "the erroring listener is retired without an accept");
    CHECK(fcntl_closed(pair[0]), "its descriptor is closed");
    close(pair[1]);
}

/* A readable listener is accepted from, even when poll also flags an error
 * (the pending connection is served first, the error shows up next time). */
static void readable_listener_is_served(void) {
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0, "socketpair");
    CHECK(write(pair[1], "x", 1) == 1, "write");
    struct pollfd set[2] = {{.fd = -1, .events = POLLIN}, {.fd = pair[0], .events = POLLIN}};
    CHECK(poll(set, 2, 0) == 1 && (set[1].revents & POLLIN), "the listener is readable");
    ready_log log = {0, -1};
    CHECK(ds4_listeners_dispatch(set, 2, note_ready, &log) == 1, "it stays open");
    CHECK(log.n_calls == 1 && log.last_fd == pair[0], "it is handed to on_ready once");
    close(pair[0]);
    close(pair[1]);
}

int main(void) {
    invalid_listener_is_retired();
    erroring_listener_is_closed();
    readable_listener_is_served();
    return check_done("test_listeners");
}
