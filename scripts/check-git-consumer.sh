#!/usr/bin/env bash
# Builds and runs a consumer that depends on Runlimit the way the README's Installation section
# says: by Git URL, pinned to a full commit revision, every Runlimit crate on the same URL and
# revision, with the [dependencies] lines scripts/dependency-lines.sh prints. Run by
# scripts/test-packaging.
#
# URL: file://<this checkout>; revision: HEAD, the commit under test (uncommitted changes are not
# part of it, as they would not be for a consumer). The program is the external consumer's
# (smoke/external-consumer/src/main.rs), and its lockfile starts from that consumer's, so the
# third-party versions are the tested ones. Builds go to target/git-consumer. Cargo's checkout of
# the revision ($CARGO_HOME/git/checkouts/<checkout directory>-<hash>/<short revision>) is removed
# afterwards; its clone of the repository ($CARGO_HOME/git/db) is kept, as for any Git dependency.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)

die() { printf 'check-git-consumer.sh: %s\n' "$*" >&2; exit 1; }

REV=$(git -C "$REPO" rev-parse HEAD) || die "$REPO is not a Git checkout with a commit: the consumer depends on a commit of it"
[ ${#REV} = 40 ] || die "git rev-parse HEAD gave '$REV', not a full 40-character revision"
URL="file://$REPO"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/runlimit-git-consumer.XXXXXX")
finish() {
  rm -rf "$WORK" "${CARGO_HOME:-$HOME/.cargo}/git/checkouts/${REPO##*/}"-*/"${REV:0:7}"
}
trap finish EXIT
# The Git command line fetches from a checkout that is itself a linked worktree, which libgit2 may not.
export CARGO_NET_GIT_FETCH_WITH_CLI=true

mkdir -p "$WORK/consumer/src"
cat >"$WORK/consumer/Cargo.toml" <<EOF
[package]
name = "runlimit-git-consumer"
version = "0.0.0"
edition = "2024"
rust-version = "1.94"
publish = false

[workspace]

EOF
# The lines the README tells users to paste, as scripts/dependency-lines.sh prints them.
RUNLIMIT_GIT_URL="$URL" bash "$REPO/scripts/dependency-lines.sh" >>"$WORK/consumer/Cargo.toml" 2>/dev/null \
  || die "scripts/dependency-lines.sh failed"
cp "$REPO/smoke/external-consumer/src/main.rs" "$WORK/consumer/src/main.rs"
cp "$REPO/smoke/external-consumer/Cargo.lock" "$WORK/consumer/Cargo.lock"

cargo build --quiet --manifest-path "$WORK/consumer/Cargo.toml" --target-dir "$REPO/target/git-consumer" \
  || die "the consumer of $URL at $REV did not build (above)"

sources=$(python3 -c 'import sys, tomllib
for p in tomllib.load(open(sys.argv[1], "rb"))["package"]:
    if p["name"] in ("runlimit-core", "runlimit-memory"):
        print(p["name"], p.get("source"))' "$WORK/consumer/Cargo.lock")
expected="runlimit-core git+$URL?rev=$REV#$REV
runlimit-memory git+$URL?rev=$REV#$REV"
[ "$sources" = "$expected" ] || die "the consumer's lockfile does not take both crates from $URL at $REV:
$sources"

output=$(RUNLIMIT_KEY_SECRET=git-consumer-secret-git-consumer-secret-0123 "$REPO/target/git-consumer/debug/runlimit-git-consumer") \
  || die "the consumer built from $URL at $REV failed when run"
[ "$output" = "request admitted" ] || die "the consumer printed '$output', expected 'request admitted'"
printf 'check-git-consumer.sh: a consumer of runlimit-core and runlimit-memory from %s at rev %s builds and runs\n' "$URL" "$REV"
