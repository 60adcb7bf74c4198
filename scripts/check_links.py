#!/usr/bin/env python3
"""Checks that every link and image in README.md, docs/*.md and the Markdown
under bench/ (the comparison scripts' README, the measurement log) resolves to a
file inside the repository, and that a `#anchor` into a Markdown file names
one of its headings. External links (http:, mailto:, //host) are refused:
they rot where nothing checks them; name the source in prose instead.
Exits 1 naming each broken link."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
# [text](target) and ![alt](target), the target optionally <...> and followed by a "title".
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")
HTML_SRC = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """Yields (line number, line) outside fenced code blocks, inline code removed."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, INLINE_CODE.sub("", line)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors_of(path):
    seen = {}
    anchors = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.add(base if count == 0 else f"{base}-{count}")
    return anchors


def targets(text):
    for number, line in prose_lines(text):
        for pattern in (INLINE_LINK, REFERENCE_DEF, HTML_SRC):
            for match in pattern.finditer(line):
                yield number, match.group(1).strip("<>")


def is_external(target):
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None or target.startswith("//")


def check(doc):
    problems = []
    source = doc.relative_to(ROOT).as_posix()
    for number, target in targets(doc.read_text(encoding="utf-8")):
        where = f"{source}:{number}: ({target})"
        if is_external(target):
            problems.append(f"{where} leaves the repository: link to a file in it, or name the source in prose")
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc
        try:
            relative = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            problems.append(f"{where} points outside the repository")
            continue
        if not resolved.exists():
            problems.append(f"{where} names {relative}, which does not exist")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved):
            problems.append(f"{where} names #{anchor}, which is no heading of {relative}")
    return problems


def main():
    docs = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "bench").rglob("*.md"))
    problems = [p for doc in docs if doc.exists() for p in check(doc)]
    for problem in problems:
        print(f"broken link: {problem}", file=sys.stderr)
    if problems:
        print(f"check_links: {len(problems)} broken link(s) in {len(docs)} file(s)", file=sys.stderr)
        return 1
    print(f"check_links: every link in {len(docs)} file(s) resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
