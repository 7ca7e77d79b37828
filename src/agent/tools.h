/* agent/tools.h -- the coding agent's tools: their declarations for the V4
 * tools block and their execution inside one working directory.
 *
 * Contract
 * - ds4_agent_tool_defs() lists read_file, write_file, edit_file, list_dir,
 *   glob, grep, bash, job_list, job_output and job_stop with JSON-schema
 *   parameters (static storage).
 * - ds4_agent_tool_run() executes one call given its name and arguments JSON
 *   text (as the DSML parser produced it). It never aborts: unknown tools,
 *   bad arguments, I/O errors, refusals, timeouts all become a result with
 *   ok = false and a one-line explanation the model can act on.
 * - Paths are resolved against the working directory with realpath(3)
 *   (symlinks included; for a file that does not exist yet, its parent).
 *   The file tools (read_file, write_file, edit_file, list_dir, grep) refuse
 *   a path that resolves outside the root, without asking; glob only walks
 *   the root and follows no symlinks.
 * - read_file: optional 1-based inclusive line range; a file over read_cap
 *   bytes is refused unless a range is given, and output is capped at
 *   read_cap either way. edit_file: old_string must occur exactly once; the
 *   result's display holds a -/+ diff of the changed lines. grep: PCRE2
 *   pattern over regular text files under a path (.git skipped, files with
 *   NUL bytes skipped), at most max_results lines. glob: fnmatch(3) over the
 *   paths under the root relative to it, or over basenames when the pattern
 *   has no '/'.
 * - bash: /bin/sh -c started in the root (the shell itself is not confined:
 *   it can cd and write anywhere the user can), in its own process group,
 *   stdin from /dev/null, stdout+stderr captured up to output_cap bytes.
 *   Needs confirm() unless auto_yes. The calling process becomes a child
 *   subreaper, so every process a command starts -- also one that left the
 *   group with setsid, or was orphaned -- stays below it. After
 *   bash_timeout_s seconds or when *interrupted becomes nonzero, the group
 *   and every process below the caller that is not an earlier command's
 *   job are killed, and the result says so. A command that exits normally
 *   may leave jobs running (`server &`); ds4_agent_tools_end_jobs() kills
 *   them all.
 * - bash with background true starts the command the same way (same
 *   question, directory and process rules) but returns at once with a job
 *   id; its output goes to an unlinked temporary file. job_list lists the
 *   jobs (running, or exit status), job_output gives a job's state and the
 *   last lines of its output (at most output_cap bytes), job_stop sends its
 *   group SIGTERM, then after up to a second SIGKILLs the group and every
 *   process below the job. At most 32 jobs at a time; a finished job's slot
 *   is reused. ds4_agent_tools_end_jobs() kills them with everything else. The process should start no children of its own: the tools
 *   take whatever is below it for a command's and reap it.
 * - Results end up in the model's context, so every output is bounded (in
 *   bytes here; the agent loop also caps them in tokens) and holds no NUL
 *   byte (written as the two characters \0, since the chat renderer takes C
 *   strings).
 */
#ifndef DS4_AGENT_TOOLS_H
#define DS4_AGENT_TOOLS_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "text/chat.h"
#include "base/json_util.h"

typedef bool (*ds4_agent_confirm_fn)(void *ud, const char *question);

typedef struct {
    const char *root;               /* absolute, already realpath'ed */
    bool auto_yes;                  /* bash runs without asking */
    int bash_timeout_s;
    size_t read_cap;
    size_t output_cap;
    int max_results;
    ds4_agent_confirm_fn confirm;   /* NULL: every question is answered no */
    void *confirm_ud;
    volatile sig_atomic_t *interrupted;  /* may be NULL */
} ds4_agent_tools_opts;

/* 30 s, 256 KiB read cap, 64 KiB output cap, 200 results, no confirm. */
void ds4_agent_tools_opts_default(ds4_agent_tools_opts *o, const char *root);

typedef struct {
    bool ok;
    ds4_buf text;          /* what the model receives */
    ds4_buf display;       /* extra lines for the user (edit diffs); may be empty */
    char summary[200];     /* one line for the user */
} ds4_agent_tool_result;

const ds4_tool_def *ds4_agent_tool_defs(int *n);
void ds4_agent_tool_run(const ds4_agent_tools_opts *o, const char *name, const char *args_json,
                        ds4_agent_tool_result *r);
void ds4_agent_tool_result_free(ds4_agent_tool_result *r);
/* The background jobs, one line each (or "no background jobs"): /jobs. */
void ds4_agent_tools_jobs(ds4_buf *out);
/* Kills every process below this one (the commands' jobs, with whatever
 * they started) and reaps them: at the agent's exit. */
void ds4_agent_tools_end_jobs(void);

#endif
