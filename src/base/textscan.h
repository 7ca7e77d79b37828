/* textscan.h -- byte-level scanning helpers the incremental output parsers
 * (dsml.c, glm_tools.c) share: literal matching that can answer "not yet",
 * held-back suffixes, and cuts that never split a UTF-8 sequence.
 *
 * Contract
 * - Every function reads only s[0..n) and never allocates.
 * - ds4_scan_match() tells whether s starts with lit (FULL), is a proper
 *   prefix of it (PARTIAL: more input may still complete it) or neither.
 * - ds4_scan_find() is the offset of the first lit in s, or n + 1.
 * - ds4_scan_partial_suffix() is the length of the longest suffix of s that
 *   is a proper prefix of lit: the bytes a streaming parser must hold back.
 * - ds4_scan_utf8_cut() is the largest cut <= n that does not end inside a
 *   UTF-8 sequence (judged by the lead byte; invalid bytes pass).
 */
#ifndef DS4_TEXTSCAN_H
#define DS4_TEXTSCAN_H

#include <stdbool.h>
#include <stddef.h>

enum ds4_scan_match { DS4_SCAN_NO, DS4_SCAN_PARTIAL, DS4_SCAN_FULL };

enum ds4_scan_match ds4_scan_match(const char *s, size_t n, const char *lit);
size_t ds4_scan_find(const char *s, size_t n, const char *lit);
size_t ds4_scan_partial_suffix(const char *s, size_t n, const char *lit);
size_t ds4_scan_utf8_cut(const char *s, size_t n);
/* ASCII white space as C isspace() in the C locale. */
bool ds4_scan_ws(char c);

#endif
