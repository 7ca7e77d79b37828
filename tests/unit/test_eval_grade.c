/* ds4-eval's extractor and grader against hand-written model replies:
 * right and wrong answers in the formats models write them (boxed,
 * "Answer:", markdown, trailing punctuation, letter or option text, code
 * fences, reasoning that never closed). Each row states the verdict and the
 * answer the report must show. Also: the question table's invariants and
 * the selection parser. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "quality/eval_grade.h"
#include "quality/eval_questions.h"

typedef struct {
    ds4_eval_category cat;
    int index;          /* position within its category, in the written order */
    bool thinking;
    const char *text;
    bool pass;
    const char *picked;
} row;

#define T true
#define F false
#define MC DS4_EVAL_MC
#define MATH DS4_EVAL_MATH
#define CODE DS4_EVAL_CODE
#define SEC DS4_EVAL_SEC

/* Keys used below: mc0 B (Nitrogen), mc1 C (20 m), mc2 D (3), mc5 A (2 ohm),
 * mc6 D (Fluorine), mc13 D (91), mc16 D (Ben), mc22 A (CH2O), mc25 A (1/6),
 * mc28 B (90 degrees); math0 391, math1 5050, math4 120, math10 24,
 * math13 3, math16 35, math19 0.25, math20 1; code0 10, code2 cba,
 * code3 "3 1", code8 [0, 1, 4, 9], code13 2.5, code14 False True,
 * code17 [(1, 'a'), (2, 'b')], code23 -3; sec0 4, sec5 0 (safe),
 * sec7 5 or 6, sec13 3 or 6. */
static const row ROWS[] = {
    /* ---- MC: letters in every dress */
    {MC, 0, T, "Air is mostly nitrogen.</think>\n\nAnswer: B", T, "B"},
    {MC, 0, T, "</think>Answer: B.", T, "B"},
    {MC, 0, T, "</think>**Answer: B**", T, "B"},
    {MC, 0, T, "</think>**Answer:** B", T, "B"},
    {MC, 0, T, "</think>Answer: (B)", T, "B"},
    {MC, 0, T, "</think>Answer: B) Nitrogen", T, "B"},
    {MC, 0, T, "</think>The answer is B.", T, "B"},
    {MC, 0, T, "</think>The answer is **B**.", T, "B"},
    {MC, 0, T, "</think>Final answer: option B", T, "B"},
    {MC, 0, T, "</think>$\\boxed{B}$", T, "B"},
    {MC, 0, T, "</think>\\boxed{\\text{B}}", T, "B"},
    {MC, 0, T, "</think>So it is nitrogen.\n\n\\boxed{B}\n", T, "B"},
    {MC, 0, T, "</think>answer: b", F, ""},
    {MC, 0, T, "</think>Answer:\n\nB", T, "B"},
    {MC, 0, T, "</think>ANSWER: B", T, "B"},
    {MC, 0, T, "</think>Answer: Nitrogen", T, "B"},
    {MC, 0, T, "</think>Answer: nitrogen.", T, "B"},
    {MC, 0, T, "</think>Nitrogen", T, "B"},
    {MC, 0, T, "</think>Answer: A", F, "A"},
    {MC, 0, T, "</think>Answer: Oxygen", F, "A"},
    {MC, 0, T, "</think>Answer: (C) Argon", F, "C"},
    {MC, 0, T, "</think>\\boxed{D}", F, "D"},
    {MC, 0, T, "Answer: B is my guess but let me think more", F, ""},
    {MC, 0, T, "I think the answer is B", F, ""},
    {MC, 0, F, "Answer: B", T, "B"},
    {MC, 0, F, "The answer is (B).", T, "B"},
    {MC, 0, F, "B", T, "B"},
    {MC, 0, T, "</think>I first thought A, but the answer is B.", T, "B"},
    {MC, 0, T, "</think>Answer: A\n\nWait, no. Answer: B", T, "B"},
    {MC, 0, T, "</think>Answer: B\n\nOn reflection, Answer: A", F, "A"},
    {MC, 0, T, "Maybe A?</think>\n\nAnswer: B", T, "B"},
    {MC, 0, T, "</think>\\boxed{A} is wrong; Answer: B", F, "A"},
    {MC, 0, T, "</think>", F, ""},
    {MC, 0, T, "</think>   \n\n  ", F, ""},
    {MC, 0, T, "</think>Answer: E", F, ""},
    {MC, 0, T, "</think>Answer: Oxygen or nitrogen", F, ""},
    {MC, 1, T, "</think>Answer: C", T, "C"},
    {MC, 1, T, "</think>Answer: 20 m", T, "C"},
    {MC, 1, T, "</think>It falls 20 m.", T, "C"},
    {MC, 1, T, "</think>Answer: 40 m", F, "B"},
    {MC, 1, T, "</think>Answer: *C*", T, "C"},
    {MC, 1, T, "</think>Answer: C (20 m)", T, "C"},
    {MC, 2, T, "</think>Answer: D", T, "D"},
    {MC, 2, T, "</think>Answer: 3", T, "D"},
    {MC, 2, T, "</think>pH = 3, so Answer: D.", T, "D"},
    {MC, 2, T, "</think>Answer: 11", F, "C"},
    {MC, 2, T, "</think>Answer: 1", F, "A"},
    {MC, 5, T, "</think>Answer: 2 ohm", T, "A"},
    {MC, 5, T, "</think>Answer: A) 2 ohm", T, "A"},
    {MC, 5, T, "</think>Answer: 18 ohm", F, "D"},
    {MC, 5, T, "</think>**A**", T, "A"},
    {MC, 6, T, "</think>Answer: Fluorine", T, "D"},
    {MC, 6, T, "</think>Answer: D. Fluorine", T, "D"},
    {MC, 6, T, "</think>Answer: fluorine", T, "D"},
    {MC, 6, T, "</think>Answer: Chlorine", F, "B"},
    {MC, 13, T, "</think>Answer: 91", T, "D"},
    {MC, 13, T, "</think>91 = 7 x 13.\n\nAnswer: D", T, "D"},
    {MC, 13, T, "</think>Answer: 97", F, "A"},
    {MC, 16, T, "</think>Answer: Ben", T, "D"},
    {MC, 16, T, "</think>Answer: D (Ben)", T, "D"},
    {MC, 16, T, "</think>Answer: Cal", F, "B"},
    {MC, 22, T, "</think>Answer: CH2O", T, "A"},
    {MC, 22, T, "</think>Answer: C6H12O6", F, "B"},
    {MC, 22, T, "</think>**Answer: A** (CH2O)", T, "A"},
    {MC, 25, T, "</think>Answer: 1/6", T, "A"},
    {MC, 25, T, "</think>Answer: 1/36", F, "D"},
    {MC, 25, T, "</think>Answer: A", T, "A"},
    {MC, 28, T, "</think>Answer: 90 degrees", T, "B"},
    {MC, 28, T, "</think>Answer: B", T, "B"},
    {MC, 28, T, "</think>Answer: 180 degrees", F, "D"},

    /* ---- MATH: numbers as models write them */
    {MATH, 0, T, "17*23 = 391</think>\n\nAnswer: 391", T, "391"},
    {MATH, 0, T, "</think>Answer: 391.", T, "391"},
    {MATH, 0, T, "</think>\\boxed{391}", T, "391"},
    {MATH, 0, T, "</think>$\\boxed{391}$.", T, "391"},
    {MATH, 0, T, "</think>**Answer: 391**", T, "391"},
    {MATH, 0, T, "</think>Answer: 17 * 23 = 391", T, "391"},
    {MATH, 0, T, "</think>The product is 391.", T, "391"},
    {MATH, 0, T, "</think>Answer: 391.0", T, "391.0"},
    {MATH, 0, T, "</think>Answer: 381", F, "381"},
    {MATH, 0, T, "</think>Answer: 3910", F, "3910"},
    {MATH, 0, T, "</think>Answer: 39", F, "39"},
    {MATH, 0, T, "</think>Answer: -391", F, "-391"},
    {MATH, 0, T, "</think>Answer: none", F, ""},
    {MATH, 0, T, "Answer: 391", F, ""},
    {MATH, 0, F, "Answer: 391", T, "391"},
    {MATH, 0, F, "391", T, "391"},
    {MATH, 0, T, "</think>\\boxed{391} (since 17*20 + 17*3)", T, "391"},
    {MATH, 0, T, "</think>Answer: 391 (17 * 23)", T, "391"},
    {MATH, 0, T, "</think>Answer: $391$", T, "391"},
    {MATH, 0, T, "</think>Answer: \\(391\\)", T, "391"},
    {MATH, 1, T, "</think>Answer: 5050", T, "5050"},
    {MATH, 1, T, "</think>Answer: 5,050", T, "5050"},
    {MATH, 1, T, "</think>\\boxed{5,050}", T, "5050"},
    {MATH, 1, T, "</think>Answer: 5 050", F, "5"},
    {MATH, 1, T, "</think>So the sum is 100 * 101 / 2 = 5050.", T, "5050"},
    {MATH, 1, T, "</think>Answer: 5,051", F, "5051"},
    {MATH, 1, T, "</think>Answer: 50,50", F, "50"},
    {MATH, 4, T, "</think>Answer: C(10,3) = 120", T, "120"},
    {MATH, 4, T, "</think>Answer: 120 ways", T, "120"},
    {MATH, 4, T, "</think>\\boxed{\\binom{10}{3} = 120}", T, "120"},
    {MATH, 4, T, "</think>Answer: 720", F, "720"},
    {MATH, 4, T, "</think>There are 120 ways.\n\nAnswer: 120", T, "120"},
    {MATH, 10, T, "</think>Answer: 24", T, "24"},
    {MATH, 10, T, "</think>Answer: 20 + 4 = 24", T, "24"},
    {MATH, 10, T, "</think>Answer: 20", F, "20"},
    {MATH, 10, T, "</think>100! ends in 24 zeros.", T, "24"},
    {MATH, 10, T, "</think>Trailing zeros: 24", T, "24"},
    {MATH, 13, T, "</think>Answer: x = 3", T, "3"},
    {MATH, 13, T, "</think>Answer: 3", T, "3"},
    {MATH, 13, T, "</think>Answer: 2", F, "2"},
    {MATH, 13, T, "</think>The roots are 2 and 3, so the larger is 3.", T, "3"},
    {MATH, 13, T, "</think>\\boxed{x=3}", T, "3"},
    {MATH, 16, T, "</think>Answer: 35", T, "35"},
    {MATH, 16, T, "</think>Answer: 10*7/2 = 35", T, "35"},
    {MATH, 16, T, "</think>Answer: 45", F, "45"},
    {MATH, 19, T, "</think>Answer: 0.25", T, "0.25"},
    {MATH, 19, T, "</think>Answer: 1/4", T, "1/4"},
    {MATH, 19, T, "</think>\\boxed{\\frac{1}{4}}", T, "\\frac{1}{4}"},
    {MATH, 19, T, "</think>\\boxed{\\dfrac{1}{4}}", T, "\\dfrac{1}{4}"},
    {MATH, 19, T, "</think>Answer: .25", T, ".25"},
    {MATH, 19, T, "</think>Answer: 0.5", F, "0.5"},
    {MATH, 19, T, "</think>Answer: 1/2", F, "1/2"},
    {MATH, 19, T, "</think>Answer: 0.250", T, "0.250"},
    {MATH, 20, T, "</think>Answer: 1", T, "1"},
    {MATH, 20, T, "</think>Answer: 1/2 + 1/3 + 1/6 = 1", T, "1"},
    {MATH, 20, T, "</think>Answer: 6/6", T, "6/6"},
    {MATH, 20, T, "</think>Answer: 1.0", T, "1.0"},
    {MATH, 20, T, "</think>Answer: 5/6", F, "5/6"},

    /* ---- CODE: printed output */
    {CODE, 0, T, "</think>Answer: 10", T, "10"},
    {CODE, 0, T, "</think>Answer: `10`", T, "10"},
    {CODE, 0, T, "</think>Output: 10", T, "10"},
    {CODE, 0, T, "</think>The program prints 10.", T, "10"},
    {CODE, 0, T, "</think>The output is:\n\n```\n10\n```", T, "10"},
    {CODE, 0, T, "</think>```\n10\n```", T, "10"},
    {CODE, 0, T, "</think>Answer: 15", F, "15"},
    {CODE, 0, T, "</think>Answer: 0 1 2 3 4", F, "0 1 2 3 4"},
    {CODE, 0, T, "</think>\\boxed{10}", T, "10"},
    {CODE, 0, T, "no close tag, Answer: 10", F, ""},
    {CODE, 2, T, "</think>Answer: cba", T, "cba"},
    {CODE, 2, T, "</think>Answer: \"cba\"", T, "cba"},
    {CODE, 2, T, "</think>Answer: 'cba'", T, "cba"},
    {CODE, 2, T, "</think>Answer: `cba`.", T, "cba"},
    {CODE, 2, T, "</think>Answer: abc", F, "abc"},
    {CODE, 2, T, "</think>Answer: CBA", F, "CBA"},
    {CODE, 2, T, "</think>Answer: cb", F, "cb"},
    {CODE, 3, T, "</think>Answer: 3 1", T, "3 1"},
    {CODE, 3, T, "</think>Answer: 3  1", T, "3 1"},
    {CODE, 3, T, "</think>Answer: `3 1`", T, "3 1"},
    {CODE, 3, T, "</think>Answer: 31", F, "31"},
    {CODE, 3, T, "</think>Answer: 3.5 1", F, "3.5 1"},
    {CODE, 3, T, "</think>Answer: (3, 1)", F, "(3,1)"},
    {CODE, 8, T, "</think>Answer: [0, 1, 4, 9]", T, "[0,1,4,9]"},
    {CODE, 8, T, "</think>Answer: [0,1,4,9]", T, "[0,1,4,9]"},
    {CODE, 8, T, "</think>Answer: `[0, 1, 4, 9]`", T, "[0,1,4,9]"},
    {CODE, 8, T, "</think>Answer:\n```\n[0, 1, 4, 9]\n```", T, "[0,1,4,9]"},
    {CODE, 8, T, "</think>Answer: [ 0, 1, 4, 9 ].", T, "[0,1,4,9]"},
    {CODE, 8, T, "</think>Answer: [1, 4, 9]", F, "[1,4,9]"},
    {CODE, 8, T, "</think>Answer: [0, 1, 4, 9, 16]", F, "[0,1,4,9,16]"},
    {CODE, 8, T, "</think>Answer: 0 1 4 9", F, "0 1 4 9"},
    {CODE, 13, T, "</think>Answer: 2.5", T, "2.5"},
    {CODE, 13, T, "</think>Answer: 2.5.", T, "2.5"},
    {CODE, 13, T, "</think>Answer: 2", F, "2"},
    {CODE, 13, T, "</think>Answer: 2.50", F, "2.50"},
    {CODE, 14, T, "</think>Answer: False True", T, "False True"},
    {CODE, 14, T, "</think>Answer: `False True`", T, "False True"},
    {CODE, 14, T, "</think>Answer: false true", F, "false true"},
    {CODE, 14, T, "</think>Answer: True True", F, "True True"},
    {CODE, 14, T, "</think>Answer: False, True", F, "False,True"},
    {CODE, 17, T, "</think>Answer: [(1, 'a'), (2, 'b')]", T, "[(1,'a'),(2,'b')]"},
    {CODE, 17, T, "</think>Answer: `[(1, 'a'), (2, 'b')]`", T, "[(1,'a'),(2,'b')]"},
    {CODE, 17, T, "</think>Answer: [(1,'a'),(2,'b')]", T, "[(1,'a'),(2,'b')]"},
    {CODE, 17, T, "</think>Answer: [(1, \"a\"), (2, \"b\")]", F, "[(1,\"a\"),(2,\"b\")]"},
    {CODE, 17, T, "</think>Answer: [(1, 'a'), (2, 'b'), (3, None)]", F, "[(1,'a'),(2,'b'),(3,None)]"},
    {CODE, 23, T, "</think>Answer: -3", T, "-3"},
    {CODE, 23, T, "</think>The program prints -3.", T, "-3"},
    {CODE, 23, T, "</think>Answer: -4", F, "-4"},
    {CODE, 23, T, "</think>Answer: -3.5", F, "-3.5"},

    /* ---- SEC: line numbers */
    {SEC, 0, T, "</think>Answer: 4", T, "4"},
    {SEC, 0, T, "</think>Answer: line 4", T, "4"},
    {SEC, 0, T, "</think>Answer: Line 4.", T, "4"},
    {SEC, 0, T, "</think>Answer: L4", T, "4"},
    {SEC, 0, T, "</think>Answer: **4**", T, "4"},
    {SEC, 0, T, "</think>\\boxed{4}", T, "4"},
    {SEC, 0, T, "</think>The strcat on line 4 overflows buf.", T, "4"},
    {SEC, 0, T, "</think>Answer: 4 (strcat into a 32-byte buffer)", T, "4"},
    {SEC, 0, T, "</think>Answer: 3", F, "3"},
    {SEC, 0, T, "</think>Answer: 0", F, "0"},
    {SEC, 0, T, "</think>Answer: line 2 declares buf", F, "2"},
    {SEC, 0, T, "</think>The function is unsafe.", F, ""},
    {SEC, 0, T, "Line 4 is the bug", F, ""},
    {SEC, 0, F, "Answer: 4", T, "4"},
    {SEC, 0, T, "</think>Answer: 14", F, "14"},
    {SEC, 5, T, "</think>Answer: 0", T, "0"},
    {SEC, 5, T, "</think>Answer: 0 (the function is safe)", T, "0"},
    {SEC, 5, T, "</think>The function is safe.\n\nAnswer: 0", T, "0"},
    {SEC, 5, T, "</think>Answer: 5", F, "5"},
    {SEC, 5, T, "</think>Answer: safe", F, ""},
    {SEC, 7, T, "</think>Answer: 5", T, "5"},
    {SEC, 7, T, "</think>Answer: 6", T, "6"},
    {SEC, 7, T, "</think>Answer: lines 5-6", T, "5"},
    {SEC, 7, T, "</think>Answer: 3", F, "3"},
    {SEC, 7, T, "</think>Answer: 7", F, "7"},
    {SEC, 13, T, "</think>Answer: 3", T, "3"},
    {SEC, 13, T, "</think>Answer: 6", T, "6"},
    {SEC, 13, T, "</think>Answer: 5", F, "5"},
    {SEC, 13, T, "</think>The malloc on line 3 is one byte short.", T, "3"},
    {SEC, 13, T, "</think>\\boxed{3}", T, "3"},
};

static const ds4_eval_question *nth(ds4_eval_category cat, int index) {
    int n;
    const ds4_eval_question *q = ds4_eval_questions(&n);
    for (int i = 0; i < n; i++)
        if (q[i].cat == cat && index-- == 0) return &q[i];
    return NULL;
}

static void test_rows(void) {
    int n = (int)(sizeof ROWS / sizeof ROWS[0]);
    CHECK(n >= 200, "the table holds %d replies, the issue asks for 200", n);
    int passing = 0;
    for (int i = 0; i < n; i++) {
        const row *r = &ROWS[i];
        const ds4_eval_question *q = nth(r->cat, r->index);
        CHECK(q != NULL, "row %d: no question %s %d", i, ds4_eval_category_name(r->cat), r->index);
        if (!q) continue;
        ds4_eval_verdict v;
        ds4_eval_grade(q, r->text, strlen(r->text), r->thinking, &v);
        CHECK(v.pass == r->pass && !strcmp(v.picked, r->picked), "row %d (%s %d, key %s) %s: got %s '%s', want %s '%s'", i,
              ds4_eval_category_name(r->cat), r->index, q->answer, r->text, v.pass ? "pass" : "fail", v.picked,
              r->pass ? "pass" : "fail", r->picked);
        passing += r->pass;
    }
    /* a table of only right answers (or only wrong ones) proves little */
    CHECK(passing > n / 3 && passing < 2 * n / 3, "%d of %d rows pass", passing, n);
}

/* The grader reads only text[0..len): a reply cut inside its answer grades
 * what is there. */
static void test_length_bound(void) {
    const ds4_eval_question *q = nth(DS4_EVAL_MATH, 0);
    const char *text = "</think>Answer: 3910";
    ds4_eval_verdict v;
    ds4_eval_grade(q, text, strlen(text) - 1, true, &v);
    CHECK(v.pass && !strcmp(v.picked, "391"), "got %d %s", v.pass, v.picked);
}

/* Every embedded question grades its own key as right, in the form the
 * prompt asks for; the keys have the form their category needs. */
static void test_table(void) {
    int n;
    const ds4_eval_question *q = ds4_eval_questions(&n);
    CHECK(n >= 90, "%d questions", n);
    int per[DS4_EVAL_N_CATEGORIES] = {0};
    for (int i = 0; i < n; i++) {
        CHECK(q[i].id == i + 1, "question %d has id %d", i + 1, q[i].id);
        CHECK(q[i].source && *q[i].source, "question %d has no source", q[i].id);
        per[q[i].cat]++;
        char reply[256];
        snprintf(reply, sizeof reply, "</think>\n\nAnswer: %s", q[i].answer);
        if (q[i].cat == DS4_EVAL_SEC) {
            /* the first accepted line */
            reply[strcspn(reply, ",")] = 0;
        }
        ds4_eval_verdict v;
        ds4_eval_grade(&q[i], reply, strlen(reply), true, &v);
        CHECK(v.pass, "question %d's key '%s' does not grade as right (picked '%s')", q[i].id, q[i].answer, v.picked);
        if (q[i].cat == DS4_EVAL_MC) {
            CHECK(strlen(q[i].answer) == 1 && q[i].answer[0] >= 'A' && q[i].answer[0] <= 'D', "q%d key %s", q[i].id, q[i].answer);
            /* the option text alone selects the key */
            snprintf(reply, sizeof reply, "</think>Answer: %s", q[i].options[q[i].answer[0] - 'A']);
            ds4_eval_grade(&q[i], reply, strlen(reply), true, &v);
            CHECK(v.pass, "q%d: option text '%s' picked '%s'", q[i].id, reply, v.picked);
        }
    }
    for (int c = 0; c < DS4_EVAL_N_CATEGORIES; c++) CHECK(per[c] >= 15, "category %s has %d questions", ds4_eval_category_name((ds4_eval_category)c), per[c]);
    /* interleaved: the first four are one of each */
    for (int i = 0; i < 4; i++) CHECK(q[i].cat == (ds4_eval_category)i, "q%d is %s", i + 1, ds4_eval_category_name(q[i].cat));
}

static int count(const bool *m, int n) { int c = 0; for (int i = 0; i < n; i++) c += m[i]; return c; }

static void test_select(void) {
    int n;
    const ds4_eval_question *q = ds4_eval_questions(&n);
    bool *m = calloc((size_t)n, sizeof *m);
    char err[200];
    CHECK(ds4_eval_select("3", m, n, err, sizeof err) && count(m, n) == 1 && m[2], "single id");
    CHECK(ds4_eval_select("q2-q5,9", m, n, err, sizeof err) && count(m, n) == 5 && m[1] && m[4] && m[8], "range and id");
    CHECK(ds4_eval_select("sec", m, n, err, sizeof err), "category");
    int sec = 0;
    for (int i = 0; i < n; i++) sec += q[i].cat == DS4_EVAL_SEC;
    CHECK(count(m, n) == sec && m[3], "sec selects %d of %d", count(m, n), sec);
    CHECK(ds4_eval_select("math,1", m, n, err, sizeof err) && m[0] && m[1] && !m[2], "mixed");
    const char *bad[] = {"", "0", "5-3", "x", "1,,2", "1,", "999", "1-999", "mathx", "-3", "3-", "q", "12345678901234567890123456789012345"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(!ds4_eval_select(bad[i], m, n, err, sizeof err) && err[0] && !strchr(err, '\n'), "'%s' accepted", bad[i]);
    }
    free(m);
}

int main(void) {
    test_rows();
    test_length_bound();
    test_table();
    test_select();
    return check_done("test_eval_grade");
}
