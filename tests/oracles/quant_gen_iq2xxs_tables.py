#!/usr/bin/env python3
"""Print the IQ2_XXS format tables from tests/fixtures/quant/iq2xxs-tables.txt as C
initializers, for pasting into src/kernels/quant_iq2xxs.c (the committed C does not
need this script). Parsing follows the file's documented rule: a '#' line
opens a table named by its first word; hex literals up to the next '#' line
belong to it."""
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/quant/iq2xxs-tables.txt"
tables, cur = {}, None
for line in open(path):
    if line.startswith("#"):
        cur = line[2:].split()[0]
        tables[cur] = []
    else:
        tables[cur] += [int(v, 16) for v in line.split()]

def emit(ctype, name, vals, width, per_line):
    print(f"const {ctype} {name}[{len(vals)}] = {{")
    for i in range(0, len(vals), per_line):
        chunk = vals[i:i + per_line]
        suffix = "ull" if width == 16 else ""
        print("    " + ", ".join(f"0x{v:0{width}x}{suffix}" for v in chunk) + ",")
    print("};")

emit("uint64_t", "ds4_iq2xxs_grid", tables["iq2xxs_grid"], 16, 4)
emit("uint8_t", "ds4_ksigns_iq2xs", tables["ksigns_iq2xs"], 2, 16)
emit("uint8_t", "ds4_kmask_iq2xs", tables["kmask_iq2xs"], 2, 8)
