"""ds4-server HTTP layer against raw sockets: routing, error shapes
(server-api.md 8), limits, keep-alive, chunked bodies, half-closed and
vanishing clients, 200 concurrent connections; the server must keep serving
after every one of them."""
import json
import socket
import threading
import time

from server_helper import Results, Server, demo_model_or_skip, read_to_eof, recv_until

NAME = "test_server_http"


def raw(port, data, shutdown_write=False, timeout=30, read=True):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    if shutdown_write:
        s.shutdown(socket.SHUT_WR)
    out = recv_until(s, response_complete) if read else b""
    s.close()
    return out


def response_complete(buf):
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return len(body) >= int(v)
    return False


def parse(buf):
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    words = lines[0].split() if lines else []
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower().decode()] = v.strip().decode()
    return status, headers, body


def openai_error(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e["message"], str) and e["type"] in ("invalid_request_error", "server_error") \
            and "param" in e and "code" in e
    except (ValueError, KeyError, TypeError):
        return False


def anthropic_error(body, etype):
    try:
        o = json.loads(body)
        return o["type"] == "error" and o["error"]["type"] == etype and isinstance(o["error"]["message"], str)
    except (ValueError, KeyError, TypeError):
        return False


def post(path, body, extra=b""):
    if isinstance(body, str):
        body = body.encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n").encode() + extra + b"\r\n" + body


def host_and_framing_checks(t, p):
    """Probe findings: the Host check (DNS rebinding), transfer codings,
    \\u escapes and message roles."""
    def get(head):
        return parse(raw(p, b"GET /v1/models " + head + b"\r\n\r\n"))

    # a rebinding page's name too long to keep used to be stored as "" and
    # pass as "no Host"; now it is refused, never served
    domain = b".".join([b"a" * 63] * 3 + [b"b" * 61])   # 253 bytes, a valid DNS name
    st, _, body = get(b"HTTP/1.1\r\nHost: " + domain + b":%d" % p)
    t.check(st == 431, f"253-byte Host with port: {st} {body[:80]}")
    st, _, body = get(b"HTTP/1.1\r\nHost: " + b"a" * 255)
    t.check(st == 403 and openai_error(body), f"255-byte foreign Host is kept and refused: {st}")
    st, _, body = get(b"HTTP/1.1\r\nHost:")
    t.check(st == 403 and openai_error(body), f"empty Host on HTTP/1.1: {st} {body[:80]}")
    st, _, _ = get(b"HTTP/1.1")
    t.check(st == 400, f"HTTP/1.1 without Host: {st}")
    st, _, _ = get(b"HTTP/1.1\r\nHost: evil.example\r\nHost: 127.0.0.1")
    t.check(st == 400, f"two Host lines: {st}")
    st, _, body = get(b"HTTP/1.0")
    t.check(st == 200 and b'"object":"list"' in body, f"HTTP/1.0 without Host is served: {st}")
    st, _, _ = get(b"HTTP/1.1\r\nHost: localhost:%d" % p)
    t.check(st == 200, f"loopback Host is served: {st}")

    # a coding before chunked: the body would reach the JSON parser encoded
    body = b'{"messages":[{"role":"user","content":"x"}]}'
    st, _, out = parse(raw(p, b"POST /v1/messages/count_tokens HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"Content-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" +
                              b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"))
    t.check(st == 501, f"Transfer-Encoding: gzip, chunked: {st} {out[:80]}")

    # cJSON read "\\uzzzz" as U+0000 and cut the text there
    st, _, out = parse(raw(p, post("/v1/chat/completions",
                                   '{"max_tokens":1,"messages":[{"role":"user","content":"a\\uzzzzb"}]}')))
    t.check(st == 400 and openai_error(out) and b"\\\\u escape" in out, f"\\uzzzz: {st} {out[:160]}")

    # an unknown role used to be dropped silently: 400 naming it, per family
    for path, req, shaped in (
            ("/v1/chat/completions", {"max_tokens": 1, "messages": [
                {"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]},
             lambda b: openai_error(b) and json.loads(b)["error"]["param"] == "messages"),
            ("/v1/messages", {"model": "m", "max_tokens": 1, "messages": [{"role": "wizard", "content": "b"}]},
             lambda b: anthropic_error(b, "invalid_request_error")),
            ("/v1/responses", {"max_output_tokens": 1, "input": [{"type": "message", "role": "wizard", "content": "b"}]},
             lambda b: openai_error(b) and json.loads(b)["error"]["param"] == "input")):
        st, _, out = parse(raw(p, post(path, json.dumps(req))))
        t.check(st == 400 and shaped(out) and b"'wizard'" in out, f"{path}: unknown role: {st} {out[:200]}")


def main():
    demo_model_or_skip(NAME)
    t = Results(NAME)
    srv = Server("--cors")
    p = srv.port
    try:
        # a slow client (head never finished) is answered 408 and dropped
        # after the 10 s head timeout; runs alongside the other checks
        slow = {}

        def slow_client():
            slow["out"] = raw(p, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n", timeout=60)

        slow_thread = threading.Thread(target=slow_client)
        slow_thread.start()

        host_and_framing_checks(t, p)

        # models, query strings, aliases
        st, _, body = srv.request("GET", "/v1/models?client_version=1")
        ids = [m["id"] for m in json.loads(body)["data"]]
        t.check(st == 200 and "deepseek-v4-flash" in ids and "deepseek-v4-pro" in ids, f"models list {ids}")
        st, _, body = srv.request("GET", "/v1/models/deepseek-v4-pro")
        t.check(st == 200 and json.loads(body)["object"] == "model", "model retrieve")
        st, _, body = srv.request("GET", "/v1/models/gpt-x")
        t.check(st == 404 and json.loads(body)["error"]["code"] == "model_not_found", "unknown model 404")
        st, _, body = srv.request("GET", "/nope")
        t.check(st == 404 and openai_error(body), "unknown path 404 OpenAI shape")
        st, _, body = srv.request("POST", "/v1/messages/nope?beta=true", b"{}")
        t.check(st == 404 and anthropic_error(body, "not_found_error"), "unknown messages path: Anthropic shape")

        # HEAD is answered wherever GET is: the same status and headers, no
        # body. Pipelined with a GET on one connection, so a body sent after
        # the HEAD's head would show up as garbage before the GET's answer
        # (a prober such as aiperf's /metrics check sends HEAD, then GET).
        for path in ("/health", "/metrics", "/v1/models", "/nope"):
            get_st, get_h, get_body = parse(raw(p, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()))
            s = socket.create_connection(("127.0.0.1", p), timeout=30)
            s.sendall(f"HEAD {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                      f"GET /tokenizer_info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            out = recv_until(s, lambda out: out.count(b"\r\n\r\n") >= 2
                             and response_complete(out.split(b"\r\n\r\n", 1)[1]))
            s.close()
            head, _, rest = out.partition(b"\r\n\r\n")
            st, h, _ = parse(head + b"\r\n\r\n")
            st2, _, body2 = parse(rest)
            # /metrics changes between the two requests (request counters)
            same_len = path == "/metrics" or int(h.get("content-length", -1)) == len(get_body)
            t.check(st == get_st and h.get("content-type") == get_h.get("content-type") and same_len
                    and rest.startswith(b"HTTP/1.1 200 ") and st2 == 200 and "eos_token" in json.loads(body2),
                    f"HEAD {path}: {st} (GET {get_st}), no body, next response intact: {rest[:40]!r}")

        # a known path asked with another method: 405 with Allow, in the
        # path's family
        st, h, body = parse(raw(p, b"GET /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
        t.check(st == 405 and h.get("allow") == "POST, OPTIONS" and openai_error(body)
                and json.loads(body)["error"]["code"] == "method_not_allowed", f"GET on a POST route: {st} {h}")
        st, h, body = parse(raw(p, post("/health", "{}")))
        t.check(st == 405 and h.get("allow") == "GET, HEAD, OPTIONS", f"POST on a GET route: {st} {h}")
        st, h, body = parse(raw(p, b"DELETE /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
        t.check(st == 405 and h.get("allow") == "POST, OPTIONS" and anthropic_error(body, "invalid_request_error"),
                f"DELETE /v1/messages: {st} Anthropic shape")

        # CORS preflight echoes requested headers
        st, h, body = parse(raw(p, b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"Access-Control-Request-Headers: authorization, content-type\r\n\r\n"))
        t.check(st == 204 and h.get("access-control-allow-origin") == "*" and
                h.get("access-control-allow-headers") == "authorization, content-type" and body == b"",
                f"CORS preflight {st} {h}")

        # bad JSON / types / UTF-8 / missing fields, per family
        st, _, body = parse(raw(p, post("/v1/chat/completions", "{\"messages\": [")))
        t.check(st == 400 and openai_error(body) and json.loads(body)["error"]["message"] == "invalid JSON request",
                "malformed JSON")
        st, _, body = parse(raw(p, post("/v1/chat/completions", '{"messages":"hi"}')))
        t.check(st == 400 and openai_error(body), "wrong type")
        st, _, body = parse(raw(p, post("/v1/chat/completions", b'{"messages":[{"content":"\xff\xfe"}]}')))
        t.check(st == 400 and openai_error(body) and b"UTF-8" in body, "invalid UTF-8")
        st, _, body = parse(raw(p, post("/v1/chat/completions", "{}")))
        t.check(st == 400 and json.loads(body)["error"]["param"] == "messages", "missing messages")
        st, h, body = parse(raw(p, post("/v1/messages?beta=true", '{"messages":7}')))
        t.check(st == 400 and anthropic_error(body, "invalid_request_error") and h.get("x-should-retry") == "false",
                "Anthropic 400 shape")
        st, _, body = parse(raw(p, post("/v1/responses", '{"input":"x","previous_response_id":"resp_1"}')))
        t.check(st == 400 and json.loads(body)["error"]["param"] == "previous_response_id", "previous_response_id")
        st, _, body = parse(raw(p, post("/v1/responses", '{"input":[{"type":"function_call_output","call_id":"call_zz","output":"x"}]}')))
        t.check(st == 400 and b"continuation state is not available" in body, "unknown continuation id")

        # context overflow: wording and codes that clients key on (server-api.md 2.9)
        long = "word " * 3000
        st, h, body = srv.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": long}]})
        e = json.loads(body)["error"] if st == 400 else {}
        t.check(st == 400 and e.get("code") == "context_length_exceeded" and e.get("param") == "messages" and
                "maximum context length is 2048 tokens" in e.get("message", "") and e.get("n_ctx") == 2048,
                f"chat overflow {st} {body[:200]}")
        st, h, body = srv.request("POST", "/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": long}]})
        t.check(st == 400 and anthropic_error(body, "invalid_request_error") and b"prompt is too long" in body,
                f"anthropic overflow {body[:200]}")
        st, h, body = srv.request("POST", "/v1/responses", {"input": long, "stream": True})
        t.check(st == 200 and b"event: response.failed" in body and b'"code":"context_length_exceeded"' in body and
                b"exceeds the context window" in body, f"responses stream overflow {body[-300:]}")

        # body limits: a declared 100 MiB body is refused before it is sent
        st, _, body = parse(raw(p, b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n{"))
        t.check(st == 413 and anthropic_error(body, "request_too_large"), f"413 Anthropic {st}")
        st, _, body = parse(raw(p, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 104857600\r\n\r\n"))
        t.check(st == 413 and openai_error(body), "413 OpenAI")
        big_head = b"GET /v1/models HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n"
        st, _, _ = parse(raw(p, big_head))
        t.check(st == 431, f"huge header {st}")
        st, _, _ = parse(raw(p, b"GARBAGE\r\n\r\n"))
        t.check(st == 400, "garbage request line")

        # keep-alive: two requests on one connection; chunked body; Expect
        s = socket.create_connection(("127.0.0.1", p), timeout=30)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while not response_complete(first):
            first += s.recv(65536)
        body = b'{"messages":[{"role":"user","content":"hello"}]}'
        s.sendall(b"POST /v1/messages/count_tokens?beta=true HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                  b"Expect: 100-continue\r\n\r\n" + b"%x\r\n" % 10 + body[:10] + b"\r\n" +
                  b"%x\r\n" % (len(body) - 10) + body[10:] + b"\r\n0\r\n\r\n")
        second = b""
        deadline = time.time() + 30
        while time.time() < deadline:
            second += s.recv(65536)
            if b"100 Continue" in second:
                second = second.split(b"\r\n\r\n", 1)[1]
            if response_complete(second):
                break
        s.close()
        st, _, b2 = parse(second)
        t.check(parse(first)[0] == 200 and st == 200 and json.loads(b2)["input_tokens"] > 4,
                f"keep-alive + chunked count_tokens {second[:200]}")

        # an HTTP/1.0 client gets a close-delimited (not chunked) stream
        body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 2})
        s = socket.create_connection(("127.0.0.1", p), timeout=60)
        s.sendall(f"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
        got = read_to_eof(s)
        s.close()
        st, h, b10 = parse(got)
        t.check(st == 200 and "transfer-encoding" not in h and b10.startswith(b"data: {") and
                b10.endswith(b"data: [DONE]\n\n"), f"HTTP/1.0 stream {got[:300]}")

        # half-closed: full request then SHUT_WR still gets its answer;
        # a partial head then SHUT_WR just closes
        st, _, _ = parse(raw(p, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", shutdown_write=True))
        t.check(st == 200, "half-closed after a complete request")
        out = raw(p, b"GET /v1/models HTTP/1.1\r\nHo", shutdown_write=True)
        t.check(out == b"", f"half-closed mid-head: {out[:80]}")

        # a client that vanishes mid-stream frees the worker
        s = socket.create_connection(("127.0.0.1", p), timeout=60)
        s.sendall(post("/v1/chat/completions", json.dumps({
            "messages": [{"role": "user", "content": "write forever"}], "stream": True,
            "max_tokens": 100000, "temperature": 1})))
        got = b""
        while got.count(b"data:") < 3:
            b = s.recv(65536)
            if not b:
                break
            got += b
        s.close()
        t.check(b"text/event-stream" in got, "stream started")
        t0 = time.time()
        st, _, body = srv.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0})
        t.check(st == 200 and json.loads(body)["object"] == "chat.completion",
                f"served after a vanished client ({time.time() - t0:.1f}s)")
        t.check("client went away during generation" in srv.trace_text(), "trace notes the disconnect")

        # 200 concurrent connections: every one answered
        results = [None] * 200

        def one(i):
            try:
                if i % 20 == 0:
                    r = raw(p, post("/v1/chat/completions", json.dumps({
                        "messages": [{"role": "user", "content": f"n{i}"}], "max_tokens": 1, "temperature": 0})),
                        timeout=300)
                elif i % 3 == 0:
                    r = raw(p, post("/v1/chat/completions", "{bad"), timeout=120)
                else:
                    r = raw(p, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", timeout=120)
                results[i] = parse(r)[0]
            except OSError as e:
                results[i] = str(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(200)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        expect = [200 if i % 20 == 0 else 400 if i % 3 == 0 else 200 for i in range(200)]
        bad = [(i, r) for i, (r, e) in enumerate(zip(results, expect)) if r != e]
        t.check(not bad, f"concurrent: {bad[:5]}")
        slow_thread.join()
        t.check(parse(slow.get("out", b""))[0] == 408, f"slow client: {slow.get('out', b'')[:60]}")
        t.check(srv.alive(), "server alive at the end")

        # SIGTERM mid-stream: the stream ends with an in-stream error and the
        # chunked terminator, then the process exits cleanly
        s = socket.create_connection(("127.0.0.1", p), timeout=60)
        s.sendall(post("/v1/chat/completions", json.dumps({
            "messages": [{"role": "user", "content": "go on"}], "stream": True, "max_tokens": 100000})))
        got = b""
        while got.count(b"data:") < 3:
            got += s.recv(65536)
        srv.proc.terminate()
        try:
            while not got.endswith(b"0\r\n\r\n"):
                b = s.recv(65536)
                if not b:
                    break
                got += b
        except OSError:
            pass
        s.close()
        t.check(b"server shutting down" in got and got.endswith(b"0\r\n\r\n"), f"shutdown mid-stream: {got[-200:]}")
        t.check(srv.proc.wait(timeout=30) == 0, "clean exit")
    finally:
        srv.stop()
    t.done()


if __name__ == "__main__":
    main()
