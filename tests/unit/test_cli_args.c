/* test_cli_args.c -- option-value parsing: what strtol/strtof accept as a
 * whole string is taken, everything else (empty, partial, out of range) is
 * refused without touching the output. */
#include "check.h"
#include "cli_args.h"

#include <limits.h>

int main(void) {
    int v = -7;
    CHECK(ds4_parse_int("42", 0, 100, &v) && v == 42, "42 -> %d", v);
    CHECK(ds4_parse_int("-3", -5, 5, &v) && v == -3, "-3 -> %d", v);
    CHECK(ds4_parse_int(" 8", 0, 10, &v) && v == 8, "leading space -> %d", v);
    CHECK(ds4_parse_int("2147483647", 0, INT_MAX, &v) && v == INT_MAX, "INT_MAX -> %d", v);
    v = -7;
    const char *bad[] = {"", "x", "12x", "1.5", "0x10", " ", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(!ds4_parse_int(bad[i], INT_MIN, INT_MAX, &v) && v == -7, "'%s' refused", bad[i]);
    CHECK(!ds4_parse_int(NULL, 0, 10, &v) && v == -7, "missing value refused");
    CHECK(!ds4_parse_int("16", 17, 100, &v) && !ds4_parse_int("101", 17, 100, &v) && v == -7, "range ends");
    CHECK(ds4_parse_int("17", 17, 100, &v) && v == 17 && ds4_parse_int("100", 17, 100, &v) && v == 100,
          "range ends inclusive");

    float f = -1.0f;
    CHECK(ds4_parse_float("0.25", &f) && f == 0.25f, "0.25 -> %g", f);
    CHECK(ds4_parse_float("1e-2", &f) && f == 1e-2f, "1e-2 -> %g", f);
    CHECK(ds4_parse_float("3", &f) && f == 3.0f, "3 -> %g", f);
    f = -1.0f;
    const char *badf[] = {"", "abc", "0.5x", "1e99", " "};
    for (size_t i = 0; i < sizeof badf / sizeof *badf; i++)
        CHECK(!ds4_parse_float(badf[i], &f) && f == -1.0f, "'%s' refused", badf[i]);
    CHECK(!ds4_parse_float(NULL, &f), "missing value refused");
    return check_done("test_cli_args");
}
