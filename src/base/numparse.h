/* numparse.h -- numbers from strings, parsed strictly (option values, metadata
 * overrides, environment variables).
 *
 * Contract
 * - The whole string must be the number: NULL, empty strings, leading garbage
 *   and trailing bytes are rejected, as are values out of range (errno
 *   ERANGE or outside [lo, hi]). On false, *out is untouched.
 * - Integers are decimal with an optional sign and leading white space
 *   (strtol); lo and hi must lie within int's range.
 * - Floats take everything strtof takes.
 */
#ifndef DS4_NUMPARSE_H
#define DS4_NUMPARSE_H

#include <stdbool.h>

bool ds4_parse_int(const char *s, long lo, long hi, int *out);
bool ds4_parse_float(const char *s, float *out);

#endif
