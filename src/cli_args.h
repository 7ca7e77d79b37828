/* cli_args.h -- option values of the command-line mains (ds4, ds4-server,
 * ds4-bench), parsed strictly.
 *
 * Contract
 * - The whole string must be the number: empty strings, leading garbage and
 *   trailing bytes are rejected, as are values out of range (errno ERANGE
 *   or outside [lo, hi]). On false, *out is untouched.
 * - Integers are decimal with an optional sign and leading white space
 *   (strtol); lo and hi must lie within int's range.
 * - Floats take everything strtof takes.
 * - ds4_parse_sampling_option() recognises the sampling options every
 *   generating binary shares (--temp, --top-p, --min-p, --top-k, --seed):
 *   0 when name is not one of them, 1 when it is and the value was stored,
 *   -1 when it is but the value is missing or bad (p untouched).
 */
#ifndef DS4_CLI_ARGS_H
#define DS4_CLI_ARGS_H

#include <stdbool.h>

#include "sampler.h"

bool ds4_parse_int(const char *s, long lo, long hi, int *out);
bool ds4_parse_float(const char *s, float *out);
int ds4_parse_sampling_option(const char *name, const char *value, ds4_sampler_params *p);

#endif
