"""Disk KV cache across a server restart, through the openai SDK.

A multi-turn tool-calling conversation (scripted tool calls on the demo
model, so ids and exact-DSML replay are real) runs on three servers with the
same small cache thresholds:
  A  never stops: turns 1-3; its turn-3 logprobs are the reference.
  B  turns 1-2, SIGTERM (shutdown save), restart on the same directory,
     turn 3 with the tool-call arguments re-serialised by the client.
The restarted turn 3 must report cached tokens >= the shutdown snapshot,
show a disk hit and the replay block loaded from disk in the trace (canonical
rendering of the reordered arguments would not match the cached text), and
give logprobs equal to A's. The traces show the cold, continued (64-token
frontier) and evict saves. The cache files are checked against the seed's
KVC layout with Python's own SHA-1 and CRC-32. Finally a copy of the cache
with a byte flipped in every file is ignored by a third start (logged, and
the snapshot it tried is removed). Cache directory, files and the trace are
private (0700 / 0600).
A turn of 66 tool calls (more than the old fixed 64) is remembered whole:
a Responses continuation sending only the 66 outputs is served from the live
state (no 400), and the shutdown snapshot's KTM lists all 66 ids."""
import glob
import hashlib
import json
import os
import shutil
import stat
import struct
import tempfile
import zlib

import openai

from server_helper import Results, Server, demo_model_or_skip

NAME = "test_kv_restart"
D = "\uff5cDSML\uff5c"
SCRIPT = ("Let me check.</think>I'll read it now.\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"read_file\">\n<" + D +
          "parameter name=\"path\" string=\"true\">src/main.c</" + D + "parameter>\n<" + D +
          "parameter name=\"limit\" string=\"false\">200</" + D + "parameter>\n</" + D + "invoke>\n</" + D + "tool_calls>")
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                            "parameters": {"type": "object", "properties": {
                                                "path": {"type": "string"}, "limit": {"type": "integer"}}}}}]
SYSTEM = ("You are a careful coding agent working in a C repository. Read files before editing them, "
          "keep changes small, explain what you did in one sentence, and never invent file contents. ") * 3
FLAGS = ["--kv-cache-min-tokens", "16", "--kv-cache-cold-max-tokens", "100000", "--kv-cache-boundary-trim-tokens", "4",
         "--kv-cache-boundary-align-tokens", "16", "--kv-cache-continued-interval-tokens", "64",
         "--kv-disk-space-mb", "64"]


def parse_kvc(path):
    """The seed's KVC layout, read independently of the C code."""
    b = open(path, "rb").read()
    assert b[:3] == b"KVC" and b[3] == 1, "magic/version"
    quant, reason, flags = b[4], b[5], b[6]
    n_tokens, hits, ctx = struct.unpack_from("<III", b, 8)
    created, last_used, payload = struct.unpack_from("<QQQ", b, 24)
    (tlen,) = struct.unpack_from("<I", b, 48)
    text = b[52:52 + tlen]
    off = 52 + tlen
    assert b[off:off + 4] == b"DSV4", "payload magic"
    fields = struct.unpack_from("<13I", b, off)
    assert fields[1] == 2 and fields[7] == n_tokens and fields[2] == ctx, "payload header"
    off += payload
    tools = {}
    if flags & 1:
        assert b[off:off + 4] == b"KTM\x01"
        (count,) = struct.unpack_from("<I", b, off + 4)
        off += 8
        for _ in range(count):
            il, dl = struct.unpack_from("<II", b, off)
            tools[b[off + 8:off + 8 + il].decode()] = b[off + 8 + il:off + 8 + il + dl].decode()
            off += 8 + il + dl
    assert flags & 8 and b[off:off + 4] == b"KCK\x01" and off + 8 == len(b), "trailer"
    z = bytearray(b[:off])
    z[12:16] = bytes(4)
    z[32:40] = bytes(8)
    assert struct.unpack_from("<I", b, off + 4)[0] == zlib.crc32(bytes(z)), "crc"
    assert os.path.basename(path) == hashlib.sha1(text).hexdigest() + ".kv", "name = sha1(text)"
    return {"reason": reason, "tokens": n_tokens, "hits": hits, "text": text, "tools": tools, "quant": quant}


def check_cache_dir(res, cache_dir, label):
    """After faults: the cache directory holds only complete .kv files that
    parse and pass their CRC (the writer links a file only once it is whole)."""
    names = [n for n in os.listdir(cache_dir) if n != ".lock"]   # the directory's owner lock
    res.check(all(n.endswith(".kv") for n in names), f"{label}: no half-written files in the cache: {names}")
    for n in names:
        try:
            parse_kvc(os.path.join(cache_dir, n))
        except (AssertionError, struct.error) as e:
            res.check(False, f"{label}: cache file {n} invalid: {e}")


def turns(oc, t, upto):
    """Runs turns 1..upto; returns (messages so far, list of responses)."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Read src/main.c and summarise it."}]
    out = []
    for k in range(upto):
        r = oc.chat.completions.create(model="m", messages=msgs, tools=TOOLS, temperature=0)
        out.append(r)
        m = r.choices[0].message
        t.check(r.choices[0].finish_reason == "tool_calls" and len(m.tool_calls or []) == 1, f"turn {k + 1} tool call")
        tc = m.tool_calls[0]
        # the client re-serialises the arguments (key order, whitespace)
        args = json.dumps(dict(reversed(list(json.loads(tc.function.arguments).items()))), indent=1)
        msgs = msgs + [{"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content,
                        "tool_calls": [{"id": tc.id, "type": "function",
                                        "function": {"name": "read_file", "arguments": args}}]},
                       {"role": "tool", "tool_call_id": tc.id, "content": f"int main(void) {{ return {k}; }}"}]
    return msgs, out


def final_turn(oc, msgs):
    return oc.chat.completions.create(model="m", messages=msgs, tools=TOOLS, temperature=0, logprobs=True,
                                      top_logprobs=3)


def lp_list(r):
    return [(c.token, c.logprob, [(x.token, x.logprob) for x in c.top_logprobs]) for c in r.choices[0].logprobs.content]


MANY = 66


def private_modes(t, d, trace):
    t.check(stat.S_IMODE(os.stat(d).st_mode) == 0o700, f"cache dir mode {oct(os.stat(d).st_mode)}")
    modes = {os.path.basename(p): stat.S_IMODE(os.stat(p).st_mode) for p in glob.glob(os.path.join(d, "*.kv"))}
    t.check(modes and all(m == 0o600 for m in modes.values()), f"cache file modes {modes}")
    t.check(stat.S_IMODE(os.stat(trace).st_mode) == 0o600, f"trace file mode {oct(os.stat(trace).st_mode)}")


def many_calls(t, tmp):
    script = os.path.join(tmp, "many.txt")
    with open(script, "w", encoding="utf-8") as f:
        f.write("Calling.</think>\n\n<" + D + "tool_calls>\n" +
                "".join("<" + D + "invoke name=\"ping\">\n</" + D + "invoke>\n" for _ in range(MANY)) +
                "</" + D + "tool_calls>")
    d = os.path.join(tmp, "many")
    trace = os.path.join(tmp, "many-trace.log")  # created by the server itself
    tools = [{"type": "function", "name": "ping", "parameters": {"type": "object", "properties": {}}}]
    srv = Server("--scripted-output", script, "--kv-disk-dir", d, *FLAGS, "--trace", trace, ctx=4096)
    try:
        oc = openai.OpenAI(base_url=srv.base + "/v1", api_key="dummy", max_retries=0, timeout=300)
        r = oc.responses.create(model="m", input="Ping everything", tools=tools)
        calls = [o for o in r.output if o.type == "function_call"]
        t.check(len(calls) == MANY, f"{len(calls)} calls in one turn")
        try:
            r2 = oc.responses.create(model="m", tools=tools, max_output_tokens=1, input=[
                {"type": "function_call_output", "call_id": c.call_id, "output": "pong"} for c in calls])
            t.check(r2.usage.input_tokens_details.cached_tokens > 0, f"live continuation of {MANY} calls {r2.usage}")
        except openai.APIStatusError as e:
            t.check(False, f"continuation of {MANY} calls refused: {e}")
    finally:
        srv.proc.terminate()
        srv.proc.wait(timeout=60)
        srv.stop()
    files = [parse_kvc(p) for p in glob.glob(os.path.join(d, "*.kv"))]
    ids = {c.call_id for c in calls}
    t.check(any(ids <= set(f["tools"]) for f in files), f"no snapshot lists all {MANY} ids")
    private_modes(t, d, trace)


def main():
    demo_model_or_skip(NAME)
    t = Results(NAME)
    tmp = tempfile.mkdtemp(prefix="ds4-kvrestart-")
    script = os.path.join(tmp, "script.txt")
    with open(script, "w", encoding="utf-8") as f:
        f.write(SCRIPT)
    dir_a, dir_b, dir_c = (os.path.join(tmp, x) for x in ("a", "b", "c"))
    client = lambda srv: openai.OpenAI(base_url=srv.base + "/v1", api_key="dummy", max_retries=0, timeout=300)
    try:
        # A: the uninterrupted reference
        a = Server("--scripted-output", script, "--kv-disk-dir", dir_a, *FLAGS)
        try:
            oa = client(a)
            msgs, _ = turns(oa, t, 2)
            ref = final_turn(oa, msgs)
            tr = a.trace_text()
            t.check(".kv (cold, " in tr, "cold save on the first prompt")
            t.check(".kv (continued, 64 tokens" in tr, "continued save at the 64-token frontier")
        finally:
            a.stop()
        ref_lp = lp_list(ref)
        t.check(len(ref_lp) > 0, "reference turn has content logprobs")

        # B: two turns, clean stop, restart, third turn
        b = Server("--scripted-output", script, "--kv-disk-dir", dir_b, *FLAGS)
        try:
            msgs_b, rs = turns(client(b), t, 2)
        finally:
            b.proc.terminate()
            b.proc.wait(timeout=60)
            t.check(b.proc.returncode == 0, f"clean exit after SIGTERM ({b.proc.returncode})")
            b.stop()
        files = {os.path.basename(p): parse_kvc(p) for p in glob.glob(os.path.join(dir_b, "*.kv"))}
        shut = [f for f in files.values() if f["reason"] == 4]
        t.check(len(shut) == 1, f"one shutdown snapshot ({[f['reason'] for f in files.values()]})")
        ids = [r.choices[0].message.tool_calls[0].id for r in rs]
        if shut:
            s = shut[0]
            t.check(set(ids) <= set(s["tools"]), f"KTM holds both tool ids {ids} vs {list(s['tools'])}")
            t.check(all(v.encode() in s["text"] for v in s["tools"].values()), "KTM blocks are in the cached text")
            t.check(s["text"].endswith(b"</" + D.encode() + b"tool_calls>"), "snapshot ends with the last tool call")

        b2 = Server("--scripted-output", script, "--kv-disk-dir", dir_b, *FLAGS)
        try:
            got = final_turn(client(b2), msgs_b)
            # an unrelated conversation replaces the live session: evict save first
            client(b2).chat.completions.create(model="m", messages=[{"role": "user", "content": "Something else " * 8}],
                                               max_tokens=1)
            tr = b2.trace_text()
            t.check(".kv (evict, " in tr, "evict save before an unrelated request")
        finally:
            b2.stop()
        cached = got.usage.prompt_tokens_details.cached_tokens
        t.check(shut and cached >= shut[0]["tokens"], f"cached {cached} >= snapshot {shut[0]['tokens'] if shut else '?'}")
        t.check(cached > got.usage.prompt_tokens // 2, f"cached {cached} of {got.usage.prompt_tokens}")
        t.check("cache: disk cache" in tr and "kv-disk: hit" in tr, "trace shows the disk hit")
        t.check("replay block loaded" in tr or "2 tool ids" in tr, "replay map restored from disk")
        t.check(lp_list(got) == ref_lp, f"logprobs after restart differ from the uninterrupted run:\n{lp_list(got)[:3]}\n{ref_lp[:3]}")
        t.check(got.choices[0].message.content == ref.choices[0].message.content, "same answer")

        # C: a damaged copy of the cache is ignored, logged and removed
        shutil.copytree(dir_b, dir_c)
        victims = sorted(glob.glob(os.path.join(dir_c, "*.kv")), key=os.path.getsize)
        for v in victims:
            with open(v, "r+b") as f:
                f.seek(os.path.getsize(v) // 2)
                c = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([c[0] ^ 0x40]))
        c = Server("--scripted-output", script, "--kv-disk-dir", dir_c, *FLAGS)
        try:
            r = final_turn(client(c), msgs_b)
            tr = c.trace_text()
            log = open(c.log.name, encoding="utf-8", errors="replace").read()
        finally:
            c.stop()
        t.check(r.choices[0].finish_reason == "tool_calls", "damaged cache: request still served")
        t.check("kv-disk: hit" not in tr, "damaged file was used")
        t.check("checksum mismatch" in log, "damaged file logged on stderr")
        shut_name = [n for n, f in files.items() if f["reason"] == 4]
        t.check(shut_name and not os.path.exists(os.path.join(dir_c, shut_name[0])), "damaged snapshot removed")
        many_calls(t, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    t.done()


if __name__ == "__main__":
    main()
