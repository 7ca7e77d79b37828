#include "server/access.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

bool ds4_access_is_loopback(const char *host) {
    struct in_addr v4;
    struct in6_addr v6;
    if (!strcasecmp(host, "localhost")) return true;
    if (inet_pton(AF_INET, host, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

/* The name part of a Host header: "[::1]:8000" -> "::1", "a:80" -> "a". */
static void host_name(const char *header, char *out, size_t cap) {
    const char *start = header, *end;
    if (*header == '[') {
        start = header + 1;
        end = strchr(start, ']');
        if (!end) end = start + strlen(start);
    } else {
        end = strchr(header, ':');
        if (!end) end = header + strlen(header);
    }
    size_t n = (size_t)(end - start) < cap ? (size_t)(end - start) : 0;
    memcpy(out, start, n);
    out[n] = 0;
}

/* An absent Host passes (only HTTP/1.0 gets here without one: http.h); a
 * present one, empty included, must name this server. */
static bool host_allowed(const ds4_server_opts *o, const ds4_http_req *hr) {
    if (!hr->has_host || !ds4_access_is_loopback(o->host)) return true;
    char name[256];
    host_name(hr->host, name, sizeof name);
    return ds4_access_is_loopback(name) || !strcasecmp(name, o->host);
}

static bool same_key(const char *given, const char *key) {
    size_t gl = strlen(given), kl = strlen(key);
    unsigned char diff = gl != kl;
    for (size_t i = 0; i < kl; i++) diff |= (unsigned char)(key[i] ^ given[i < gl ? i : 0]);
    return gl && !diff;
}

int ds4_access_check(const ds4_server_opts *o, const ds4_http_req *hr, const char **message, const char **code) {
    *code = NULL;
    if (!host_allowed(o, hr)) {
        *message = "this server only answers to a loopback Host name";
        return 403;
    }
    if (!strcmp(hr->method, "OPTIONS") || !strcmp(hr->path, "/health")) return 0;
    if (o->api_key && o->api_key[0] && !same_key(hr->bearer, o->api_key) && !same_key(hr->api_key, o->api_key)) {
        *message = "invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)";
        *code = "invalid_api_key";
        return 401;
    }
    if (!strcmp(hr->method, "POST") && strcmp(hr->content_type, "application/json")) {
        *message = "Content-Type must be application/json";
        return 415;
    }
    return 0;
}
