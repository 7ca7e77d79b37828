"""A client that rewrites a block early in its prompt (a reminder, a date or
environment line at the end of its system prompt) keeps the prefix before
that block, on the live session and through the disk cache after another
conversation took the live session.

Anthropic /v1/messages on the demo model with a scripted answer and a disk
cache with small thresholds:
  A1  system S + reminder 1, question 1 (cold prefill);
  A2  system S + reminder 2, the conversation so far and question 2: the
      live session is cut at the first differing token and only the rest is
      prefilled (far fewer tokens than the prompt), and the common prefix is
      saved as a cache file of exactly that many tokens (branch checkpoint);
  B   another conversation (another system prompt) takes the live session;
  A3  system S + reminder 3, the conversation so far and question 3: the
      disk cache restores the branch checkpoint, so the reused tokens equal
      A2's. The files saved before (the cold one of A1's prompt, the evicted
      whole A1/A2 sessions) all hold an old reminder and are no prefix of
      A3: without the branch checkpoint A3 is prefilled from the start;
  C1, B, C2, B, C3  a conversation with its own system prompt whose turns
      never follow each other on the live session (another conversation
      runs between them): C2 finds nothing to reuse, but its prefill saves
      a checkpoint where it parts from C1's prompt, which C1 left behind
      when B replaced it; C3 restores that checkpoint and prefills far
      fewer tokens than its prompt;
  X1, A4, X2, A5, X3  the same when the conversation between X's turns is
      restored from the disk cache (A's branch checkpoint): a restore
      replaces the live session too, and X2 still saves where it parts from
      X1, which X3 restores.
"""
import glob
import re
import struct
import tempfile

from server_helper import Results, Server, demo_model_or_skip, write_temp_file

NAME = "test_kv_branch"
demo_model_or_skip(NAME)
res = Results(NAME)

SYSTEM = ("You are a careful coding agent working in a C repository. Read files before editing them, "
          "keep changes small, explain what you did in one sentence, and never invent file contents. ") * 4
FLAGS = ["--kv-cache-min-tokens", "16", "--kv-cache-cold-max-tokens", "100000", "--kv-cache-boundary-trim-tokens", "4",
         "--kv-cache-boundary-align-tokens", "16", "--kv-cache-continued-interval-tokens", "100000",
         "--kv-disk-space-mb", "64"]
CACHE = re.compile(r"cache: ([^\n]*?), prompt (\d+) tokens, reused (\d+), prefill (\d+)")


def system(turn):
    return SYSTEM + f"\n<system-reminder>Turn {turn}. The time is 10:{turn:02d}.</system-reminder>"


def ask(srv, sys_text, msgs):
    st, _, body = srv.request("POST", "/v1/messages", {"model": "deepseek-v4-flash", "max_tokens": 16,
                                                        "system": sys_text, "messages": msgs})
    res.check(st == 200, f"request answered: {st} {body[:200]!r}")
    return CACHE.findall(srv.trace_text())[-1]


def file_tokens(d):
    return sorted(struct.unpack_from("<I", open(p, "rb").read(), 8)[0] for p in glob.glob(d + "/*.kv"))


answer = write_temp_file("Noted.</think>Done.")
with tempfile.TemporaryDirectory(prefix="ds4-kvbranch-") as d:
    srv = Server("--scripted-output", answer, "--kv-disk-dir", d + "/kv", *FLAGS, ctx=4096)
    try:
        hist = [{"role": "user", "content": "Question 1: what does the build do?"}]
        how, prompt1, _, _ = ask(srv, system(1), hist)
        res.check(how == "cold", f"A1 is prefilled cold: {how}")
        before = file_tokens(d + "/kv")

        hist += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Question 2: and the tests?"}]
        how, prompt2, reused2, prefill2 = ask(srv, system(2), hist)
        prompt2, reused2, prefill2 = int(prompt2), int(reused2), int(prefill2)
        res.check(how == "common token prefix" and reused2 > 0, f"A2 keeps the live prefix: {how}, reused {reused2}")
        res.check(prefill2 * 3 < prompt2, f"A2 prefills far fewer tokens than its prompt: {prefill2} of {prompt2}")
        saved = file_tokens(d + "/kv")
        res.check(reused2 in saved and reused2 not in before,
                  f"A2 saved its common prefix with A1 ({reused2} tokens): files {before} -> {saved}")

        how, _, _, _ = ask(srv, "You translate text into French.", [{"role": "user", "content": "Good morning."}])
        res.check(how in ("cold", "common token prefix"), f"B takes the live session: {how}")

        hist += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Question 3: and the docs?"}]
        how, prompt3, reused3, prefill3 = ask(srv, system(3), hist)
        res.check(how == "disk cache" and int(reused3) == reused2,
                  f"A3 restores the branch checkpoint: {how}, reused {reused3} (A2 reused {reused2})")
        res.check(int(prefill3) * 3 < int(prompt3), f"A3 prefills far fewer tokens than its prompt: {prefill3} of {prompt3}")

        other = "You review patches for a C project and answer in short sentences. " * 15
        chist = [{"role": "user", "content": "Patch 1: the build flags."}]
        ask(srv, other + "\nToday is Monday.", chist)
        ask(srv, "You translate text into French.", [{"role": "user", "content": "Good evening."}])
        before = file_tokens(d + "/kv")
        chist += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Patch 2: the tests."}]
        how, _, reused, _ = ask(srv, other + "\nToday is Tuesday.", chist)
        res.check(int(reused) < 8, f"C2 finds no prefix of its own to reuse: {how}, reused {reused}")
        new = sorted(set(file_tokens(d + "/kv")) - set(before))
        ask(srv, "You translate text into French.", [{"role": "user", "content": "Good night."}])
        chist += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Patch 3: the docs."}]
        how, prompt, reused, prefill = ask(srv, other + "\nToday is Wednesday.", chist)
        res.check(how == "disk cache" and int(reused) in new,
                  f"C3 restores the checkpoint C2 saved where it parted from C1: {how}, reused {reused}, C2 saved {new}")
        res.check(int(prefill) * 3 < int(prompt), f"C3 prefills far fewer tokens than its prompt: {prefill} of {prompt}")

        third = "You write release notes for a C library, one line per change. " * 15
        xhist = [{"role": "user", "content": "Release 1: the parser."}]
        ask(srv, third + "\nMode: fast.", xhist)
        how, _, _, _ = ask(srv, system(4), hist)
        res.check(how == "disk cache", f"A4 is restored from the disk cache: {how}")
        before = file_tokens(d + "/kv")
        xhist += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Release 2: the server."}]
        ask(srv, third + "\nMode: slow.", xhist)
        new = sorted(set(file_tokens(d + "/kv")) - set(before))
        ask(srv, system(5), hist)
        xhist += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Release 3: the docs."}]
        how, prompt, reused, prefill = ask(srv, third + "\nMode: auto.", xhist)
        res.check(how == "disk cache" and int(reused) in new,
                  f"X3 restores the checkpoint X2 saved where it parted from X1: {how}, reused {reused}, X2 saved {new}")
        res.check(int(prefill) * 3 < int(prompt), f"X3 prefills far fewer tokens than its prompt: {prefill} of {prompt}")
        res.check(srv.alive(), "server alive")
    finally:
        srv.stop()
res.done()
