#!/usr/bin/env python3
"""Regenerates tests/fixtures/chat/ from the fact sheet
deepseek-v4-prompt-format.md (project documentation kept outside this
repository, so its path is an argument): the worked examples E1-E7 of
section 9 (request bodies and the exact prompt bytes, which the sheet's
reviewers produced by running the official encoder and ds4's renderer), the
two tools-block templates (5.2, 6.2) and the Think Max preamble (4.6) in
their JSON-string form, plus Python json.dumps(..., ensure_ascii=False)
outputs used as the oracle for the official schema-line serialisation.

usage: python3 tests/oracles/chat_examples.py path/to/deepseek-v4-prompt-format.md
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat")
if len(sys.argv) != 2:
    sys.exit("usage: python3 tests/oracles/chat_examples.py path/to/deepseek-v4-prompt-format.md")
DOC = sys.argv[1]


def text_blocks(s):
    return re.findall(r"```text\n(.*?)\n```", s, re.S)


def write(name, data):
    with open(os.path.join(OUT, name), "w", encoding="utf-8", newline="") as f:
        f.write(data)


def main():
    doc = open(DOC, encoding="utf-8").read()
    sec9 = doc[doc.index("## 9. Worked examples"):doc.index("## 10. Things")]
    b = text_blocks(sec9)
    names = ["e1_request.json", "e1_prompt.txt", "e2_request.json", "e2_prompt.txt",
             "e2_complete.txt", "e3_request.json", "e3_prompt.txt", "e4_request.json",
             "e4_official.txt", "e4_generated.txt", "e5_request.json", "e5_ds4.txt",
             "e6_request.json", "e6_official_tail.txt", "e6_ds4_tail.txt",
             "e7_request.json", "e7_ds4_tail.txt"]
    assert len(b) == len(names), len(b)
    for n, t in zip(names, b):
        if n.endswith(".json"):
            json.loads(t)
        write(n, t)
    # JSON-string forms: "As a JSON string" blocks of 4.6, 5.2 and 6.2
    def json_after(anchor, start_marker):
        sec = doc[doc.index(anchor):]
        sec = sec[sec.index(start_marker):]
        return json.loads(text_blocks(sec)[0])
    write("preamble_max.txt", json_after("### 4.6", "As a JSON string"))
    write("tools_official.txt", json_after("### 5.2", "As a JSON string"))
    write("tools_ds4.txt", json_after("### 6.2", "As a JSON string"))
    # 3.10: the non-thinking single-user prompt the official API counted
    sec310 = doc[doc.index("### 3.10"):]
    write("italian_prompt.txt", text_blocks(sec310)[0])

    cases = [
        '{"a":1,"b":[1,2,{"c":null}],"d":"x"}',
        '{"k":1,"k":2,"j":3}',
        '{"s":"caf\\u00e9 \\ud83d\\ude00 \\"q\\" \\\\ \\/ \\b\\f\\n\\r\\t \\u0001 \\u007f"}',
        '[0.5, 1e-05, 1.0, 1E5, 1e16, 1e15, 123456789012345678, 0.0001, 0.00001, -0, -0.0, 2.5e-7, 1.7976931348623157e308, 3.14159265358979323846, 100.0e-2, 5e-324]',
        '{"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "properties": {}}}',
        ' {"nested": {"x": [true, false, null, {"y": {}}, []]}} ',
        '"plain string with / and \\u2014"',
        '{"b":1,"a":{"b":2,"b":[3]},"b":4}',
    ]
    out = [[c, json.dumps(json.loads(c), ensure_ascii=False)] for c in cases]
    write("json_py_cases.json", json.dumps(out, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
