/* agent/script.h -- the scripted model of ds4-agent's test mode
 * (--scripted-output FILE): what the model "samples", one entry per
 * assistant message. The same '@@@'-separated entry file holds ds4-eval's
 * scripted replies (one per question) and `ds4 --imatrix-dataset` prompts.
 *
 * Contract
 * - File format: UTF-8 text; entries are separated by lines that consist
 *   of exactly "@@@". The newline that ends the line before a separator
 *   belongs to the separator, so an entry is the exact text between them.
 *   Text after the last separator is a final entry without its last newline.
 *   An entry is everything the model generates after the prompt: with
 *   thinking, reasoning then "</think>" then the answer; tool calls as the
 *   model writes them ("\n\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls>").
 * - Entries are consumed in order, one per assistant message (a message
 *   that ends in tool calls is one entry; the answer after the tool
 *   results is the next). When none are left, next() returns NULL.
 */
#ifndef DS4_AGENT_SCRIPT_H
#define DS4_AGENT_SCRIPT_H

#include <stddef.h>

typedef struct {
    char *text;           /* the whole file; entries point into it */
    char **entries;
    size_t *lens;
    int n, next;
} ds4_agent_script;

int ds4_agent_script_load(const char *path, ds4_agent_script *s, char *err, size_t errlen);
/* Splits text[0..n) (malloc'ed; the script owns it from now on, also on
 * failure). -1 only when out of memory. */
int ds4_agent_script_parse(ds4_agent_script *s, char *text, size_t n);
const char *ds4_agent_script_next(ds4_agent_script *s, size_t *len);
void ds4_agent_script_free(ds4_agent_script *s);

#endif
