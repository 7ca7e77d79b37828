#include "agent/display.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DIM "\033[2m"
#define RESET "\033[0m"
#define BAR_WIDTH 30

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void ds4_agent_display_init(ds4_agent_display *d, FILE *out, FILE *status) {
    memset(d, 0, sizeof *d);
    d->out = out;
    d->status = status;
    d->color = isatty(fileno(out));
    /* the bar is for someone watching: with the answer going to a file or
     * a pipe (ds4-agent -p ... > out) it would only clutter the terminal */
    d->status_tty = isatty(fileno(status)) && isatty(fileno(out));
    d->show_reasoning = true;
}

static void put(ds4_agent_display *d, const char *s, size_t n) {
    if (!n) return;
    fwrite(s, 1, n, d->out);
    d->mid_line = s[n - 1] != '\n';
}

static void newline_if_needed(ds4_agent_display *d) {
    if (d->mid_line) put(d, "\n", 1);
}

static void switch_channel(ds4_agent_display *d, int channel) {
    if (d->channel == channel) return;
    if (d->channel == 1 && d->color) fputs(RESET, d->out);
    newline_if_needed(d);
    if (channel == 1 && d->color) fputs(DIM, d->out);
    d->channel = channel;
}

void ds4_agent_display_reasoning(ds4_agent_display *d, const char *s, size_t n) {
    if (!d->show_reasoning) return;
    switch_channel(d, 1);
    put(d, s, n);
    fflush(d->out);
}

void ds4_agent_display_answer(ds4_agent_display *d, const char *s, size_t n) {
    /* the model's answer usually starts after the reasoning's blank line */
    if (d->channel != 2) while (n && (*s == '\n')) { s++; n--; }
    if (!n) return;
    switch_channel(d, 2);
    put(d, s, n);
    fflush(d->out);
}

void ds4_agent_display_end(ds4_agent_display *d) {
    switch_channel(d, 0);
    fflush(d->out);
}

void ds4_agent_display_tool_start(ds4_agent_display *d, const char *name, const char *args) {
    switch_channel(d, 0);
    size_t alen = strlen(args);
    fprintf(d->out, "-> %s %.*s%s", name, (int)(alen > 90 ? 90 : alen), args, alen > 90 ? "..." : "");
    snprintf(d->tool, sizeof d->tool, "%s", name);
    d->tool_interrupted = false;
    d->mid_line = true;
    fflush(d->out);
}

void ds4_agent_display_tool_end(ds4_agent_display *d, const char *summary, const char *extra, size_t extra_len) {
    if (d->tool_interrupted) fprintf(d->out, "-> %s  %s\n", d->tool, summary);
    else fprintf(d->out, "  %s\n", summary);
    if (extra_len) {
        if (d->color) fputs(DIM, d->out);
        fwrite(extra, 1, extra_len, d->out);
        if (d->color) fputs(RESET, d->out);
    }
    d->mid_line = false;
    fflush(d->out);
}

void ds4_agent_display_interject(ds4_agent_display *d) {
    newline_if_needed(d);
    d->tool_interrupted = true;
    fflush(d->out);
}

void ds4_agent_display_note(ds4_agent_display *d, const char *fmt, ...) {
    switch_channel(d, 0);
    va_list ap;
    va_start(ap, fmt);
    if (d->color) fputs(DIM, d->out);
    vfprintf(d->out, fmt, ap);
    if (d->color) fputs(RESET, d->out);
    va_end(ap);
    fputc('\n', d->out);
    d->mid_line = false;
    fflush(d->out);
}

void ds4_agent_display_progress_begin(ds4_agent_display *d) {
    d->bar_t0 = now_s();
    d->bar_last = 0;
    d->bar_shown = false;
}

void ds4_agent_display_progress(ds4_agent_display *d, int done, int total) {
    double t = now_s();
    if (!d->status_tty || total <= 0 || (done < total && t - d->bar_last < 0.1)) return;
    d->bar_last = t;
    double dt = t - d->bar_t0, rate = dt > 0 ? done / dt : 0;
    int fill = (int)((long long)BAR_WIDTH * done / total);
    char bar[BAR_WIDTH + 1];
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = 0;
    fflush(d->out);
    fprintf(d->status, "\r\033[Kprefill [%s] %d/%d tokens  %.0f t/s  ETA %.1fs", bar, done, total, rate,
            rate > 0 ? (total - done) / rate : 0.0);
    fflush(d->status);
    d->bar_shown = true;
}

void ds4_agent_display_progress_end(ds4_agent_display *d, int done, bool cancelled) {
    if (d->bar_shown) { fputs("\r\033[K", d->status); fflush(d->status); }
    double dt = now_s() - d->bar_t0;
    ds4_agent_display_note(d, "[prefill %d tokens, %.1f s, %.0f t/s%s]", done, dt, dt > 0 ? done / dt : 0.0,
                           cancelled ? ", interrupted" : "");
}
