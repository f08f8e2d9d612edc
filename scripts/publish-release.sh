#!/usr/bin/env bash
# Publishes release X.Y.Z, prepared by scripts/prepare-release.sh, committed, pushed and tested by
# CI on that exact commit:
#
#   scripts/publish-release.sh X.Y.Z
#
# Before anything is published it requires:
# - a clean working tree (no uncommitted or untracked files);
# - the checked-out branch to match its upstream exactly (this repository releases from `main`,
#   whose upstream is normally origin/main; the script fetches the upstream's remote and compares
#   commits), so the published crates are the commit CI tested;
# - every published crate at version X.Y.Z, requiring X.Y.Z of the others, with complete metadata
#   (a repository URL included);
# - a CHANGELOG.md section '## [X.Y.Z] - YYYY-MM-DD' that describes the release;
# - no tag vX.Y.Z, locally or on the remote, on another commit.
#
# Then it publishes the crates listed under [workspace.metadata.release] in Cargo.toml, in that
# order (runlimit-core, runlimit-memory, runlimit-postgres, runlimit-http, runlimit-axum, then
# the newer library crates), each only after the registry's index serves the one before it: after
# each `cargo publish` it waits until the index serves the version (RUNLIMIT_RELEASE_INDEX_TIMEOUT
# seconds, default 600, then it stops and says so) and until the published package's checksum
# equals the package this commit builds. After every crate is indexed it creates the annotated tag
# vX.Y.Z on this commit and pushes it to the upstream's remote.
#
# A version already on the registry stops the script before anything is published, unless
# RESUME_RELEASE=1: then each crate already published at X.Y.Z is verified (the checksum the
# registry's index records for it equals the checksum of the package `cargo package` builds from
# this commit) and the script goes on with the crates that are not published yet. Use it after a
# run that stopped partway; a verification failure stops it again.
#
# Registry: crates.io by default; RUNLIMIT_RELEASE_REGISTRY=NAME publishes to the registry NAME of
# Cargo's configuration ([registries.NAME] in a config.toml, or CARGO_REGISTRIES_<NAME>_INDEX),
# with the token Cargo has for it. Whether a version is on the registry is asked of Cargo itself:
# a scratch package requiring =X.Y.Z from that registry is resolved (cargo generate-lockfile),
# exactly as a consumer's build would, and its lockfile gives the published checksum.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf '\npublish-release.sh: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*"; }

[ $# -eq 1 ] || die "usage: scripts/publish-release.sh X.Y.Z (the version scripts/prepare-release.sh prepared)"
VERSION=$1
TAG="v$VERSION"
for tool in git cargo python3; do
  command -v "$tool" >/dev/null || die "$tool not found: install it (python3: Debian/Ubuntu apt-get install python3)"
done
TIMEOUT=${RUNLIMIT_RELEASE_INDEX_TIMEOUT:-600}
case $TIMEOUT in '' | *[!0-9]*) die "RUNLIMIT_RELEASE_INDEX_TIMEOUT='$TIMEOUT' is not a whole number of seconds" ;; esac
RESUME=${RESUME_RELEASE:-}
case $RESUME in '' | 0 | 1) ;; *) die "RESUME_RELEASE='$RESUME': set RESUME_RELEASE=1 to resume, or leave it unset" ;; esac
REGISTRY=${RUNLIMIT_RELEASE_REGISTRY:-}
if [ -n "$REGISTRY" ]; then
  REGISTRY_NAME="registry '$REGISTRY'"
  REGISTRY_ARGS=(--registry "$REGISTRY")
else
  REGISTRY_NAME="crates.io"
  REGISTRY_ARGS=()
fi

# --- before anything is published ------------------------------------------------------------
python3 scripts/release.py validate "$VERSION" || die "nothing was published"

if [ -n "$(git status --porcelain --untracked-files=normal)" ]; then
  git status --short >&2
  die "the working tree has uncommitted or untracked files (above): publish only the commit CI tested (commit and push, or stash); nothing was published"
fi

BRANCH=$(git symbolic-ref --quiet --short HEAD) || die "HEAD is detached: check out the release branch (main) that matches its upstream; nothing was published"
UPSTREAM=$(git rev-parse --abbrev-ref --symbolic-full-name '@{upstream}' 2>/dev/null) \
  || die "branch $BRANCH has no upstream: push it with 'git push -u origin $BRANCH' and let CI test it; nothing was published"
REMOTE=$(git config "branch.$BRANCH.remote")
[ "$REMOTE" != "." ] || die "branch $BRANCH's upstream $UPSTREAM is a local branch: the release branch must track a remote branch (git push -u origin $BRANCH); nothing was published"
git fetch --quiet "$REMOTE" || die "git fetch $REMOTE failed (above): the script compares $BRANCH with its upstream $UPSTREAM first; nothing was published"
HEAD_SHA=$(git rev-parse HEAD)
UPSTREAM_SHA=$(git rev-parse '@{upstream}')
if [ "$HEAD_SHA" != "$UPSTREAM_SHA" ]; then
  read -r AHEAD BEHIND < <(git rev-list --left-right --count "HEAD...@{upstream}")
  die "local $BRANCH ($HEAD_SHA) does not match its upstream $UPSTREAM ($UPSTREAM_SHA): $AHEAD commit(s) only here, $BEHIND only there. Push or pull until they match and CI has passed on that commit; nothing was published"
fi
say "release branch $BRANCH matches its upstream $UPSTREAM at $HEAD_SHA"

CRATES=$(python3 scripts/release.py crates --for-publish) || die "the published crates are not ready (above); nothing was published"
python3 scripts/release.py check-version "$VERSION" \
  || die "this commit is not release $VERSION (above): run scripts/prepare-release.sh $VERSION, commit and push first; nothing was published"
python3 scripts/release.py changelog-check "$VERSION" || die "nothing was published"

LOCAL_TAG=$(git rev-parse --quiet --verify "refs/tags/$TAG^{commit}" || true)
if [ -n "$LOCAL_TAG" ] && [ "$LOCAL_TAG" != "$HEAD_SHA" ]; then
  die "tag $TAG already exists here on $LOCAL_TAG, not on $HEAD_SHA: a release of $VERSION was made from another commit; nothing was published"
fi
REMOTE_TAGS=$(git ls-remote --tags "$REMOTE" "refs/tags/$TAG" "refs/tags/$TAG^{}") \
  || die "git ls-remote $REMOTE failed (above): the script checks that tag $TAG is not on another commit there; nothing was published"
# An annotated tag is listed twice, the tag object first and then (^{}) the commit it tags.
REMOTE_TAG=$(printf '%s\n' "$REMOTE_TAGS" | awk 'NF {print $1}' | tail -n1)
if [ -n "$REMOTE_TAG" ] && [ "$REMOTE_TAG" != "$HEAD_SHA" ]; then
  die "tag $TAG already exists on $REMOTE on $REMOTE_TAG, not on $HEAD_SHA: a release of $VERSION was made from another commit; nothing was published"
fi

TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/runlimit-publish.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT

# Whether NAME VERSION is on the registry's index, asked the way a consumer's build asks: resolve
# a scratch package requiring exactly that version. Returns 0 when it is there, with the checksum
# the index records in PUBLISHED_SUM; returns 1 when the index does not have it; stops the script
# on any other error.
PUBLISHED_SUM=""
probe() {
  local name=$1 dir="$SCRATCH/probe-$1" registry_key="" out
  PUBLISHED_SUM=""
  mkdir -p "$dir"
  if [ -n "$REGISTRY" ]; then registry_key=", registry = \"$REGISTRY\""; fi
  cat >"$dir/Cargo.toml" <<EOF
[package]
name = "runlimit-release-probe"
version = "0.0.0"
edition = "2021"
publish = false

[lib]
path = "lib.rs"

[dependencies]
$name = { version = "=$VERSION"$registry_key }

[workspace]
EOF
  : >"$dir/lib.rs"
  rm -f "$dir/Cargo.lock"
  if out=$(cargo generate-lockfile --manifest-path "$dir/Cargo.toml" 2>&1); then
    PUBLISHED_SUM=$(python3 - "$dir/Cargo.lock" "$name" "$VERSION" <<'EOF'
import sys, tomllib
lock, name, version = sys.argv[1:]
with open(lock, "rb") as f:
    packages = tomllib.load(f)["package"]
sums = [p.get("checksum") for p in packages if p["name"] == name and p["version"] == version]
if len(sums) != 1 or not sums[0]:
    sys.exit(f"publish-release.sh: the registry's index lists {name} {version} without a checksum")
print(sums[0])
EOF
    ) || die "could not read the checksum of $name $VERSION from the resolved lockfile (above)"
    return 0
  fi
  if grep -qF "no matching package named \`$name\` found" <<<"$out" \
    || grep -qF "failed to select a version for the requirement \`$name = \"=$VERSION\"\`" <<<"$out"; then
    return 1
  fi
  printf '%s\n' "$out" >&2
  die "could not ask $REGISTRY_NAME whether $name $VERSION is published (cargo's error above): check the network and the registry configuration, then rerun"
}

# Stops unless the registry's package of NAME (checksum PUBLISHED) is the package
# `cargo package` builds for NAME from this commit.
verify_published() {
  local name=$1 published=$2 local_sum file="$TARGET_DIR/package/$1-$VERSION.crate"
  rm -f "$file"
  cargo package --quiet --locked --no-verify -p "$name" "${REGISTRY_ARGS[@]}" \
    || die "cargo package -p $name failed (above): could not build this commit's package of $name to compare with the published one"
  local_sum=$(python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$file") \
    || die "could not read $file"
  if [ "$published" != "$local_sum" ]; then
    die "$name $VERSION on $REGISTRY_NAME is not this commit's package: the index records sha256 $published, this commit packages to $local_sum. It was published from other sources; do not publish the rest from here (choose a new version)"
  fi
  say "$name $VERSION: verified, the published package is this commit's (sha256 $published)"
}

# Refuse before the first publish when a version is on the registry and this is not a resume.
say "publishing to $REGISTRY_NAME, in order: $(echo $CRATES)"
for crate in $CRATES; do
  if probe "$crate"; then
    if [ "$RESUME" != 1 ]; then
      die "$crate $VERSION is already on $REGISTRY_NAME. If an earlier run of this script published it and then stopped partway, rerun with RESUME_RELEASE=1 scripts/publish-release.sh $VERSION: it verifies each published crate against this commit and publishes the rest. Otherwise choose another version: a published version cannot be replaced. Nothing was published"
    fi
  fi
done

# --- publishing -------------------------------------------------------------------------------
for crate in $CRATES; do
  if probe "$crate"; then
    say "$crate $VERSION is already on $REGISTRY_NAME (RESUME_RELEASE=1): verifying it"
    verify_published "$crate" "$PUBLISHED_SUM"
    continue
  fi
  say "$crate $VERSION: cargo publish to $REGISTRY_NAME"
  cargo publish --locked -p "$crate" "${REGISTRY_ARGS[@]}" \
    || die "cargo publish -p $crate failed (above). Crates published before it stay published: fix the cause, then rerun with RESUME_RELEASE=1 scripts/publish-release.sh $VERSION to verify them and publish the rest"
  waited=0
  until probe "$crate"; do
    if [ "$waited" -ge "$TIMEOUT" ]; then
      die "$crate $VERSION was uploaded, but $REGISTRY_NAME's index did not serve it within $TIMEOUT s (RUNLIMIT_RELEASE_INDEX_TIMEOUT). The crates after it need it: once the registry serves it, rerun with RESUME_RELEASE=1 scripts/publish-release.sh $VERSION"
    fi
    sleep 5
    waited=$((waited + 5))
  done
  say "$crate $VERSION: the index serves it"
  verify_published "$crate" "$PUBLISHED_SUM"
done

# --- the tag ------------------------------------------------------------------------------------
if [ -z "$LOCAL_TAG" ]; then
  git tag -a "$TAG" -m "Runlimit $VERSION" "$HEAD_SHA" || die "git tag $TAG failed (above): every crate is published; create and push the tag by hand: git tag -a $TAG -m 'Runlimit $VERSION' $HEAD_SHA && git push $REMOTE refs/tags/$TAG"
fi
if [ -n "$REMOTE_TAG" ]; then
  say "tag $TAG is already on $REMOTE at $HEAD_SHA"
else
  git push --quiet "$REMOTE" "refs/tags/$TAG" || die "git push $REMOTE $TAG failed (above): every crate is published; push the tag by hand: git push $REMOTE refs/tags/$TAG"
  say "pushed tag $TAG ($HEAD_SHA) to $REMOTE"
fi
say "released $VERSION: $(echo $CRATES) on $REGISTRY_NAME, tag $TAG"
