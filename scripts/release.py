#!/usr/bin/env python3
"""The release helpers scripts/prepare-release.sh, scripts/publish-release.sh and
scripts/check-packages.sh share: which crates are published and in which order, the workspace
version and how to change it, and the changelog heading of a release.

Usage (from anywhere in the repository):
  release.py crates [--for-publish]    check the published-crate list, print it (one per line)
  release.py validate X.Y.Z            exit 1 unless X.Y.Z is a well-formed version
  release.py check-next X.Y.Z          exit 1 unless X.Y.Z is well formed and above the workspace version
  release.py current-version           print the workspace version
  release.py set-version X.Y.Z         set the workspace version and every inter-crate requirement
  release.py check-version X.Y.Z       exit 1 unless every published crate is at X.Y.Z
  release.py changelog-add X.Y.Z DATE  add the dated CHANGELOG.md heading of release X.Y.Z
  release.py changelog-check X.Y.Z     exit 1 unless CHANGELOG.md describes release X.Y.Z

The published crates are listed once, in publish order, under [workspace.metadata.release] in the
root Cargo.toml. Every failure is printed as "release.py: <what is wrong>: <what to do>" and exits 1.
"""

import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CARGO_TOML = ROOT / "Cargo.toml"
CHANGELOG = ROOT / "CHANGELOG.md"

# Semantic Versioning 2.0 without build metadata (registries ignore it): MAJOR.MINOR.PATCH with an
# optional pre-release such as 1.0.0-rc.1. No leading zeros in numeric identifiers.
NUM = r"(?:0|[1-9][0-9]*)"
PRE_ID = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
VERSION_RE = re.compile(rf"^({NUM})\.({NUM})\.({NUM})(?:-({PRE_ID}(?:\.{PRE_ID})*))?$")

# The line prepare-release.sh puts under a new heading when [Unreleased] says nothing; the
# publish script refuses a release whose section still holds it.
PLACEHOLDER = "<!-- Describe this release (Added, Changed, Fixed, Removed); publish-release.sh refuses while this line is here. -->"

REQUIRED_METADATA = ("description", "license", "readme", "documentation", "rust_version")


def fail(message):
    print(f"release.py: {message}", file=sys.stderr)
    sys.exit(1)


def parse_version(text):
    m = VERSION_RE.match(text)
    if not m:
        return None
    major, minor, patch, pre = m.groups()
    return (int(major), int(minor), int(patch), pre)


def version_key(parsed):
    """Semantic Versioning precedence: a pre-release sorts before its release."""
    major, minor, patch, pre = parsed
    if pre is None:
        return (major, minor, patch, 1, ())
    ids = tuple((0, int(i), "") if i.isdigit() else (1, 0, i) for i in pre.split("."))
    return (major, minor, patch, 0, ids)


def require_version(text):
    parsed = parse_version(text)
    if parsed is None:
        fail(
            f"malformed version '{text}': give MAJOR.MINOR.PATCH (for example 0.3.0), "
            "optionally with a pre-release such as 1.0.0-rc.1, without a leading 'v'"
        )
    return parsed


def metadata():
    try:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--manifest-path", str(CARGO_TOML)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except subprocess.CalledProcessError as e:
        fail(f"cargo metadata failed:\n{e.stderr}")
    return json.loads(out)


def release_list(meta):
    listed = ((meta.get("metadata") or {}).get("release") or {}).get("crates")
    if not isinstance(listed, list) or not listed or not all(isinstance(c, str) for c in listed):
        fail(
            "Cargo.toml has no [workspace.metadata.release] crates = [...]: list the published "
            "crates there, in publish order"
        )
    return listed


def check_crates(meta, for_publish):
    """The list names exactly the publishable members, each after the Runlimit crates it needs,
    and each carries the metadata a registry page shows. Returns the list."""
    listed = release_list(meta)
    members = {p["name"]: p for p in meta["packages"] if p["id"] in meta["workspace_members"]}
    problems = []
    if len(set(listed)) != len(listed):
        problems.append(f"[workspace.metadata.release] crates names a crate twice: {listed}")
    for name in listed:
        if name not in members:
            problems.append(f"{name} is listed in [workspace.metadata.release] crates but is not a workspace member")
        elif members[name]["publish"] == []:
            problems.append(f"{name} is listed in [workspace.metadata.release] crates but says publish = false")
    for name, pkg in sorted(members.items()):
        if pkg["publish"] != [] and name not in listed:
            problems.append(
                f"{name} is publishable (no publish = false) but missing from [workspace.metadata.release] "
                "crates: add it after every Runlimit crate it depends on, or set publish = false"
            )
    position = {name: i for i, name in enumerate(listed)}
    no_repository = []
    for name in listed:
        pkg = members.get(name)
        if pkg is None:
            continue
        for key in REQUIRED_METADATA:
            if not pkg.get(key):
                problems.append(f"{name} has no {key.replace('_', '-')} in its Cargo.toml")
        if not pkg.get("keywords"):
            problems.append(f"{name} has no keywords in its Cargo.toml")
        if not pkg.get("categories"):
            problems.append(f"{name} has no categories in its Cargo.toml")
        if for_publish and not pkg.get("repository"):
            no_repository.append(name)
        for dep in pkg["dependencies"]:
            dep_name = dep["name"]
            if dep_name not in members:
                continue
            # A dev-dependency without a version ("*") is left out of the published manifest.
            shipped = dep["kind"] != "dev" or dep["req"] != "*"
            if not shipped:
                continue
            if dep_name not in position:
                problems.append(
                    f"{name} depends on {dep_name} ({dep['kind'] or 'normal'}), which is not published: "
                    "publish it too, or make it a dev-dependency by path without a version"
                )
            elif position[dep_name] >= position[name]:
                problems.append(
                    f"{name} depends on {dep_name} ({dep['kind'] or 'normal'}), which is published after it: "
                    "reorder [workspace.metadata.release] crates"
                    + (", or depend on it by path without a version" if dep["kind"] == "dev" else "")
                )
            elif dep["req"] == "*":
                problems.append(f"{name} depends on {dep_name} without a version requirement: add version = ...")
    if no_repository:
        problems.append(
            f"{', '.join(no_repository)} name no repository, which a registry page links to: set "
            'repository = "<public URL of this repository>" under [workspace.package] and '
            "repository.workspace = true in each published crate's Cargo.toml"
        )
    if problems:
        fail("the published crates are not ready:\n  " + "\n  ".join(problems))
    return listed


def workspace_version_lines(text):
    """The [workspace.package] version line and the [workspace.dependencies] lines of Runlimit
    crates, as (line index, line) pairs."""
    lines = text.split("\n")
    section = None
    package_line = None
    dep_lines = []
    for i, line in enumerate(lines):
        header = re.match(r"^\[([^\]]+)\]\s*$", line)
        if header:
            section = header.group(1).strip()
            continue
        if section == "workspace.package" and re.match(r'^version\s*=\s*"', line):
            package_line = i
        if section == "workspace.dependencies" and re.match(r"^runlimit-[a-z0-9-]+\s*=\s*\{.*\bversion\s*=", line):
            dep_lines.append(i)
    return lines, package_line, dep_lines


def current_version():
    text = CARGO_TOML.read_text()
    _, package_line, _ = workspace_version_lines(text)
    if package_line is None:
        fail('Cargo.toml has no version = "..." under [workspace.package]')
    return re.search(r'"([^"]*)"', text.split("\n")[package_line]).group(1)


def check_next(new):
    """Exit 1 unless NEW is well formed and above the workspace version. Returns the latter."""
    new_parsed = require_version(new)
    old = current_version()
    old_parsed = parse_version(old)
    if old_parsed is None:
        fail(f"the workspace version '{old}' in Cargo.toml is malformed: fix it by hand first")
    if version_key(new_parsed) <= version_key(old_parsed):
        fail(f"version {new} is not above the current version {old}: choose a higher version")
    return old


def set_version(new):
    old = check_next(new)
    meta = metadata()
    listed = check_crates(meta, for_publish=False)
    text = CARGO_TOML.read_text()
    lines, package_line, dep_lines = workspace_version_lines(text)
    lines[package_line] = re.sub(r'"[^"]*"', f'"{new}"', lines[package_line], count=1)
    changed = set()
    for i in dep_lines:
        name = lines[i].split("=", 1)[0].strip()
        if name in listed:
            lines[i] = re.sub(r'(\bversion\s*=\s*)"[^"]*"', rf'\g<1>"{new}"', lines[i], count=1)
            changed.add(name)
    missing = [n for n in listed if n not in changed]
    if missing:
        fail(
            "Cargo.toml's [workspace.dependencies] has no runlimit entry with a version for "
            f"{', '.join(missing)}: add name = {{ path = \"crates/NAME\", version = \"{old}\" }} there"
        )
    CARGO_TOML.write_text("\n".join(lines))
    check_version(new)


def check_version(version):
    require_version(version)
    meta = metadata()
    listed = check_crates(meta, for_publish=False)
    members = {p["name"]: p for p in meta["packages"] if p["id"] in meta["workspace_members"]}
    problems = []
    for name in listed:
        pkg = members[name]
        if pkg["version"] != version:
            problems.append(f"{name} is at {pkg['version']}, not {version}")
        for dep in pkg["dependencies"]:
            if dep["name"] in listed and not (dep["kind"] == "dev" and dep["req"] == "*"):
                if dep["req"] != f"^{version}":
                    problems.append(f"{name} requires {dep['name']} {dep['req']}, not ^{version}")
    if problems:
        fail(
            f"the workspace is not at version {version}:\n  "
            + "\n  ".join(problems)
            + f"\n  (scripts/prepare-release.sh {version} sets every published crate and requirement)"
        )


def changelog_sections(text):
    """(heading line index, version or 'Unreleased') for each '## [...]' heading."""
    out = []
    for i, line in enumerate(text.split("\n")):
        m = re.match(r"^## \[([^\]]+)\]", line)
        if m:
            out.append((i, m.group(1)))
    return out


def changelog_add(version, date):
    require_version(version)
    if not re.match(r"^\d{4}-\d{2}-\d{2}$", date):
        fail(f"malformed date '{date}': give YYYY-MM-DD")
    if not CHANGELOG.exists():
        fail("CHANGELOG.md is missing: restore it (it keeps one section per release)")
    text = CHANGELOG.read_text()
    sections = changelog_sections(text)
    if any(v == version for _, v in sections):
        fail(f"CHANGELOG.md already has a heading for {version}: remove it or choose another version")
    unreleased = [i for i, v in sections if v == "Unreleased"]
    if not unreleased:
        fail("CHANGELOG.md has no '## [Unreleased]' heading: add one above the newest release")
    lines = text.split("\n")
    start = unreleased[0]
    following = [i for i, _ in sections if i > start]
    end = following[0] if following else len(lines)
    body = lines[start + 1 : end]
    has_notes = any(line.strip() for line in body)
    new = [lines[start], "", f"## [{version}] - {date}"]
    if has_notes:
        # The notes gathered under [Unreleased] become this release's.
        while body and not body[0].strip():
            body.pop(0)
        new += [""] + body
    else:
        new += ["", PLACEHOLDER, ""]
    lines[start:end] = new
    CHANGELOG.write_text("\n".join(lines))


def changelog_check(version):
    require_version(version)
    if not CHANGELOG.exists():
        fail("CHANGELOG.md is missing: restore it and describe the release there")
    text = CHANGELOG.read_text()
    lines = text.split("\n")
    sections = changelog_sections(text)
    found = [i for i, v in sections if v == version]
    if not found:
        fail(f"CHANGELOG.md has no '## [{version}] - YYYY-MM-DD' heading: run scripts/prepare-release.sh {version}")
    start = found[0]
    if not re.match(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", lines[start]):
        fail(f"CHANGELOG.md's heading '{lines[start]}' is not '## [{version}] - YYYY-MM-DD'")
    following = [i for i, _ in sections if i > start]
    body = lines[start + 1 : following[0] if following else len(lines)]
    if any(PLACEHOLDER in line for line in body):
        fail(f"CHANGELOG.md's section for {version} still holds the placeholder: describe the release and remove it")
    if not any(line.strip() and not line.strip().startswith("<!--") for line in body):
        fail(f"CHANGELOG.md's section for {version} is empty: describe the release")


def main(argv):
    if not argv:
        fail("no command: see the usage at the top of scripts/release.py")
    cmd, args = argv[0], argv[1:]
    if cmd == "crates" and args in ([], ["--for-publish"]):
        for name in check_crates(metadata(), for_publish=bool(args)):
            print(name)
    elif cmd == "validate" and len(args) == 1:
        require_version(args[0])
    elif cmd == "check-next" and len(args) == 1:
        check_next(args[0])
    elif cmd == "current-version" and not args:
        print(current_version())
    elif cmd == "set-version" and len(args) == 1:
        set_version(args[0])
    elif cmd == "check-version" and len(args) == 1:
        check_version(args[0])
    elif cmd == "changelog-add" and len(args) == 2:
        changelog_add(args[0], args[1])
    elif cmd == "changelog-check" and len(args) == 1:
        changelog_check(args[0])
    else:
        fail(f"unknown command or arguments: {' '.join(argv)} (see the usage at the top of scripts/release.py)")


if __name__ == "__main__":
    main(sys.argv[1:])
