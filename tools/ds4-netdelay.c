/* ds4-netdelay -- an Ethernet switch in user space that delays every frame,
 * for link benchmarks on kernels without the netem qdisc (docs/distributed.md,
 * tests/dist/netns_hosts.sh).
 *
 *   ds4-netdelay --delay MS [--limit FRAMES] NETNS...
 *
 * Contract
 * - Makes a TAP device named eth0 in each named network namespace (as `ip
 *   netns add` makes them, under /run/netns) and switches Ethernet frames
 *   between them: a frame goes to the port its destination MAC was last seen
 *   on as a source, broadcast and unknown destinations to every other port.
 * - Every frame, in both directions and of every kind (data, ACKs, SYNs,
 *   ARP), leaves MS milliseconds after it arrived, so a round trip between
 *   two hosts pays 2 x MS, as `tc qdisc ... netem delay MS` on each host's
 *   link does. Frames are stamped on arrival and released by an absolute
 *   timer at arrival + MS; the delay is the same for all, so one FIFO keeps
 *   them in release order and frames arriving back to back leave back to
 *   back: the delay adds latency, never a bandwidth cap.
 * - Not modelled: bandwidth limits, loss, jitter, reordering. What the
 *   switch's own copying costs is what a zero delay measures.
 * - Prints "ready" on stdout once every device exists (the caller then
 *   gives them addresses and brings them up). Runs until SIGTERM or SIGINT
 *   and then prints the frames switched, and dropped because more than
 *   --limit frames (default 100000) were waiting, on stderr; the devices
 *   vanish with the process. Bad arguments or a device it cannot make: one
 *   line on stderr, exit 1. Needs root (setns, TUNSETIFF).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "options/cli_args.h"

/* FRAME_MAX: the largest frame a TAP device hands over (a 64 KiB MTU plus
 * the Ethernet header); MAX_MACS: addresses the switch remembers, far more
 * than the few hosts of a benchmark. */
enum { MAX_PORTS = 16, FRAME_MAX = 65536 + 14, MAX_MACS = 256 };

typedef struct {
    uint64_t due_ns;
    int port;
    uint32_t len;
    uint8_t *bytes;
} frame;

typedef struct {
    frame *ring;
    size_t cap, head, count;
    uint64_t switched, dropped;
} frame_queue;

typedef struct {
    uint8_t mac[6];
    int port;
} mac_entry;

static volatile sig_atomic_t stop_requested;
static void on_stop(int sig) { (void)sig; stop_requested = 1; }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A TAP device named eth0 inside namespace `name`; the fd stays with this
 * process, which stays in its own namespace. -1 with a line in err. */
static int open_tap_in(const char *name, char *err, size_t errlen) {
    char path[300];
    snprintf(path, sizeof path, "/run/netns/%s", name);
    const int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    const int there = open(path, O_RDONLY | O_CLOEXEC);
    int tap = -1;
    if (home < 0 || there < 0 || setns(there, CLONE_NEWNET)) {
        snprintf(err, errlen, "cannot enter network namespace %s: %s", name, strerror(errno));
    } else {
        struct ifreq ifr = {0};
        ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
        snprintf(ifr.ifr_name, IFNAMSIZ, "eth0");
        tap = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
        if (tap < 0 || ioctl(tap, TUNSETIFF, &ifr)) {
            snprintf(err, errlen, "cannot make a TAP device eth0 in %s: %s", name, strerror(errno));
            if (tap >= 0) close(tap);
            tap = -1;
        }
        if (setns(home, CLONE_NEWNET)) {   /* the remaining devices belong elsewhere */
            snprintf(err, errlen, "cannot return from network namespace %s: %s", name, strerror(errno));
            if (tap >= 0) close(tap);
            tap = -1;
        }
    }
    if (home >= 0) close(home);
    if (there >= 0) close(there);
    return tap;
}

/* The switch's forwarding table: where a source address was last seen. */
static int port_of(const mac_entry *macs, int n_macs, const uint8_t *mac) {
    for (int i = 0; i < n_macs; i++)
        if (!memcmp(macs[i].mac, mac, 6)) return macs[i].port;
    return -1;
}

static void learn(mac_entry *macs, int *n_macs, const uint8_t *mac, int port) {
    if (mac[0] & 1) return;   /* a group address is never a source */
    for (int i = 0; i < *n_macs; i++)
        if (!memcmp(macs[i].mac, mac, 6)) { macs[i].port = port; return; }
    if (*n_macs == MAX_MACS) return;
    memcpy(macs[*n_macs].mac, mac, 6);
    macs[(*n_macs)++].port = port;
}

/* Reads every frame waiting on port p and queues it for now + delay. */
static void take_frames(frame_queue *q, const int *taps, int p, uint64_t delay_ns, uint8_t *buf, mac_entry *macs,
                        int *n_macs) {
    for (;;) {
        const ssize_t n = read(taps[p], buf, FRAME_MAX);
        if (n < 14) return;   /* EAGAIN, or a runt no host sends */
        const uint64_t due = now_ns() + delay_ns;
        learn(macs, n_macs, buf + 6, p);
        uint8_t *copy = q->count < q->cap ? malloc((size_t)n) : NULL;
        if (!copy) { q->dropped++; continue; }
        memcpy(copy, buf, (size_t)n);
        q->ring[(q->head + q->count++) % q->cap] = (frame){due, p, (uint32_t)n, copy};
    }
}

/* Sends every frame whose time has come; returns the next one's due time
 * (0: the queue is empty). */
static uint64_t release_due(frame_queue *q, const int *taps, int n_ports, const mac_entry *macs, int n_macs) {
    const uint64_t now = now_ns();
    while (q->count && q->ring[q->head].due_ns <= now) {
        frame *f = &q->ring[q->head];
        const int to = f->bytes[0] & 1 ? -1 : port_of(macs, n_macs, f->bytes);
        bool sent = false;
        for (int p = 0; p < n_ports; p++)
            if (p != f->port && (to < 0 || to == p)) sent |= write(taps[p], f->bytes, f->len) == (ssize_t)f->len;
        if (sent) q->switched++;
        else q->dropped++;
        free(f->bytes);
        q->head = (q->head + 1) % q->cap;
        q->count--;
    }
    return q->count ? q->ring[q->head].due_ns : 0;
}

static bool arm(int timer, uint64_t due_ns) {
    struct itimerspec at = {0};   /* zero disarms */
    at.it_value.tv_sec = (time_t)(due_ns / 1000000000u);
    at.it_value.tv_nsec = (long)(due_ns % 1000000000u);
    return timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, NULL) == 0;
}

static int usage(void) {
    fprintf(stderr, "usage: ds4-netdelay --delay MS [--limit FRAMES] NETNS...  (up to %d namespaces)\n", MAX_PORTS);
    return 1;
}

int main(int argc, char **argv) {
    double delay_ms = -1;
    int limit = 100000, first_ns = 0;
    for (int i = 1; i < argc && !first_ns; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--delay")) {
            char *end = NULL;
            delay_ms = v ? strtod(v, &end) : -1;
            if (!v || *end || !(delay_ms >= 0 && delay_ms <= 60000)) {
                fprintf(stderr, "ds4-netdelay: --delay takes milliseconds in 0..60000, not '%s'\n", v ? v : "");
                return 1;
            }
            i++;
        } else if (!strcmp(argv[i], "--limit")) {
            if (!v || !ds4_parse_int(v, 1, 1 << 24, &limit)) {
                fprintf(stderr, "ds4-netdelay: --limit takes a frame count in 1..%d, not '%s'\n", 1 << 24, v ? v : "");
                return 1;
            }
            i++;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "ds4-netdelay: unknown option %s (--delay MS [--limit FRAMES] NETNS...)\n", argv[i]);
            return 1;
        } else {
            first_ns = i;
        }
    }
    const int n_ports = first_ns ? argc - first_ns : 0;
    if (delay_ms < 0 || n_ports < 2 || n_ports > MAX_PORTS) return usage();

    int taps[MAX_PORTS], opened = 0, rc = 1;
    char err[400] = "";
    frame_queue q = {calloc((size_t)limit, sizeof(frame)), (size_t)limit, 0, 0, 0, 0};
    uint8_t *buf = malloc(FRAME_MAX);
    mac_entry *macs = calloc(MAX_MACS, sizeof(mac_entry));
    int n_macs = 0;
    const int ep = epoll_create1(EPOLL_CLOEXEC), timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (!q.ring || !buf || !macs) snprintf(err, sizeof err, "out of memory for a %d-frame queue", limit);
    else if (ep < 0 || timer < 0) snprintf(err, sizeof err, "cannot make an epoll or timer fd: %s", strerror(errno));
    for (; !err[0] && opened < n_ports; opened++) {
        taps[opened] = open_tap_in(argv[first_ns + opened], err, sizeof err);
        if (taps[opened] < 0) break;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)opened};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, taps[opened], &ev))
            snprintf(err, sizeof err, "epoll: %s", strerror(errno));
    }
    struct epoll_event tev = {.events = EPOLLIN, .data.u32 = MAX_PORTS};
    if (!err[0] && epoll_ctl(ep, EPOLL_CTL_ADD, timer, &tev)) snprintf(err, sizeof err, "epoll: %s", strerror(errno));
    if (err[0]) {
        fprintf(stderr, "ds4-netdelay: %s\n", err);
        goto done;
    }
    /* no SA_RESTART: a signal interrupts epoll_wait, which then sees the flag */
    struct sigaction sa = {.sa_handler = on_stop};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("ready\n");
    fflush(stdout);

    const uint64_t delay_ns = (uint64_t)(delay_ms * 1e6);
    uint64_t armed_for = 0;
    while (!stop_requested) {
        struct epoll_event evs[MAX_PORTS + 1];
        const int n = epoll_wait(ep, evs, MAX_PORTS + 1, -1);
        if (n < 0 && errno != EINTR) { fprintf(stderr, "ds4-netdelay: epoll_wait: %s\n", strerror(errno)); goto done; }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u32 == MAX_PORTS) {
                uint64_t expirations;
                if (read(timer, &expirations, sizeof expirations) < 0) { /* EAGAIN: nothing to consume */ }
                armed_for = 0;
            } else {
                take_frames(&q, taps, (int)evs[i].data.u32, delay_ns, buf, macs, &n_macs);
            }
        }
        const uint64_t next = release_due(&q, taps, n_ports, macs, n_macs);
        if (next != armed_for) {
            if (!arm(timer, next)) { fprintf(stderr, "ds4-netdelay: timerfd: %s\n", strerror(errno)); goto done; }
            armed_for = next;
        }
    }
    rc = 0;
    fprintf(stderr, "ds4-netdelay: %llu frames switched, %llu dropped\n", (unsigned long long)q.switched,
            (unsigned long long)q.dropped);
done:
    for (int i = 0; i < opened; i++) close(taps[i]);
    if (ep >= 0) close(ep);
    if (timer >= 0) close(timer);
    while (q.ring && q.count) { free(q.ring[q.head].bytes); q.head = (q.head + 1) % q.cap; q.count--; }
    free(q.ring);
    free(buf);
    free(macs);
    return rc;
}
