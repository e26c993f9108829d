#!/usr/bin/env python3
"""Import cycles between the top-level modules of a Rust crate.

Usage: module-cycles.py <crate>/src [--no-reexports] [--graph]

Exits 1 when there is a cycle.

Edges: module A -> module B when a file of A names `crate::B...` (in a `use` or a path),
`super::B` from A's root file, or `crate::Item` / `use crate::{Item, ..}` where Item is
re-exported at the crate root from B (`pub use B::...` in lib.rs counts as importing B).
Prints the strongly connected components with more than one module (and self-edges are
ignored)."""
import os, re, sys

src = sys.argv[1]
count_reexports = "--no-reexports" not in sys.argv
lib = os.path.join(src, "lib.rs")
if not os.path.exists(lib):
    lib = os.path.join(src, "main.rs")

def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    return text

modules = set()
for f in os.listdir(src):
    p = os.path.join(src, f)
    if f.endswith(".rs") and f not in ("lib.rs", "main.rs"):
        modules.add(f[:-3])
    elif os.path.isdir(p) and os.path.exists(os.path.join(p, "mod.rs")):
        modules.add(f)

lib_text = strip(open(lib).read())
# Root re-exports: item name -> module it comes from.
root_items = {}
def expand_use(prefix, body):
    """Yield full paths from a use tree body (no braces at top unless group)."""
    body = body.strip()
    if body.startswith("{") and body.endswith("}"):
        depth = 0; cur = ""; parts = []
        for ch in body[1:-1]:
            if ch == "{": depth += 1
            if ch == "}": depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur); cur = ""
            else:
                cur += ch
        parts.append(cur)
        for part in parts:
            if part.strip():
                yield from expand_use(prefix, part)
        return
    m = re.match(r"([\w:]*?)(::)?(\{.*\})$", body, re.S)
    if m and m.group(3):
        yield from expand_use(prefix + [s for s in m.group(1).split("::") if s], m.group(3))
        return
    path = body.split(" as ")
    name = path[1].strip() if len(path) > 1 else path[0].split("::")[-1].strip()
    yield prefix + [s.strip() for s in path[0].split("::") if s.strip()], name

for m in re.finditer(r"pub\s+use\s+(.*?);", lib_text, re.S):
    for path, name in expand_use([], m.group(1)):
        first = path[0] if path[0] != "crate" else path[1]
        if first in modules:
            root_items[name] = first

def files_of(mod):
    p = os.path.join(src, mod + ".rs")
    if os.path.exists(p):
        yield p, True
    d = os.path.join(src, mod)
    if os.path.isdir(d):
        for dp, _, fs in os.walk(d):
            for f in fs:
                if f.endswith(".rs"):
                    yield os.path.join(dp, f), os.path.join(dp, f) == os.path.join(d, "mod.rs")

edges = {m: {} for m in modules}
def add(a, b, why):
    if a != b and b in modules:
        edges[a].setdefault(b, why)

for mod in modules:
    for path, is_root in files_of(mod):
        text = strip(open(path).read())
        for m in re.finditer(r"\bcrate::(\w+)", text):
            name = m.group(1)
            if name in modules:
                add(mod, name, f"{os.path.relpath(path, src)}: crate::{name}")
            elif count_reexports and name in root_items:
                add(mod, root_items[name], f"{os.path.relpath(path, src)}: crate::{name} (root re-export)")
        for m in re.finditer(r"\buse\s+crate::\{(.*?)\};", text, re.S):
            for p, name in expand_use([], "{" + m.group(1) + "}"):
                first = p[0]
                if first in modules:
                    add(mod, first, f"{os.path.relpath(path, src)}: crate::{{{first}..}}")
                elif count_reexports and first in root_items:
                    add(mod, root_items[first], f"{os.path.relpath(path, src)}: crate::{first} (root re-export)")
        if is_root and path.endswith(mod + ".rs"):
            for m in re.finditer(r"\bsuper::(\w+)", text):
                add(mod, m.group(1), f"{os.path.relpath(path, src)}: super::{m.group(1)}")

# Tarjan's SCC.
index = {}; low = {}; stack = []; on = set(); sccs = []; counter = [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(sorted(comp))
for v in sorted(modules):
    if v not in index:
        strong(v)

cycles = [c for c in sccs if len(c) > 1]
print(f"{src}: {len(modules)} top-level modules, root re-exports {'counted' if count_reexports else 'not counted'}")
if not cycles:
    print("no import cycles")
for c in cycles:
    print(f"cycle of {len(c)}: {', '.join(c)}")
    for a in c:
        for b, why in sorted(edges[a].items()):
            if b in c:
                print(f"  {a} -> {b}   ({why})")
if "--graph" in sys.argv:
    for a in sorted(modules):
        print(f"{a} -> {', '.join(sorted(edges[a]))}")
sys.exit(1 if cycles else 0)
