/* eval_grade.h -- ds4-eval's answer extractor and grader: what a model's
 * reply says the answer is, and whether that is the key.
 *
 * Contract
 * - Input is everything the model generated after the prompt. With
 *   `thinking` the prompt opened a <think> block: only the text after the
 *   last "</think>" is the visible reply, and a reply that never closed its
 *   reasoning has no answer. Without it the whole text is the reply (a
 *   "</think>" in it still hides what precedes it).
 * - The answer span, in order of preference: the last \boxed{...}
 *   (balanced braces); else the text after the last answer marker
 *   ("answer:", "answer is", "final answer", "output:", "output is",
 *   "prints", case-insensitive; when nothing follows the marker on its line,
 *   the next non-empty line that is not a code fence); else the last
 *   non-empty line. Markdown emphasis, $...$, \text{...}, wrapping quotes
 *   and backticks, and trailing . , ; ! are dropped.
 * - Per category: MC takes the first standalone letter A-D (B, (B), B),
 *   **B**, "option B"); with none, the option whose text appears in the
 *   span (the longest such, ties = no answer). MATH takes a number (commas
 *   as thousands separators, decimals, a/b and \frac{a}{b}): after the last
 *   '=' when there is one, the first in a marked span, the last in a bare
 *   line; it passes when numerically equal to the key. CODE compares the
 *   span with the key after collapsing white space and dropping the blanks
 *   next to brackets and commas. SEC takes the first integer of a marked
 *   span (the last of a bare line) and passes when it is one of the key's
 *   accepted lines.
 * - `picked` is the extracted answer as the report shows it ("" = none),
 *   cut to fit; grading never reads past len and never fails.
 */
#ifndef DS4_EVAL_GRADE_H
#define DS4_EVAL_GRADE_H

#include <stdbool.h>
#include <stddef.h>

#include "quality/eval_questions.h"

#define DS4_EVAL_PICKED_MAX 96

typedef struct {
    bool pass;
    char picked[DS4_EVAL_PICKED_MAX];
} ds4_eval_verdict;

void ds4_eval_grade(const ds4_eval_question *q, const char *text, size_t len, bool thinking, ds4_eval_verdict *out);

#endif
