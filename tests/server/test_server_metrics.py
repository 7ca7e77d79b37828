"""GET /metrics (issue 11, observability) read by the Prometheus project's own
text parser (prometheus_client), an independent oracle of the format.

On a 2-slot server with the demo model:
- every family parses, every *_total family is typed counter (seconds
  included: Prometheus counters are floats), nothing is sampled twice;
- before any request the slots hold no tokens and no state;
- after a request, ds4_kv_tokens is exactly the prompt plus generated
  tokens its usage reports; a second conversation goes to the other slot
  and adds its own; a follow-up turn of the first replaces that slot's
  count with the longer conversation's (its prefix is reused, not stacked);
  the unrelated second request must not evict the first conversation (they
  share only the JSON every request starts with): the follow-up finds its
  first turn cached;
- ds4_kv_bytes_used (the bytes of state those tokens fill) is positive,
  below the allocation ds4_kv_bytes reports, and grows with the tokens held;
- the tokens/s gauges are the token counters over their seconds counters;
- the token counters add up to what the requests' usage says;
- the trace has one timing line per request: the tokens it prefilled and
  decoded agree with its usage (prompt minus cached, completion) and add up
  to the counters, and its times are ordered (queue wait <= first token <=
  total; prefill and decode each within the total);
- a request whose client left before any response is counted under
  status="client_closed", never "0".
Greedy answers of the random-weight demo model are meaningless text; only
counts are checked."""
import json
import math
import os
import re
import socket

from prometheus_client.parser import text_string_to_metric_families

from server_helper import Results, Server, demo_model_or_skip, wait_for, write_temp_file

NAME = "test_server_metrics"

TIMING = re.compile(r"timing: queued ([0-9.]+) s, prefill (\d+) tokens in ([0-9.]+) s \([0-9.]+ tok/s\), "
                    r"first token at (-?[0-9.]+) s, decode (\d+) tokens in ([0-9.]+) s \([0-9.]+ tok/s\), "
                    r"total ([0-9.]+) s")


def scrape(srv, res):
    """{sample name with sorted labels: value}, and {family: type}"""
    status, headers, body = srv.request("GET", "/metrics")
    res.check(status == 200 and headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"),
              f"/metrics answers Prometheus text 0.0.4: {status} {headers.get('Content-Type')}")
    samples, types = {}, {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            res.check(key not in samples, f"sample {key} appears once")
            samples[key] = s.value
    return samples, types


def chat(srv, messages, max_tokens):
    status, _, body = srv.request("POST", "/v1/chat/completions",
                                  {"model": "demo", "messages": messages, "max_tokens": max_tokens,
                                   "temperature": 0})
    assert status == 200, body
    answer = json.loads(body)
    return answer["choices"][0], answer["usage"]


def held(usage, choice):
    """Tokens the slot's session holds after the request: the prompt and every
    generated token (a length stop decodes the last one too; a stop id is not
    appended)."""
    extra = 0 if choice["finish_reason"] == "length" else -1
    return usage["prompt_tokens"] + usage["completion_tokens"] + extra


def disconnects_have_their_own_status(res):
    """Probe finding: a request whose client left before any response was
    counted under status="0". It now shows under status="client_closed", and
    no sample is labelled "0". The scripted answer is long enough that the
    worker notices the closed socket long before it could answer."""
    script = write_temp_file("word " * 4000)
    srv = Server("--scripted-output", script, ctx=4096)
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "leave"}], "max_tokens": 3000}).encode()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        s.close()
        def chat_samples():
            return {k: v for k, v in scrape(srv, res)[0].items()
                    if k.startswith("ds4_requests_total{endpoint=/v1/chat/completions}")}

        wait_for(lambda: chat_samples(), "the request is counted once its connection is done", res, tries=300)
        got = chat_samples()
        res.check(got == {"ds4_requests_total{endpoint=/v1/chat/completions}{status=client_closed}": 1},
                  f"the disconnect is counted under status=client_closed: {got}")
        zero = [k for k in scrape(srv, res)[0] if "{status=0}" in k]
        res.check(not zero, f"no request is labelled status 0: {zero}")
        res.check(srv.alive(), "server alive")
    finally:
        srv.stop()
        os.unlink(script)


def main():
    demo_model_or_skip(NAME)
    res = Results(NAME)
    disconnects_have_their_own_status(res)
    srv = Server("--batched-session", "2", ctx=1024)
    try:
        m, types = scrape(srv, res)
        for name, kind in types.items():
            if name.endswith("_total") or kind == "counter":
                res.check(kind == "counter", f"{name} is typed {kind}, a *_total family is a counter")
        res.check(m.get("ds4_slots") == 2 and m.get("ds4_kv_tokens") == 0 and m.get("ds4_kv_bytes_used") == 0,
                  f"idle server holds nothing: {m.get('ds4_kv_tokens')} tokens, {m.get('ds4_kv_bytes_used')} bytes")
        allocated = m.get("ds4_kv_bytes", 0)
        res.check(allocated > 0, "the slots' allocation is reported")

        first = [{"role": "user", "content": "Name three colours of the rainbow."}]
        choice_a, usage_a = chat(srv, first, 6)
        m, _ = scrape(srv, res)
        want_a = held(usage_a, choice_a)
        res.check(m.get("ds4_kv_tokens") == want_a, f"one conversation: {m.get('ds4_kv_tokens')} tokens held, "
                                                    f"usage says {want_a}")
        bytes_a = m.get("ds4_kv_bytes_used", 0)
        res.check(0 < bytes_a < allocated, f"its state: 0 < {bytes_a} < {allocated}")

        other = [{"role": "user", "content": "Write one line about the sea, please, in plain words."}]
        choice_b, usage_b = chat(srv, other, 9)
        m, _ = scrape(srv, res)
        want_b = held(usage_b, choice_b)
        res.check(m.get("ds4_kv_tokens") == want_a + want_b,
                  f"two slots: {m.get('ds4_kv_tokens')} tokens held, usages say {want_a} + {want_b}")
        bytes_ab = m.get("ds4_kv_bytes_used", 0)
        res.check(bytes_a < bytes_ab < allocated, f"two slots' state: {bytes_a} < {bytes_ab} < {allocated}")

        follow = first + [{"role": "assistant", "content": choice_a["message"].get("content") or "Red."},
                          {"role": "user", "content": "And three more?"}]
        choice_c, usage_c = chat(srv, follow, 5)
        m, _ = scrape(srv, res)
        want_c = held(usage_c, choice_c)
        res.check(usage_c["prompt_tokens"] > usage_a["prompt_tokens"], "the follow-up prompt is longer")
        cached_c = usage_c.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        # the first turn's prompt ends in the assistant opener, which the
        # replayed history renders differently; in the wrong slot only the
        # template's first tokens would match
        res.check(cached_c >= usage_a["prompt_tokens"] - 2,
                  f"the unrelated request took the other slot: the follow-up reused {cached_c} cached tokens "
                  f"(its first turn's prompt had {usage_a['prompt_tokens']})")
        res.check(m.get("ds4_kv_tokens") == want_c + want_b,
                  f"a follow-up turn replaces its slot's count: {m.get('ds4_kv_tokens')} held, "
                  f"usages say {want_c} + {want_b}")
        res.check(m.get("ds4_kv_bytes_used", 0) > bytes_ab, "the longer conversation fills more state")

        usages = (usage_a, usage_b, usage_c)
        res.check(m.get("ds4_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages),
                  f"prompt tokens counted: {m.get('ds4_prompt_tokens_total')}")
        res.check(m.get("ds4_generated_tokens_total") == sum(u["completion_tokens"] for u in usages),
                  f"generated tokens counted: {m.get('ds4_generated_tokens_total')}")
        for phase in ("prefill", "decode"):
            tokens, seconds = m.get(f"ds4_{phase}_tokens_total", 0), m.get(f"ds4_{phase}_seconds_total", 0)
            rate = m.get(f"ds4_{phase}_tokens_per_second", -1)
            res.check(tokens > 0 and seconds > 0 and math.isclose(rate, tokens / seconds, rel_tol=1e-12),
                      f"{phase}: {rate} tokens/s is {tokens} tokens over {seconds} s")
        timings = [tuple(float(x) for x in t.groups()) for t in TIMING.finditer(srv.trace_text())]
        res.check(len(timings) == len(usages), f"{len(timings)} timing lines for {len(usages)} requests")
        for (queued, prefilled, prefill_s, first, decoded, decode_s, total), u in zip(timings, usages):
            cached = u["prompt_tokens_details"]["cached_tokens"]
            res.check(prefilled == u["prompt_tokens"] - cached and decoded == u["completion_tokens"],
                      f"timing line: prefilled {prefilled}, decoded {decoded}; usage {u}")
            res.check(0 <= queued <= first <= total and prefill_s <= total and decode_s <= total,
                      f"timing line ordered: queued {queued}, first token {first}, prefill {prefill_s}, "
                      f"decode {decode_s}, total {total}")
        res.check(sum(t[1] for t in timings) == m.get("ds4_prefill_tokens_total") and
                  sum(t[4] for t in timings) == m.get("ds4_decode_tokens_total"),
                  "the timing lines add up to the prefill and decode counters")
        res.check(srv.alive(), "server alive")
    finally:
        srv.stop()
    res.done()


if __name__ == "__main__":
    main()
