/* The agent loop and its session files on the demo model, with scripted
 * model output. Oracles:
 * - the session's tokens equal the tokenization of ds4_chat_render() (DS4
 *   profile, exact DSML replay) of the same conversation, whose tool
 *   results come from running the same calls on a mirror directory;
 * - every token was prefilled or decoded once, and a later turn prefills
 *   exactly its new tokens;
 * - save -> new agent -> switch -> next turn gives the same logits, bit for
 *   bit, as never stopping; a stripped session re-prefills to the same text;
 * - damaged, foreign and other-model files are refused; a failed save
 *   (file-size limit) keeps the previous file; files are 0600;
 * - Ctrl+C during a command kills it, and its result reaches the model
 *   with the next message. */
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/loop.h"
#include "check.h"
#include "text/dsml.h"
#include "text/tokenizer.h"

#define D "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"
#define SYSTEM "You are a test agent."

static volatile sig_atomic_t g_stop;
static void on_sigint(int sig) { (void)sig; g_stop = 1; }

static char tmp[PATH_MAX];
static ds4_engine *engine;
static FILE *screen;

static char *path_in(const char *rel) {
    static char p[4][PATH_MAX + 64];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmp, rel);
    return p[k];
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* a working directory with the starting file */
static char *workdir(const char *name) {
    char *p = path_in(name);
    mkdir(p, 0700);
    char f[PATH_MAX + 80];
    snprintf(f, sizeof f, "%s/notes.txt", p);
    write_text(f, "hello world\nsecond line\n");
    return p;
}

static const char *block(const char *name, const char *k1, const char *v1, const char *k2, const char *v2, const char *k3,
                         const char *v3) {
    static char b[8][1024];
    static int k;
    k = (k + 1) % 8;
    int n = snprintf(b[k], sizeof b[k], "\n\n<" D "tool_calls>\n<" D "invoke name=\"%s\">\n", name);
    const char *kv[3][2] = {{k1, v1}, {k2, v2}, {k3, v3}};
    for (int i = 0; i < 3 && kv[i][0]; i++)
        n += snprintf(b[k] + n, sizeof b[k] - (size_t)n, "<" D "parameter name=\"%s\" string=\"true\">%s</" D "parameter>\n",
                      kv[i][0], kv[i][1]);
    snprintf(b[k] + n, sizeof b[k] - (size_t)n, "</" D "invoke>\n</" D "tool_calls>");
    return b[k];
}

/* The scripted conversation: turn 1 = malformed call, read, edit, bash,
 * answer; turn 2 and turn 3 = one answer each. */
#define MALFORMED "\n\n<" D "tool_calls>\n<" D "invoke name=\"read_file\">\n"
static const char *reasoning[] = {"Let me look.", "Read it.", "Edit it.", "Check it.", "Done.", "Welcome.", "Sure."};
static const char *answers[] = {"The greeting now says hello agent.", "You are welcome.", "Here is one more."};

static const char *calls[3];     /* read, edit, bash blocks */
static const char *call_args[3][6];

static void setup_calls(void) {
    const char *a[3][6] = {{"path", "notes.txt", NULL, NULL, NULL, NULL},
                           {"path", "notes.txt", "old_string", "hello world", "new_string", "hello agent"},
                           {"command", "cat notes.txt; echo done", NULL, NULL, NULL, NULL}};
    const char *names[3] = {"read_file", "edit_file", "bash"};
    memcpy(call_args, a, sizeof a);
    for (int i = 0; i < 3; i++) calls[i] = strdup(block(names[i], a[i][0], a[i][1], a[i][2], a[i][3], a[i][4], a[i][5]));
}

static char *script_file(const char *name, int first_turn, int last_turn) {
    char *p = path_in(name);
    FILE *f = fopen(p, "w");
    for (int t = first_turn; t <= last_turn; t++) {
        if (t == 1) {
            fprintf(f, "%s</think>%s\n@@@\n", reasoning[0], MALFORMED);
            for (int i = 0; i < 3; i++) fprintf(f, "%s</think>%s\n@@@\n", reasoning[1 + i], calls[i]);
            fprintf(f, "%s</think>%s\n@@@\n", reasoning[4], answers[0]);
        } else {
            fprintf(f, "%s</think>%s\n@@@\n", reasoning[3 + t], answers[t - 1]);
        }
    }
    fclose(f);
    return p;
}

typedef struct {
    ds4_agent *a;
    ds4_turn_script script;
    ds4_agent_display display;
} rig;

static void rig_open(rig *r, const char *root, const char *script) {
    char err[256];
    memset(r, 0, sizeof *r);
    if (script && ds4_turn_script_load(script, DS4_AGENT_SCRIPT_SEPARATOR, &r->script, err, sizeof err)) { fprintf(stderr, "%s\n", err); exit(1); }
    ds4_agent_display_init(&r->display, screen, screen);
    ds4_agent_opts o = {.engine = engine, .ctx = 4096, .think = DS4_THINK_HIGH, .max_gen_tokens = 512, .max_steps = 8,
                        .system_prompt = SYSTEM, .script = script ? &r->script : NULL, .interrupted = &g_stop,
                        .display = &r->display};
    ds4_sampler_params_default(&o.sampling);
    ds4_agent_tools_opts_default(&o.tools, root);
    o.tools.auto_yes = true;
    o.tools.interrupted = &g_stop;
    r->a = ds4_agent_new(&o, err, sizeof err);
    if (!r->a) { fprintf(stderr, "%s\n", err); exit(1); }
}

static void rig_close(rig *r) {
    ds4_agent_free(r->a);
    ds4_turn_script_free(&r->script);
}

static bool counters_add_up(const ds4_agent *a) {
    ds4_agent_stats st;
    ds4_agent_stats_get(a, &st);
    return st.restored + st.prefilled + st.decoded == st.n_tokens;
}

static char *session_text(const ds4_agent *a, size_t *n) {
    const ds4_session *s = ds4_agent_session(a);
    return ds4_tokenizer_decode(ds4_engine_tokenizer(engine), ds4_session_tokens(s), (size_t)ds4_session_n_tokens(s), false, n);
}

/* ---- the render oracle ---- */

static const char *replay(void *ud, const char *id) {
    (void)ud;
    return calls[id[0] - '0'];
}

static char *tool_text(const char *root, int i) {
    ds4_agent_tools_opts o;
    ds4_agent_tools_opts_default(&o, root);
    o.auto_yes = true;
    ds4_buf args = {0};
    ds4_buf_puts(&args, "{");
    for (int k = 0; k < 6 && call_args[i][k]; k += 2) {
        if (k) ds4_buf_puts(&args, ",");
        ds4_json_quote(call_args[i][k], strlen(call_args[i][k]), DS4_JSON_COMPACT, &args);
        ds4_buf_puts(&args, ":");
        ds4_json_quote(call_args[i][k + 1], strlen(call_args[i][k + 1]), DS4_JSON_COMPACT, &args);
    }
    ds4_buf_puts(&args, "}");
    static const char *names[] = {"read_file", "edit_file", "bash"};
    ds4_agent_tool_result r;
    ds4_agent_tool_run(&o, names[i], args.data, &r);
    char *out = strdup(r.text.data);
    ds4_agent_tool_result_free(&r);
    ds4_buf_free(&args);
    return out;
}

static void check_against_render(const ds4_agent *a, const char *mirror) {
    ds4_dsml_opts po = {.thinking = false, .tools = true, .decode_entities = true};
    ds4_dsml_result pr;
    ds4_dsml_parse(&po, MALFORMED, strlen(MALFORMED), &pr);
    char malformed_result[512];
    snprintf(malformed_result, sizeof malformed_result,
             "error: malformed tool call (%s); nothing was run. Write the call again in the tool-call format the tools block shows.",
             pr.error ? pr.error : "?");
    ds4_dsml_result_free(&pr);
    char *results[3];
    for (int i = 0; i < 3; i++) results[i] = tool_text(mirror, i);
    static const char *names[] = {"read_file", "edit_file", "bash"};
    ds4_tool_call tc[3];
    for (int i = 0; i < 3; i++) tc[i] = (ds4_tool_call){.id = (const char *[]){"0", "1", "2"}[i], .name = names[i]};
    ds4_chat_msg m[] = {
        {.role = DS4_ROLE_SYSTEM, .content = SYSTEM},
        {.role = DS4_ROLE_USER, .content = "fix the greeting"},
        {.role = DS4_ROLE_ASSISTANT, .reasoning_content = reasoning[0], .content = MALFORMED},
        {.role = DS4_ROLE_TOOL, .content = malformed_result},
        {.role = DS4_ROLE_ASSISTANT, .reasoning_content = reasoning[1], .tool_calls = &tc[0], .n_tool_calls = 1},
        {.role = DS4_ROLE_TOOL, .tool_call_id = "0", .content = results[0]},
        {.role = DS4_ROLE_ASSISTANT, .reasoning_content = reasoning[2], .tool_calls = &tc[1], .n_tool_calls = 1},
        {.role = DS4_ROLE_TOOL, .tool_call_id = "1", .content = results[1]},
        {.role = DS4_ROLE_ASSISTANT, .reasoning_content = reasoning[3], .tool_calls = &tc[2], .n_tool_calls = 1},
        {.role = DS4_ROLE_TOOL, .tool_call_id = "2", .content = results[2]},
        {.role = DS4_ROLE_ASSISTANT, .reasoning_content = reasoning[4], .content = answers[0]},
        {.role = DS4_ROLE_USER, .content = "thanks"},
        {.role = DS4_ROLE_ASSISTANT, .reasoning_content = reasoning[5], .content = answers[1]},
    };
    int n_tools;
    ds4_chat_opts co;
    ds4_chat_opts_default(&co);
    co.tools = ds4_agent_tool_defs(&n_tools);
    co.n_tools = n_tools;
    co.replay = replay;
    ds4_buf want = {0};
    char err[256];
    CHECK(ds4_chat_render(m, (int)(sizeof m / sizeof m[0]), &co, &want, err, sizeof err), "render: %s", err);
    /* the last message is still open: its EOS is prefilled with the next one */
    size_t eos = strlen(DS4_STR_EOS);
    CHECK(want.len > eos && !strcmp(want.data + want.len - eos, DS4_STR_EOS), "render ends with EOS");
    want.len -= eos;
    size_t got_n;
    char *got = session_text(a, &got_n);
    CHECK(got_n == want.len && !memcmp(got, want.data, got_n), "transcript text equals the rendered conversation\n"
          "got:  %s\nwant: %.*s", got, (int)want.len, want.data);
    ds4_token_ids ids = {0};
    ds4_tokenizer_encode(ds4_engine_tokenizer(engine), want.data, want.len, DS4_TOK_SPECIALS_CHAT, &ids);
    const ds4_session *s = ds4_agent_session(a);
    CHECK(ids.n == (size_t)ds4_session_n_tokens(s) && !memcmp(ids.v, ds4_session_tokens(s), ids.n * sizeof *ids.v),
          "transcript tokens equal the tokenized render (%zu vs %d)", ids.n, ds4_session_n_tokens(s));
    ds4_token_ids_free(&ids);
    free(got);
    ds4_buf_free(&want);
    for (int i = 0; i < 3; i++) free(results[i]);
}

/* ---- tests ---- */

static float *logits_copy(const ds4_agent *a) {
    size_t n = (size_t)ds4_engine_n_vocab(engine);
    float *l = malloc(n * sizeof *l);
    memcpy(l, ds4_session_logits(ds4_agent_session(a)), n * sizeof *l);
    return l;
}

static void test_loop_and_sessions(void) {
    char *sessions = strdup(path_in("sessions")), err[512];
    CHECK(ds4_agent_store_init(sessions, err, sizeof err) == 0, "%s", err);
    const ds4_tokenizer *tok = ds4_engine_tokenizer(engine);

    /* A: three turns without stopping */
    rig A;
    char *wa = strdup(workdir("wa"));
    rig_open(&A, wa, script_file("script-a", 1, 3));
    CHECK(ds4_agent_turn(A.a, "fix the greeting") == 0, "turn 1");
    char *notes = ds4_read_file(path_in("wa/notes.txt"), NULL);
    CHECK(notes && !strcmp(notes, "hello agent\nsecond line\n"), "the edit reached the disk: %s", notes);
    free(notes);
    CHECK(counters_add_up(A.a), "turn 1 counters");
    ds4_agent_stats before, after;
    ds4_agent_stats_get(A.a, &before);
    CHECK(ds4_agent_turn(A.a, "thanks") == 0, "turn 2");
    ds4_agent_stats_get(A.a, &after);
    ds4_token_ids user = {0};
    ds4_tokenizer_encode(tok, "thanks", 6, DS4_TOK_SPECIALS_NONE, &user);
    /* EOS + <User> + text + <Assistant> + <think>: nothing else is prefilled */
    CHECK(after.last_prefill_from == before.n_tokens && after.last_prefill_n == (int)user.n + 4 &&
          after.prefilled == before.prefilled + (long long)user.n + 4,
          "turn 2 prefilled only its %zu new tokens (from %d, n %d)", user.n + 4, after.last_prefill_from,
          after.last_prefill_n);
    ds4_token_ids_free(&user);
    CHECK(counters_add_up(A.a), "turn 2 counters");
    char *mirror = strdup(workdir("mirror"));
    check_against_render(A.a, mirror);
    CHECK(ds4_agent_turn(A.a, "one more") == 0, "turn 3");
    float *logits_a = logits_copy(A.a);

    /* B: two turns, saved */
    rig B;
    rig_open(&B, workdir("wb"), script_file("script-b", 1, 2));
    ds4_agent_turn(B.a, "fix the greeting");
    ds4_agent_turn(B.a, "thanks");
    CHECK(ds4_agent_save(B.a, sessions, err, sizeof err) == 0, "save: %s", err);
    char id[DS4_AGENT_ID_HEX + 1];
    snprintf(id, sizeof id, "%s", ds4_agent_id(B.a));
    char file[PATH_MAX + 128];
    snprintf(file, sizeof file, "%s/%s.kv", sessions, id);
    struct stat st;
    CHECK(stat(file, &st) == 0 && (st.st_mode & 0777) == 0600, "session file is private (%o)", st.st_mode & 0777);

    /* C: a new process' view: switch restores without prefill, turn 3 matches A */
    rig C;
    rig_open(&C, wa, script_file("script-c", 3, 3));
    char prefix[9];
    snprintf(prefix, sizeof prefix, "%.8s", id);
    char found[DS4_AGENT_ID_HEX + 1];
    CHECK(ds4_agent_store_find(sessions, prefix, found, err, sizeof err) == 0 && !strcmp(found, id), "find by prefix: %s", err);
    CHECK(ds4_agent_switch(C.a, sessions, found, err, sizeof err) == 0, "switch: %s", err);
    ds4_agent_stats cs;
    ds4_agent_stats_get(C.a, &cs);
    CHECK(cs.restored == cs.n_tokens && cs.prefilled == 0 && !strcmp(ds4_agent_id(C.a), id), "restored, no prefill");
    CHECK(ds4_agent_turn(C.a, "one more") == 0, "turn 3 after switch");
    float *logits_c = logits_copy(C.a);
    CHECK(!memcmp(logits_a, logits_c, (size_t)ds4_engine_n_vocab(engine) * sizeof(float)),
          "next-token logits after save/switch are bit-identical to never stopping");
    const ds4_session *sa = ds4_agent_session(A.a), *sc = ds4_agent_session(C.a);
    CHECK(ds4_session_n_tokens(sa) == ds4_session_n_tokens(sc) &&
          !memcmp(ds4_session_tokens(sa), ds4_session_tokens(sc), sizeof(int32_t) * (size_t)ds4_session_n_tokens(sa)),
          "same tokens");
    free(logits_a);
    free(logits_c);

    /* a failed save (file-size limit, like a full disk) keeps the old file */
    char *old = NULL;
    size_t old_n = 0, now_n = 0;
    old = ds4_read_file(file, &old_n);
    ds4_agent_turn(B.a, "one more");   /* B's script is exhausted: the model stops at once */
    struct rlimit rl, small = {4096, 0};
    getrlimit(RLIMIT_FSIZE, &rl);
    small.rlim_max = rl.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    int rc = ds4_agent_save(B.a, sessions, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &rl);
    char *now = ds4_read_file(file, &now_n);
    CHECK(rc != 0 && now && now_n == old_n && !memcmp(old, now, old_n), "failed save keeps the old file (%s)", err);
    free(old);
    free(now);

    /* strip: text and title stay, switching re-prefills the same text */
    CHECK(ds4_agent_store_strip(sessions, id, err, sizeof err) == 0, "strip: %s", err);
    rig E;
    rig_open(&E, wa, NULL);
    CHECK(ds4_agent_switch(E.a, sessions, id, err, sizeof err) == 0, "switch to stripped: %s", err);
    ds4_agent_stats es;
    ds4_agent_stats_get(E.a, &es);
    size_t tb, te;
    char *text_b = session_text(B.a, &tb), *text_e = session_text(E.a, &te);
    /* B went on with an empty third turn after the save */
    CHECK(te <= tb && !memcmp(text_b, text_e, te) && es.restored == 0 && es.prefilled == es.n_tokens && es.n_tokens > 0,
          "stripped session rebuilt from its text (%zu bytes, %d tokens prefilled)", te, es.n_tokens);
    free(text_b);
    free(text_e);

    /* listing: damaged and foreign files are unreadable, never loaded */
    write_text(path_in("sessions/0123456789012345678901234567890123456789.kv"), "garbage");
    char *full = ds4_read_file(file, &old_n);
    FILE *f = fopen(path_in("sessions/aaaa456789012345678901234567890123456789.kv"), "w");
    fwrite(full, 1, old_n - 3, f);   /* truncated: the CRC trailer is cut */
    fclose(f);
    free(full);
    ds4_agent_session_info *list;
    int n;
    CHECK(ds4_agent_store_list(sessions, &list, &n, err, sizeof err) == 0 && n == 3, "list: %d", n);
    int bad = 0, good = 0;
    for (int i = 0; i < n; i++) {
        if (list[i].unreadable) bad++;
        else if (!strcmp(list[i].id, id) && list[i].stripped && !strcmp(list[i].title, "fix the greeting")) good++;
    }
    CHECK(bad == 2 && good == 1, "two unreadable, one stripped session titled by its first prompt");
    free(list);
    CHECK(ds4_agent_switch(E.a, sessions, "aaaa456789012345678901234567890123456789", err, sizeof err) < 0 &&
          strstr(err, "unreadable"), "a damaged file is refused: %s", err);

    /* saved with another model: refused with a clear line */
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = "fuzz/corpus/model/micro-f16.gguf";
    ep.quiet = true;
    ep.n_threads = 1;
    ds4_engine *other = ds4_engine_load(&ep, err, sizeof err);
    CHECK(other != NULL, "load micro model: %s", err);
    CHECK(ds4_agent_save(C.a, sessions, err, sizeof err) == 0, "save C");
    if (other) {
        ds4_session *os = ds4_session_new(other, 4096, err, sizeof err);
        char *text = NULL;
        size_t tl;
        uint64_t created;
        bool stripped;
        CHECK(os && ds4_agent_store_load(sessions, id, other, os, &text, &tl, &created, &stripped, err, sizeof err) < 0 &&
              strstr(err, "another model"), "other model refused: %s", err);
        free(text);
        ds4_session_free(os);
        ds4_engine_free(other);
    }
    CHECK(ds4_agent_store_delete(sessions, id, err, sizeof err) == 0 && ds4_agent_store_find(sessions, prefix, found, err, sizeof err) < 0,
          "deleted");
    rig_close(&A);
    rig_close(&B);
    rig_close(&C);
    rig_close(&E);
    free(wa);
    free(mirror);
    free(sessions);
}

static void test_interrupted_tool(void) {
    char *s = path_in("script-int");
    FILE *f = fopen(s, "w");
    /* the command interrupts the agent itself, as Ctrl+C would, then hangs */
    fprintf(f, "Run it.</think>%s\n@@@\nOk.</think>Stopped.\n@@@\n",
            block("bash", "command", "kill -INT $PPID; sleep 30; echo never", NULL, NULL, NULL, NULL));
    fclose(f);
    rig R;
    rig_open(&R, workdir("wi"), s);
    g_stop = 0;
    CHECK(ds4_agent_turn(R.a, "run the slow thing") == 1, "interrupted turn");
    g_stop = 0;
    CHECK(ds4_agent_turn(R.a, "go on") == 0, "the next turn works");
    size_t n;
    char *text = session_text(R.a, &n);
    CHECK(strstr(text, "<tool_result>[interrupted by the user]</tool_result>" DS4_STR_USER "go on" DS4_STR_ASSISTANT
                 "<think>Ok.</think>Stopped."), "the killed command's result goes with the next message: %s", strstr(text, "Run it") ? strstr(text, "Run it") : text);
    CHECK(counters_add_up(R.a), "counters after the interrupt");
    free(text);
    rig_close(&R);
}

/* A tool output far over the context -- 64 KiB of NUL bytes (written \0) is about 65k
 * tokens, a long text tens of thousands, the context 4096 -- is cut in
 * tokens with a marker (head and tail kept), and the turns after it work:
 * before, the results stayed pending and every later turn was refused. */
static void test_large_tool_output(void) {
    static const struct { const char *cmd; const char *head; size_t head_n; } cases[] = {
        {"head -c 65536 /dev/zero", "<tool_result>\\0\\0\\0\\0", 21},
        {"seq 1 100000 | head -c 65536", "<tool_result>1\n2\n3\n", 19},
        /* characters the vocabulary splits into byte tokens: the cuts fall
         * between characters, not inside one */
        {"yes \'\xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6\xf0\x9d\x94\xa0\xf0\x9d\x94\xac\xf0\x9d\x94\xa1\xf0\x9d\x94\xa2\xf0\x9d\x94\xb0\' | head -n 1500",
         "<tool_result>\xf0\x9d\x94\x98\xf0\x9d\x94\xab", 21},
    };
    for (int c = 0; c < 3; c++) {
        char *s = path_in("script-big");
        FILE *f = fopen(s, "w");
        fprintf(f, "Run it.</think>%s\n@@@\nSeen.</think>It is long.\n@@@\nAgain.</think>Still here.\n@@@\n"
                "Once more.</think>Yes.\n@@@\n", block("bash", "command", cases[c].cmd, NULL, NULL, NULL, NULL));
        fclose(f);
        rig R;
        rig_open(&R, workdir("wbig"), s);
        CHECK(ds4_agent_turn(R.a, "print it") == 0, "%s: the turn with the big output", cases[c].cmd);
        CHECK(ds4_agent_turn(R.a, "and now?") == 0, "%s: the next turn works", cases[c].cmd);
        CHECK(ds4_agent_turn(R.a, "once more") == 0, "%s: and the one after", cases[c].cmd);
        CHECK(counters_add_up(R.a), "%s: counters", cases[c].cmd);
        /* the marker counts the whole output's tokens, as an independent
         * tokenization of the same command's output does */
        ds4_agent_tools_opts o;
        ds4_agent_tools_opts_default(&o, path_in("wbig"));
        o.auto_yes = true;
        ds4_buf args = {0};
        ds4_buf_puts(&args, "{\"command\":");
        ds4_json_quote(cases[c].cmd, strlen(cases[c].cmd), DS4_JSON_COMPACT, &args);
        ds4_buf_puts(&args, "}");
        ds4_agent_tool_result tr;
        ds4_agent_tool_run(&o, "bash", args.data, &tr);
        ds4_token_ids ids = {0};
        ds4_tokenizer_encode(ds4_engine_tokenizer(engine), tr.text.data, tr.text.len, DS4_TOK_SPECIALS_NONE, &ids);
        CHECK(ids.n > 4096, "%s: the output alone is over the context (%zu tokens)", cases[c].cmd, ids.n);
        char want[64];
        snprintf(want, sizeof want, " of its %zu tokens (", ids.n);
        size_t n;
        char *text = session_text(R.a, &n);
        const char *res = memmem(text, n, "<tool_result>", 13);
        CHECK(res && (size_t)(text + n - res) > cases[c].head_n && !memcmp(res, cases[c].head, cases[c].head_n),
              "%s: the result starts with the output", cases[c].cmd);
        CHECK(memmem(text, n, "output truncated to fit the context: ", 37) && memmem(text, n, want, strlen(want)),
              "%s: a marker says how much was cut (%s)", cases[c].cmd, want);
        CHECK(memmem(text, n, "\n[exit status 0]</tool_result>", 30), "%s: the tail (exit status) is kept", cases[c].cmd);
        CHECK(memmem(text, n, "<think>Once more.</think>Yes.", 29), "%s: the last answer is in the session", cases[c].cmd);
        CHECK(!memmem(text, n, "\xef\xbf\xbd", 3), "%s: no character was split (U+FFFD)", cases[c].cmd);
        free(text);
        ds4_token_ids_free(&ids);
        ds4_agent_tool_result_free(&tr);
        ds4_buf_free(&args);
        rig_close(&R);
    }
}

/* Twelve big outputs in one round: each one's share of the context left is
 * too small for a useful part, so each becomes a short note, and the turns
 * go on. */
static void test_round_of_big_outputs(void) {
    char *s = path_in("script-round");
    FILE *f = fopen(s, "w");
    fputs("Run them all.</think>\n\n<" D "tool_calls>\n", f);
    for (int i = 0; i < 12; i++)
        fputs("<" D "invoke name=\"bash\">\n<" D "parameter name=\"command\" string=\"true\">head -c 65536 /dev/zero</"
              D "parameter>\n</" D "invoke>\n", f);
    fputs("</" D "tool_calls>\n@@@\nToo much.</think>Nothing fit.\n@@@\nOk.</think>Still here.\n@@@\n", f);
    fclose(f);
    rig R;
    rig_open(&R, workdir("wround"), s);
    CHECK(ds4_agent_turn(R.a, "run them") == 0, "the round of twelve big outputs");
    CHECK(ds4_agent_turn(R.a, "and now?") == 0, "the next turn works");
    size_t n;
    char *text = session_text(R.a, &n);
    int notes = 0, cut = 0;
    for (const char *p = text; (p = memmem(p, (size_t)(text + n - p), "<tool_result>error: the output (131088 bytes) was "
                                           "dropped: the context is nearly full", 84)); p++)
        notes++;
    for (const char *p = text; (p = memmem(p, (size_t)(text + n - p), "output truncated to fit the context", 35)); p++) cut++;
    /* the notes leave room that later calls of the round may use */
    CHECK(notes >= 1 && notes + cut == 12, "each result is a note or cut (%d notes, %d cut)", notes, cut);
    CHECK(memmem(text, n, "<think>Ok.</think>Still here.", 29) != NULL, "the last answer is in the session");
    CHECK(counters_add_up(R.a), "counters");
    free(text);
    rig_close(&R);
}

/* A tool round when the context is all but full: even the short note does
 * not fit, so the results are dropped (the turn fails with a note) instead
 * of staying pending, and the next turn works. The user's message is sized
 * to leave 20 tokens after the model's tool call. */
static void test_results_dropped_when_full(void) {
    const ds4_tokenizer *tok = ds4_engine_tokenizer(engine);
    char *s = path_in("script-full");
    FILE *f = fopen(s, "w");
    char call_entry[1200];
    snprintf(call_entry, sizeof call_entry, "Fill.</think>%s", block("bash", "command", "head -c 65536 /dev/zero", NULL, NULL,
                                                                      NULL, NULL));
    fprintf(f, "Hi.</think>Hello.\n@@@\n%s\n@@@\nY.</think>Yes.\n@@@\n", call_entry);
    fclose(f);
    rig R;
    rig_open(&R, workdir("wfull"), s);
    CHECK(ds4_agent_turn(R.a, "hi") == 0, "first turn");
    ds4_agent_stats st;
    ds4_agent_stats_get(R.a, &st);
    ds4_token_ids ids = {0};
    ds4_tokenizer_encode(tok, call_entry, strlen(call_entry), DS4_TOK_SPECIALS_CHAT, &ids);
    /* EOS, <User>, <Assistant>, <think> around the filler */
    long want = (long)st.ctx - st.n_tokens - 4 - (long)ids.n - 20;
    ds4_token_ids_free(&ids);
    ds4_buf filler = {0};
    long words = want;
    for (int tries = 0; tries < 8; tries++) {
        ds4_buf_clear(&filler);
        for (long i = 0; i < words; i++) ds4_buf_puts(&filler, " x");
        ds4_tokenizer_encode(tok, filler.data, filler.len, DS4_TOK_SPECIALS_NONE, &ids);
        long got = (long)ids.n;
        ds4_token_ids_free(&ids);
        if (got == want) break;
        words += want - got;
    }
    CHECK(ds4_agent_turn(R.a, filler.data) == -1, "the round whose results cannot fit fails");
    ds4_agent_stats_get(R.a, &st);
    CHECK(st.ctx - st.n_tokens == 20, "the call left 20 tokens (%d)", st.ctx - st.n_tokens);
    CHECK(ds4_agent_turn(R.a, "ok") == 0, "the next turn works");
    size_t n;
    char *text = session_text(R.a, &n);
    const char *after_fill = memmem(text, n, "Fill.</think>", 13);
    CHECK(after_fill && !memmem(after_fill, (size_t)(text + n - after_fill), "<tool_result>", 13),
          "the dropped results are not in the session");
    CHECK(n > 14 && !memcmp(text + n - 14, "Y.</think>Yes.", 14), "the answer ends the session");
    CHECK(counters_add_up(R.a), "counters");
    free(text);
    ds4_buf_free(&filler);
    rig_close(&R);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/ds4-agent-loop-XXXXXX");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 1; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    screen = fopen("/dev/null", "w");
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = "models/demo.gguf";
    ep.quiet = true;
    ep.n_threads = 2;
    char err[512];
    engine = ds4_engine_load(&ep, err, sizeof err);
    CHECK(engine != NULL, "models/demo.gguf (make demo-model): %s", err);
    if (engine) {
        setup_calls();
        test_loop_and_sessions();
        test_interrupted_tool();
        test_large_tool_output();
        test_round_of_big_outputs();
        test_results_dropped_when_full();
        for (int i = 0; i < 3; i++) free((void *)calls[i]);
        ds4_engine_free(engine);
    }
    fclose(screen);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", tmp);
    return check_done("agent_loop");
}
