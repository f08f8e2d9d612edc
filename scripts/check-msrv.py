#!/usr/bin/env python3
"""Fails, naming each one, when a locked dependency declares a rust-version above the minimum
supported Rust version (the rust-version of the workspace's packages, 1.94).

Only a newer toolchain may be installed where this runs, so nothing compiles with 1.94 itself. What
can be checked is checked: clippy's incompatible_msrv lint (denied in Cargo.toml's
[workspace.lints.clippy]) rejects uses of the standard library newer than rust-version in our own
code, and this script rejects dependencies that say they need a newer compiler. It reads every
package of each lockfile (all platforms and features: a lockfile does not depend on them) and the
rust-version each declares, through `cargo metadata --locked --all-features`.

Usage: scripts/check-msrv.py [MANIFEST ...]
  default: Cargo.toml and smoke/external-consumer/Cargo.toml (each with its own Cargo.lock)
"""

import json
import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_MANIFESTS = [ROOT / "Cargo.toml", ROOT / "smoke" / "external-consumer" / "Cargo.toml"]


def fail(message):
    print(f"check-msrv.py: {message}", file=sys.stderr)
    sys.exit(1)


def shown(path):
    """PATH relative to the repository when it is inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def version_tuple(text):
    parts = text.split(".")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        return None
    return tuple(numbers + [0] * (3 - len(numbers)))


def check(manifest):
    """Returns (packages checked, msrv, offenders) for one workspace and its lockfile."""
    lockfile = manifest.parent / "Cargo.lock"
    if not lockfile.exists():
        fail(f"{lockfile} does not exist: every checked workspace keeps its Cargo.lock")
    try:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features", "--manifest-path", str(manifest)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except subprocess.CalledProcessError as e:
        fail(f"cargo metadata --locked failed for {manifest} (is its Cargo.lock up to date?):\n{e.stderr}")
    meta = json.loads(out)
    members = [p for p in meta["packages"] if p["id"] in meta["workspace_members"]]
    msrvs = {p["rust_version"] for p in members}
    if len(msrvs) != 1 or None in msrvs:
        fail(
            f"the packages of {manifest} do not declare one rust-version ({sorted(map(str, msrvs))}): "
            "set rust-version once, in [workspace.package]"
        )
    msrv = msrvs.pop()
    limit = version_tuple(msrv)
    declared = {(p["name"], p["version"]): p.get("rust_version") for p in meta["packages"]}
    with open(lockfile, "rb") as f:
        locked = [(p["name"], p["version"]) for p in tomllib.load(f).get("package", [])]
    offenders = []
    for key in locked:
        if key not in declared:
            fail(
                f"{key[0]} {key[1]} is in {lockfile} but cargo metadata did not resolve it: "
                "refresh the lockfile (cargo update -w) and rerun"
            )
        rust_version = declared[key]
        if rust_version is None:
            continue
        needed = version_tuple(rust_version)
        if needed is None or needed > limit:
            offenders.append(f"{key[0]} {key[1]} declares rust-version {rust_version} ({shown(lockfile)})")
    return len(locked), msrv, offenders


def main(argv):
    manifests = [pathlib.Path(a).resolve() for a in argv] or DEFAULT_MANIFESTS
    problems = []
    for manifest in manifests:
        count, msrv, offenders = check(manifest)
        if offenders:
            problems.append((msrv, offenders))
        else:
            print(f"check-msrv.py: {count} locked packages of {shown(manifest)} support Rust {msrv}")
    if problems:
        lines = [o for _, found in problems for o in found]
        msrv = problems[0][0]
        fail(
            f"locked dependencies need a newer Rust than the minimum supported {msrv}:\n  "
            + "\n  ".join(lines)
            + f"\nLock an older version of each that supports {msrv} (cargo update -p NAME --precise VERSION), "
            "and bound it in [workspace.dependencies] with a comment saying why, as sfv's entry does"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
