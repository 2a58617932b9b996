#!/usr/bin/env python3
"""Fails when a module of a workspace crate imports a module that imports it back.

For every crate under crates/*/src, each file is a module (`lib.rs`/`main.rs`
is the crate root, `a.rs` and `a/mod.rs` are `a`, `a/b.rs` is `a::b`). A module
A depends on module B when A names an item that B defines: in a `use` (groups
and nesting included), or inline as `crate::b::f(..)`, `super::f(..)` or
`self::b::f(..)`. A path through a re-export (`pub use b::X` in the root, then
`crate::X` elsewhere) counts as a dependency on the module that defines X, and
the re-export itself counts as the root depending on b. Test modules
(`#[cfg(test)] mod tests`, inline or in their own file) are left out: tests may
reach anywhere.

A cycle is a strongly connected set of two or more modules. Each is printed
with the lines that make it, and the exit status is 1.

    scripts/check-cycles.py [CRATES_DIR]      # default: crates/ next to this script
"""

import os
import re
import sys
from collections import defaultdict

ROOTS = ("lib.rs", "main.rs")


def strip(text):
    """Removes comments and string/char literal contents, keeping line numbers."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if text[i] == "\n" else "")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 8]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:i + 4])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_modules(text):
    """Blanks `#[cfg(test)] mod x { ... }` blocks (keeping newlines)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text)
        if not m:
            return text
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        text = text[:m.start()] + re.sub(r"[^\n]", "", text[m.start():j]) + text[j:]


def modules(src):
    """{module path: file}, and the set of files that are test modules."""
    mods, tests = {}, set()
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, src)[:-3].split(os.sep)
            if rel[-1] == "mod" or (len(rel) == 1 and rel[0] + ".rs" in ROOTS):
                rel = rel[:-1]
            mods["::".join(rel)] = full
    for path, full in mods.items():
        text = strip(open(full).read())
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
            tests.add("::".join(p for p in (path, m.group(1)) if p))
    return mods, tests


def expand_use(tree):
    """`a::{b, c::{d, e as f}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    # Renames go before the spaces do: `e as f` names e (and a name such as
    # `fdpass` holds "as" without being one).
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        i = s.find("{")
        if i < 0:
            return [prefix + s]
        head, body = s[:i], s[i + 1:s.rfind("}")]
        out = []
        for part in split_top(body):
            out += go(prefix + head, part)
        return out

    return [p.rstrip(":") for p in go("", tree)]


def resolve(segments, here, mods, reexports, depth=0):
    """The module that defines what `segments` (absolute, from the crate root) names."""
    if depth > 8:
        return None
    best = ""
    for k in range(len(segments), 0, -1):
        cand = "::".join(segments[:k])
        if cand in mods:
            best = cand
            rest = segments[k:]
            break
    else:
        rest = segments
    if rest:
        item = rest[0]
        target = reexports.get(best, {}).get(item)
        if target is not None:
            return resolve(target + rest[1:], here, mods, reexports, depth + 1)
    return best


def absolute(path, here):
    """A `crate::`/`super::`/`self::` path made absolute (a list of segments)."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    base = here.split("::") if here else []
    if segs[0] == "crate":
        return segs[1:]
    if segs[0] in ("super", "self"):
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        return base + segs
    return None


def scan(mods, tests):
    """Per module: (use trees with their line numbers, inline paths with theirs)."""
    found = {}
    for path, full in mods.items():
        if path in tests or any(path.startswith(t + "::") for t in tests):
            continue
        text = drop_test_modules(strip(open(full).read()))
        uses = []
        for m in re.finditer(r"\b(pub(\([^)]*\))?\s+)?use\s+([^;]+);", text):
            line = text.count("\n", 0, m.start()) + 1
            uses.append((bool(m.group(1)), expand_use(m.group(3)), line))
        inline = []
        for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", text):
            line = text.count("\n", 0, m.start()) + 1
            inline.append((m.group(1), line))
        found[path] = (uses, inline)
    return found


def graph(mods, found):
    # Re-exports: module -> {name: absolute target segments}.
    reexports = defaultdict(dict)
    for path, (uses, _) in found.items():
        for public, trees, _ in uses:
            if not public:
                continue
            for t in trees:
                segs = absolute(t, path)
                if segs is None:
                    segs = [s for s in t.split("::") if s]
                    if not segs or segs[0] not in {p.split("::")[0] for p in mods if p}:
                        continue
                    segs = (path.split("::") if path else []) + segs
                if segs:
                    reexports[path][segs[-1]] = segs
    edges = defaultdict(lambda: defaultdict(list))
    for path, (uses, inline) in found.items():
        refs = []
        for _, trees, line in uses:
            for t in trees:
                segs = absolute(t, path)
                if segs is None:
                    # `use child::X` in a module refers to its own child.
                    first = t.split("::")[0]
                    child = "::".join(p for p in (path, first) if p)
                    if child in mods:
                        segs = (path.split("::") if path else []) + t.split("::")
                if segs is not None:
                    refs.append((segs, line, t))
        for p, line in inline:
            segs = absolute(p, path)
            if segs is not None:
                refs.append((segs, line, p))
        for segs, line, text in refs:
            target = resolve(segs, path, mods, reexports)
            if target is None or target == path:
                continue
            edges[path][target].append((line, text))
    return edges


def sccs(nodes, edges):
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    crates = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "crates")
    bad = 0
    checked = 0
    for crate in sorted(os.listdir(crates)):
        src = os.path.join(crates, crate, "src")
        if not os.path.isdir(src):
            continue
        mods, tests = modules(src)
        found = scan(mods, tests)
        edges = graph(mods, found)
        checked += len(found)
        for comp in sccs(sorted(found), edges):
            bad += 1
            names = lambda m: m or "(crate root)"
            print(f"cycle in crates/{crate}: " + " ↔ ".join(names(m) for m in sorted(comp)))
            for a in sorted(comp):
                for b in sorted(comp):
                    for line, text in edges[a].get(b, [])[:3]:
                        rel = os.path.relpath(mods[a], os.path.join(crates, ".."))
                        print(f"  {rel}:{line}: {names(a)} uses {names(b)} ({text})")
    if bad:
        print(f"check-cycles: {bad} module cycle(s)", file=sys.stderr)
        return 1
    print(f"check-cycles: no module imports a module that imports it back ({checked} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
