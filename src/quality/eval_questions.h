/* eval_questions.h -- ds4-eval's embedded question set and how a question
 * becomes the user message the model sees.
 *
 * Contract
 * - ds4_eval_questions() returns every embedded question, ids 1..n in a
 *   fixed order that interleaves the categories (so `--questions 4` is a
 *   mixed smoke run). The table is static: the same ids and keys on every
 *   call and in every build, so traces stay comparable.
 * - Every question was written for this project. `answer` is the key the
 *   grader compares against: MC a letter A-D; MATH a number; CODE the exact
 *   output text; SEC the accepted line numbers ("4" or "4,5"; "0" = the
 *   function is safe). `source` says what makes the key true (a
 *   computation, a law, the language rule), so a reviewer can check it.
 * - ds4_eval_prompt() renders the user message: the stem, the lettered
 *   options (MC), the numbered code (SEC), and the instruction that asks for
 *   a final "Answer: ..." line.
 * - ds4_eval_select() parses a selection ("12", "1-5,9", "math,sec", or a
 *   mix) into a membership mask over ids 1..n; false with one line in err
 *   for an unknown word, an id out of range or an inverted range.
 */
#ifndef DS4_EVAL_QUESTIONS_H
#define DS4_EVAL_QUESTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/json_util.h"

typedef enum {
    DS4_EVAL_MC,    /* multiple choice, science and reasoning */
    DS4_EVAL_MATH,  /* short exact numeric answer */
    DS4_EVAL_CODE,  /* predict a program's output */
    DS4_EVAL_SEC,   /* locate the security flaw in a C function */
    DS4_EVAL_N_CATEGORIES
} ds4_eval_category;

typedef struct {
    int id;                       /* 1-based position in the interleaved table */
    ds4_eval_category cat;
    const char *text;             /* the stem; SEC: the code, numbered when rendered */
    const char *options[4];       /* MC only: options A..D */
    const char *answer;
    const char *source;
} ds4_eval_question;

const ds4_eval_question *ds4_eval_questions(int *n);
const ds4_eval_question *ds4_eval_question_by_id(int id);
const char *ds4_eval_category_name(ds4_eval_category c);   /* "mc", "math", "code", "sec" */
void ds4_eval_prompt(const ds4_eval_question *q, ds4_buf *out);
bool ds4_eval_select(const char *spec, bool *mask, int n, char *err, size_t errlen);

#endif
