/* base/turn_script.h -- a scripted model's answers, one per turn: the
 * test mode of ds4-agent and ds4-server (--scripted-output FILE), where
 * what the model "samples" comes from a file instead of the weights.
 *
 * Contract
 * - File format: UTF-8 text; entries are separated by lines that consist
 *   of exactly the separator (ds4-agent: "@@@", ds4-server: "<<<NEXT>>>").
 *   The newline that ends the line before a separator belongs to the
 *   separator, so an entry is the exact text between them. Text after the
 *   last separator is a final entry without its last newline (a file with
 *   no separator is one entry: the whole text less a final newline).
 * - An entry is everything the model generates after the prompt: with
 *   thinking, reasoning then "</think>" then the answer; tool calls as the
 *   model writes them ("\n\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls>").
 * - next() consumes the entries in order and returns NULL when none are
 *   left (the agent: one per assistant message). at(k) is the k-th entry
 *   (0-based) with the last one repeating (the server: one per generation);
 *   NULL only for a script without entries.
 */
#ifndef DS4_BASE_TURN_SCRIPT_H
#define DS4_BASE_TURN_SCRIPT_H

#include <stddef.h>

#define DS4_AGENT_SCRIPT_SEPARATOR "@@@"
#define DS4_SERVER_SCRIPT_SEPARATOR "<<<NEXT>>>"

typedef struct {
    char *text;           /* the whole file; entries point into it */
    char **entries;
    size_t *lens;
    int n, next;
} ds4_turn_script;

int ds4_turn_script_load(const char *path, const char *separator, ds4_turn_script *s, char *err, size_t errlen);
/* Splits text[0..n) at separator lines (text is malloc'ed; the script owns
 * it from now on, also on failure). -1 only when out of memory. */
int ds4_turn_script_parse(ds4_turn_script *s, char *text, size_t n, const char *separator);
const char *ds4_turn_script_next(ds4_turn_script *s, size_t *len);
const char *ds4_turn_script_at(const ds4_turn_script *s, long k, size_t *len);
void ds4_turn_script_free(ds4_turn_script *s);

#endif
