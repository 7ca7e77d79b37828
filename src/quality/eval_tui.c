#include "quality/eval_tui.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#define LIST_W 26

struct ds4_eval_tui {
    FILE *out;                  /* the terminal's output stream */
    const ds4_eval_run *r;
    volatile sig_atomic_t *interrupted;
    struct termios saved;
    int rows, cols;
    int sel, top, current, queued, done;
    bool paused, quit;
    ds4_buf stream;            /* the reply of the question in flight */
    double last_draw;
    unsigned char esc[3];      /* a pending escape sequence */
    int n_esc;
};

static const char *mark(const ds4_eval_item *it) {
    switch (it->state) {
    case DS4_EVAL_RUNNING: return "....";
    case DS4_EVAL_DONE: return it->v.pass ? "PASS" : "FAIL";
    case DS4_EVAL_UNFINISHED: return "STOP";
    default: return "";
    }
}

/* Columns a code point takes: 2 for the East Asian wide blocks, 0 for
 * combining marks, else 1. An estimate (no locale tables): autowrap is off
 * while the view is up, so a miss clips a line instead of scrolling. */
static int cp_width(unsigned cp) {
    if ((cp >= 0x0300 && cp <= 0x036F) || (cp >= 0x200B && cp <= 0x200F) || (cp >= 0xFE00 && cp <= 0xFE0F)) return 0;
    if ((cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x2E80 && cp <= 0xA4CF) || (cp >= 0xAC00 && cp <= 0xD7A3) ||
        (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0xFE30 && cp <= 0xFE4F) || (cp >= 0xFF00 && cp <= 0xFF60) ||
        (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x1F300 && cp <= 0x1FAFF) || (cp >= 0x20000 && cp <= 0x3FFFD))
        return 2;
    return 1;
}

/* The UTF-8 sequence at s[0..n): its length (1 for a stray byte) and code point. */
static size_t utf8_at(const unsigned char *s, size_t n, unsigned *cp) {
    size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 1;
    if (len > n) len = 1;
    *cp = len == 1 ? s[0] : (unsigned)(s[0] & (0xFF >> (len + 1)));
    for (size_t i = 1; i < len; i++) *cp = (*cp << 6) | (s[i] & 0x3F);
    return len;
}

/* The stream wrapped at w columns; the last `max` lines are kept in a ring
 * (starts/lens); returns how many lines there are in all. */
static int stream_lines(const ds4_buf *b, int w, int max, const char **starts, int *lens) {
    int n = 0, col = 0;
    const char *s = b->data ? b->data : "";
    const char *line = s, *end = s + b->len;
    for (const char *p = s;; ) {
        unsigned cp = '\n';
        size_t len = p < end ? utf8_at((const unsigned char *)p, (size_t)(end - p), &cp) : 0;
        int cw = cp == '\n' ? 0 : cp_width(cp);
        if (p == end || cp == '\n' || col + cw > w) {
            starts[n % max] = line;
            lens[n % max] = (int)(p - line);
            n++;
            if (p == end) break;
            if (cp == '\n') { p += len; line = p; col = 0; continue; }
            line = p;
            col = 0;
        }
        col += cw;
        p += len;
    }
    return n;
}

static void put_clean(FILE *out, const char *s, int n) {
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        fputc(c < 0x20 || c == 0x7f ? ' ' : c, out);
    }
}

static void draw(ds4_eval_tui *t) {
    struct winsize ws;
    if (!ioctl(fileno(t->out), TIOCGWINSZ, &ws) && ws.ws_row > 4 && ws.ws_col > LIST_W + 10) {
        t->rows = ws.ws_row;
        t->cols = ws.ws_col;
    }
    const ds4_eval_run *r = t->r;
    int passed = 0, graded = 0;
    for (int i = 0; i < r->n; i++)
        if (r->items[i].state == DS4_EVAL_DONE) { graded++; passed += r->items[i].v.pass; }
    int body = t->rows - 2;
    if (t->sel < t->top) t->top = t->sel;
    if (t->sel >= t->top + body) t->top = t->sel - body + 1;
    fprintf(t->out, "\x1b[H\x1b[7m ds4-eval  %d/%d done  passed %d/%d%s  p pause  q quit  Up/Down  Enter run next\x1b[K\x1b[0m\r\n",
           graded, r->n, passed, graded, t->paused ? "  PAUSED" : "");
    const char *starts[256];
    int lens[256];
    int max = body < 256 ? body : 256;
    int w = t->cols - LIST_W - 3;
    /* the selected question's reply once it ran; else the live stream */
    const ds4_eval_item *shown = t->sel != t->current && r->items[t->sel].output ? &r->items[t->sel] : NULL;
    ds4_buf view = shown ? (ds4_buf){.data = shown->output, .len = shown->output_len} : t->stream;
    int n = stream_lines(&view, w, max, starts, lens);
    int first = n > max ? n - max : 0;
    for (int row = 0; row < body; row++) {
        int i = t->top + row;
        if (i < r->n) {
            const ds4_eval_item *it = &r->items[i];
            fprintf(t->out, "%s%c q%-3d %-4s %-4s%s", i == t->sel ? "\x1b[7m" : "", i == t->queued ? '>' : ' ', it->q->id,
                   ds4_eval_category_name(it->q->cat), mark(it), i == t->sel ? "\x1b[0m" : "");
            fprintf(t->out, "%*s", LIST_W - 16, "");
        } else {
            fprintf(t->out, "%*s", LIST_W, "");
        }
        fprintf(t->out, " | ");
        int k = first + row;
        if (k < n) put_clean(t->out, starts[k % max], lens[k % max]);
        fprintf(t->out, "\x1b[K\r\n");
    }
    const ds4_eval_item *cur = t->current >= 0 ? &r->items[t->current] : NULL;
    if (shown) fprintf(t->out, " q%d (%s): %s, answer %s, expected %s, %d tokens\x1b[K", shown->q->id, ds4_eval_category_name(shown->q->cat),
                      mark(shown), shown->v.picked[0] ? shown->v.picked : "-", shown->q->answer, shown->gen_tokens);
    else if (cur) fprintf(t->out, " running q%d (%s): %zu prompt tokens, expected %s\x1b[K", cur->q->id, ds4_eval_category_name(cur->q->cat),
                    cur->prompt.n, cur->q->answer);
    else fprintf(t->out, " idle\x1b[K");
    fflush(t->out);
    t->last_draw = ds4_eval_clock();
}

static void key(ds4_eval_tui *t, unsigned char c) {
    if (t->n_esc) {
        t->esc[t->n_esc++] = c;
        if (t->n_esc == 2 && c != '[' && c != 'O') t->n_esc = 0;
        else if (t->n_esc == 3) {
            if (c == 'A' && t->sel > 0) t->sel--;
            if (c == 'B' && t->sel < t->r->n - 1) t->sel++;
            t->n_esc = 0;
        }
        return;
    }
    if (c == 0x1b) { t->esc[0] = c; t->n_esc = 1; }
    else if (c == 'p') t->paused = !t->paused;
    else if (c == 'q') t->quit = true;
    else if (c == '\r' || c == '\n') {
        if (t->r->items[t->sel].state == DS4_EVAL_PENDING) t->queued = t->sel;
    }
}

/* Reads what was typed; waits up to ms for the first byte. */
static void read_keys(ds4_eval_tui *t, int ms) {
    struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
    bool changed = false;
    while (poll(&p, 1, ms) > 0 && (p.revents & POLLIN)) {
        unsigned char buf[64];
        ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; i++) key(t, buf[i]);
        changed = true;
        ms = 0;
    }
    if (changed) draw(t);
}

static bool tui_poll(void *ud) {
    ds4_eval_tui *t = ud;
    read_keys(t, 0);
    while (t->paused && !t->quit && !*t->interrupted) read_keys(t, 200);
    return t->quit || *t->interrupted;
}

static void tui_start(void *ud, int item) {
    ds4_eval_tui *t = ud;
    t->current = t->sel = item;
    if (t->queued == item) t->queued = -1;
    ds4_buf_clear(&t->stream);
    draw(t);
}

static void tui_text(void *ud, const char *s, size_t n) {
    ds4_eval_tui *t = ud;
    ds4_buf_put(&t->stream, s, n);
    if (ds4_eval_clock() - t->last_draw > 0.05) draw(t);
}

static void tui_end(void *ud, int item) {
    ds4_eval_tui *t = ud;
    (void)item;
    t->current = -1;
    draw(t);
}

static int tui_next(void *ud) { return ((ds4_eval_tui *)ud)->queued; }

ds4_eval_tui *ds4_eval_tui_open(const ds4_eval_run *r, FILE *out, volatile sig_atomic_t *interrupted) {
    if (!isatty(STDIN_FILENO) || !isatty(fileno(out))) return NULL;
    ds4_eval_tui *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    if (tcgetattr(STDIN_FILENO, &t->saved)) { free(t); return NULL; }
    struct termios raw = t->saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &raw)) { free(t); return NULL; }
    t->r = r;
    t->out = out;
    t->interrupted = interrupted;
    t->rows = 24;
    t->cols = 80;
    t->current = t->queued = -1;
    fprintf(t->out, "\x1b[?1049h\x1b[?25l\x1b[?7l\x1b[2J");
    draw(t);
    return t;
}

ds4_eval_view ds4_eval_tui_view(ds4_eval_tui *t) {
    return (ds4_eval_view){.start = tui_start, .text = tui_text, .end = tui_end, .poll = tui_poll, .next = tui_next, .ud = t};
}

void ds4_eval_tui_close(ds4_eval_tui *t) {
    if (!t) return;
    fprintf(t->out, "\x1b[?7h\x1b[?25h\x1b[?1049l");
    fflush(t->out);
    tcsetattr(STDIN_FILENO, TCSANOW, &t->saved);
    ds4_buf_free(&t->stream);
    free(t);
}
