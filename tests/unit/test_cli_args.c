/* test_cli_args.c -- option-value parsing: what strtol/strtof accept as a
 * whole string is taken, everything else (empty, partial, out of range) is
 * refused without touching the output. */
#include "check.h"
#include "options/cli_args.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

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

    ds4_sampler_params sp, before;
    ds4_sampler_params_default(&sp);
    CHECK(ds4_parse_sampling_option("--temp", "0.5", &sp) == 1 && sp.temperature == 0.5f, "--temp");
    CHECK(ds4_parse_sampling_option("--top-k", "40", &sp) == 1 && sp.top_k == 40, "--top-k");
    CHECK(ds4_parse_sampling_option("--seed", "18446744073709551615", &sp) == 1 && sp.seed == UINT64_MAX, "--seed max");
    before = sp;
    CHECK(ds4_parse_sampling_option("--top-p", "x", &sp) == -1 && ds4_parse_sampling_option("--seed", NULL, &sp) == -1 &&
          ds4_parse_sampling_option("--seed", "12x", &sp) == -1 && !memcmp(&sp, &before, sizeof sp), "bad values refused");
    CHECK(ds4_parse_sampling_option("--ctx", "5", &sp) == 0, "not a sampling option");
    return check_done("test_cli_args");
}
