"""The include graph keeps the layers docs/architecture.md lists.

docs/architecture.md's "Layers" list names src/'s folders bottom first, one
numbered item per rank, each folder as "`folder`:" before its modules (folders
of one rank never include each other). Every #include "..." of every file under src/ and app/
must name a header that exists under src/ (or the file's own folder), and a
file may include only from its own folder or from a folder of a lower rank;
app/ (the binaries and their own modules) sits above every src/ folder. The
check also fails when a src/ folder is missing from the list, when a listed
folder does not exist, or when the list is gone, so the document and the tree
cannot drift apart. No compiler needed: it reads the sources as text.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg)


def ranks_from_doc():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    m = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        fail("docs/architecture.md has no '## Layers' section")
        return {}
    ranks = {}
    # "N. `folder`: modules ... . `other`: modules", continued on indented lines;
    # a folder opens the item or a sentence
    for num, body in re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\Z)", m.group(1), re.S | re.M):
        for folder in re.findall(r"(?:\A|\.\s+)`([a-z0-9_/]+)`:", body):
            ranks[folder] = int(num)
    if not ranks:
        fail("the '## Layers' section lists no folders")
    return ranks


def folder_of(path):
    """src/models/dsv4/kv.c -> models/dsv4; the longest listed folder wins"""
    rel = os.path.relpath(os.path.dirname(path), os.path.join(ROOT, "src"))
    return rel


def main():
    ranks = ranks_from_doc()
    src = os.path.join(ROOT, "src")
    folders = set()
    for dirpath, _, files in os.walk(src):
        if any(f.endswith((".c", ".h", ".cu")) for f in files):
            folders.add(os.path.relpath(dirpath, src))
    for f in sorted(folders - set(ranks)):
        fail(f"src/{f} is not in docs/architecture.md's Layers list")
    for f in sorted(set(ranks) - folders):
        fail(f"docs/architecture.md lists `{f}`, which has no sources under src/")
    top = max(ranks.values(), default=0) + 1
    checked = 0
    for base in ("src", "app"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, base)):
            for name in sorted(files):
                if not name.endswith((".c", ".h", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                mine = folder_of(path) if base == "src" else None
                my_rank = ranks.get(mine, top) if base == "src" else top
                for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                    inc = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not inc:
                        continue
                    checked += 1
                    target = inc.group(1)
                    where = f"{os.path.relpath(path, ROOT)}:{n}"
                    if base == "app" and os.path.exists(os.path.join(dirpath, target)):
                        continue  # a binary's own modules (app/bench)
                    if not os.path.exists(os.path.join(src, target)):
                        fail(f"{where}: includes \"{target}\", which is not under src/")
                        continue
                    theirs = os.path.dirname(target) or "."
                    if theirs == mine:
                        continue
                    their_rank = ranks.get(theirs)
                    if their_rank is None:
                        continue  # reported above as an unlisted folder
                    if their_rank >= my_rank:
                        fail(f"{where}: {mine or base} (rank {my_rank}) includes {target} "
                             f"from {theirs} (rank {their_rank})")
    print(f"test_layers: {checked} includes checked, {len(failures)} violations")
    return 1 if failures or checked == 0 else 0


sys.exit(main())
