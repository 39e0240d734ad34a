#!/usr/bin/env python3
"""Checks that every repository path README.md and docs/*.md name exists.

Docs that name a file which has moved send readers to nothing, and nothing
else notices. What counts as a path:
- the target of a Markdown link or image, [text](target), resolved from the
  page's own folder (web addresses and mail links are not checked); a target
  with #anchor must also name a heading of that page (GitHub's anchors);
- a word inside backticks or a fenced code block that starts with one of the
  repository's top folders (src/, transport/, collectives/, bench/, tests/,
  docs/, python/, examples/, include/, cmake/, .ci/), resolved from the
  repository's root. Words are split at spaces and at '=' (so
  ZP_TOPO_FILE=tests/data/x.json checks the file), and lose quotes, brackets
  and trailing punctuation. Globs (* ? [ { <) and ellipses are patterns, not
  paths, and are skipped, as is everything under build/ and the other build
  folders (they are outputs, not part of the tree). A program named by its
  source without the extension (bench/soak for bench/soak.cc) counts as there.

Run from ctest with the source directory as the argument (or from the
repository's root with none); prints one line per missing path, naming the
page and line, and fails if there is one.
"""
import os
import re
import sys

TOP = ("src/", "transport/", "collectives/", "bench/", "tests/", "docs/", "python/", "examples/", "include/",
       "cmake/", ".ci/")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
FENCE = re.compile(r"^\s*(```|~~~)")
PATTERN_CHARS = set("*?[]{}<>$")
# A program of the tree is named by its source's path without the extension.
PROGRAM_SOURCES = (".cc", ".c", ".py", ".sh")
STRIP = "\"'(),;:.!|"


def pages(root):
    yield "README.md"
    docs = os.path.join(root, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            yield "docs/" + name


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation
    dropped (hyphens and underscores kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if in_fence or not m:
                continue
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else "%s-%d" % (s, n))
    return found


def code_words(text):
    """Path-like words of a piece of code: split at spaces and '='."""
    for word in re.split(r"[\s=]+", text):
        word = word.strip(STRIP)
        if not word.startswith(TOP):
            continue
        if any(c in PATTERN_CHARS for c in word) or "..." in word:
            continue
        yield word.split("#")[0]


def check_page(root, page, anchor_cache):
    errors = []
    path = os.path.join(root, page)
    folder = os.path.dirname(path)
    in_fence = False
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for no, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        words = []
        if in_fence:
            words += list(code_words(line))
        else:
            for m in INLINE_CODE.finditer(line):
                words += list(code_words(m.group(2)))
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target):
                    continue  # http:, https:, mailto:
                file_part, _, anchor = target.partition("#")
                target_path = os.path.normpath(os.path.join(folder, file_part)) if file_part else path
                if not os.path.exists(target_path):
                    errors.append("%s:%d: link to %s: no such file" % (page, no, target))
                    continue
                if anchor and target_path.endswith(".md"):
                    if target_path not in anchor_cache:
                        anchor_cache[target_path] = anchors(target_path)
                    if anchor not in anchor_cache[target_path]:
                        errors.append("%s:%d: link to %s: no heading with that anchor" % (page, no, target))
        for word in words:
            where = os.path.join(root, word)
            if not os.path.exists(where) and not any(os.path.exists(where + e) for e in PROGRAM_SOURCES):
                errors.append("%s:%d: %s: no such file or folder" % (page, no, word))
    return errors


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    errors, checked, cache = [], 0, {}
    for page in pages(root):
        errors += check_page(root, page, cache)
        checked += 1
    for e in errors:
        print(e)
    print("doc_paths: %d pages, %d missing paths" % (checked, len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
