#!/usr/bin/env python3
"""Prints the functions longer than a limit in the given C++ files, one line
each: "file:line: N lines: <signature>". A function is a brace block whose
head ends in a parameter list (lambdas included); strings and comments are
skipped. Usage: long_functions.py LIMIT FILE..."""
import re
import sys

CONTROL = re.compile(r"^(if|for|while|switch|catch|else|do)\b")
CALL_HEAD = re.compile(r"\)\s*(const|override|noexcept|final|mutable|->[^{]*)*\s*$")


def code_only(text):
    """The text with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i) + 2
        elif text.startswith('R"(', i):
            j = text.find(')"', i) + 2
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] != text[i]:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def long_functions(path, limit):
    text = code_only(open(path, encoding="utf-8").read())
    line_at = []
    for number, line in enumerate(text.split("\n"), 1):
        line_at.extend([number] * (len(line) + 1))
    opened = []
    for i, c in enumerate(text):
        if c == "{":
            opened.append(i)
        elif c == "}" and opened:
            start = opened.pop()
            before = text[max(0, start - 400):start]
            head = before[max(before.rfind(";"), before.rfind("{"), before.rfind("}")) + 1:].strip()
            if not CALL_HEAD.search(head) or CONTROL.match(head.split("\n")[-1].strip()):
                continue
            lines = line_at[i] - line_at[start] + 1
            if lines > limit:
                yield line_at[start], lines, " ".join(head.split())[:90]


def main():
    limit = int(sys.argv[1])
    for path in sys.argv[2:]:
        for line, lines, head in long_functions(path, limit):
            print(f"  {path}:{line}: {lines} lines: {head}")


if __name__ == "__main__":
    main()
