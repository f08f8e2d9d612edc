#!/usr/bin/env python3
"""Checks what a reader of Runlimit's docs meets.

1. Rendered rustdoc (``target/doc`` after ``scripts/doc``, built into an emptied directory): every relative link of the workspace crates' pages must name a file
   that exists, and no intra-doc link may be left unresolved (rustdoc prints those as literal
   ``[<code>...</code>]`` text).
2. Sources and READMEs: nothing may point at documents outside the repository or speak of how
   the work was organized: paths and notes kept elsewhere (``shared/spec``, ``gcra.md §3``,
   "the project's shared documents", "outside this repository"), work-tracking numbers ("issue
   7", "the issue asks"; an upstream project's issue is cited as ``owner/repo#N``) and words
   about who did the work ("another agent's profiler", "a helper session").

Usage: scripts/check-docs.py TARGET_DOC_DIR REPOSITORY_ROOT
Exits 1 and lists every problem when there is one.
"""

import html
import os
import re
import sys

HREF = re.compile(r'href="([^"]*)"')
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
UNRESOLVED = re.compile(r"\[<code>[^<]*</code>\]")
OUTSIDE = re.compile(
    r"shared/spec|\.\./shared/|\b[\w-]+\.md §|\b(?:gcra|http-ratelimit-fields|sqlx-postgres|redis-notes|runlimit)\.md\b"
    r"|\b[Tt]he issue (?:asks|says|requires|wants)\b|\b[Tt]his issue\b|\b[Ii]ssues? #?\d"
    r"|shared documents|outside (?:this|the) repository"
    r"|\b(?:another|other|an|the) agents?\b|\bagents'|\bagent's\b|\bsubagents?\b|\bhelper sessions?\b"
)
SOURCE_SUFFIXES = (".rs", ".md", ".toml", ".sql", ".proto", ".sh", ".py")


def workspace_crates(root):
    crates_dir = os.path.join(root, "crates")
    return sorted(name.replace("-", "_") for name in os.listdir(crates_dir) if os.path.isdir(os.path.join(crates_dir, name)))


def check_links(doc_dir, crates, problems):
    checked = 0
    for crate in crates:
        crate_dir = os.path.join(doc_dir, crate)
        if not os.path.isdir(crate_dir):
            problems.append(f"{crate_dir}: no rendered docs (was scripts/doc run?)")
            continue
        for directory, _, files in os.walk(crate_dir):
            for name in files:
                if not name.endswith(".html"):
                    continue
                page = os.path.join(directory, name)
                with open(page, encoding="utf-8") as f:
                    text = f.read()
                checked += 1
                # Trait implementations render the traits' own docs (`Debug`, tracing's
                # `Instrument`, clap's `FromArgMatches`), whose links are those crates' to keep.
                text = re.split(r'id="(?:trait-implementations|synthetic-implementations|blanket-implementations)"', text, maxsplit=1)[0]
                for href in HREF.findall(text):
                    href = html.unescape(href)
                    if SCHEME.match(href) or href.startswith(("#", "//")) or "${" in href:
                        continue
                    target = href.split("#", 1)[0].split("?", 1)[0]
                    if target and not os.path.exists(os.path.normpath(os.path.join(directory, target))):
                        problems.append(f"{page}: link to a missing file: {href}")
                if "/src/" not in page.replace(os.sep, "/"):
                    for literal in UNRESOLVED.findall(text):
                        problems.append(f"{page}: unresolved intra-doc link printed as text: {html.unescape(literal)}")
    return checked


def check_sources(root, problems):
    paths = [os.path.join(root, name) for name in ("README.md", "CHANGELOG.md", "ROADMAP.md", "RELEASING.md")]
    for top in ("crates", "scripts", "smoke"):
        for directory, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d != "target"]
            paths += [os.path.join(directory, name) for name in files if name.endswith(SOURCE_SUFFIXES)]
    this = os.path.abspath(__file__)
    for path in paths:
        if os.path.abspath(path) == this or not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                match = OUTSIDE.search(line)
                if match:
                    problems.append(f"{path}:{number}: points outside the repository or at how it was made: {match.group(0)!r}")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    doc_dir, root = sys.argv[1], sys.argv[2]
    problems = []
    pages = check_links(doc_dir, workspace_crates(root), problems)
    check_sources(root, problems)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check-docs: {len(problems)} problem(s)", file=sys.stderr)
        sys.exit(1)
    print(f"check-docs: {pages} pages, every link resolves; no source points outside the repository")


if __name__ == "__main__":
    main()
