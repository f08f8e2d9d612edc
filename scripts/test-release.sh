#!/usr/bin/env bash
# End-to-end test of scripts/prepare-release.sh and scripts/publish-release.sh against real
# parts, run by scripts/test-packaging:
#
# - a throwaway copy of this repository (the working tree's files, committed there), whose
#   upstream is a local bare Git repository (origin/main);
# - a local registry server that accepts publishes, cargo-http-registry 0.1.8 from crates.io
#   on 127.0.0.1. The server is RUNLIMIT_TOOLS_DIR/bin/cargo-http-registry, RUNLIMIT_TOOLS_DIR being
#   Cargo's own install root by default ($CARGO_INSTALL_ROOT, else $CARGO_HOME, else ~/.cargo);
#   when that is missing or another version, this script runs `cargo install` there, so a machine
#   builds it once (about 2.5 minutes on 2 idle cores).
#
# It checks, with exact outcomes (the versions the registry's index holds and the order they were
# published in, the tags on the bare remote, the scripts' messages):
# 1. prepare refuses a malformed version, a version not above the current one and a dirty tree;
# 2. prepare sets every version, refreshes the locks, adds the dated changelog heading and leaves
#    the changes uncommitted; commit, push;
# 3. publish refuses a wrong version, a dirty tree and a branch that does not match its upstream,
#    each before anything is published;
# 4. publish publishes every crate in order and pushes the tag;
# 5. a publish whose third crate the registry rejects stops after the second; a rerun without
#    RESUME_RELEASE stops with a clear message; with RESUME_RELEASE=1 it verifies the first two
#    (their published checksums equal this commit's packages) and finishes.
#
# The copy differs from this tree in one fixture commit: its Runlimit crates depend on each other
# through the test registry (registry = "runlimit-test" on their [workspace.dependencies]; Cargo
# otherwise resolves a published crate's dependencies on crates.io) and name the bare remote as
# their repository. Prepare runs with RUNLIMIT_PREPARE_SKIP_TEST_COMMAND=1 (the copies are this tree,
# which scripts/test checks); the packaging check still runs. Builds share RUNLIMIT_PACKAGE_CHECK_TARGET_DIR
# (default target/package-check) with the packaging check, whose dependency builds they reuse.
# What Cargo keeps of the test registry in $CARGO_HOME (its index, downloads and unpacked
# packages) is removed at the end. Ends with "N passed, 0 failed"; on failure it keeps its scratch
# directory and names it.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
START=$SECONDS
PASSED=0

die() { printf '\ntest-release.sh: FAILED: %s\n' "$*" >&2; exit 1; }
step() { printf '\n--- [%ss] %s\n' "$((SECONDS - START))" "$*"; }
ok() { PASSED=$((PASSED + 1)); printf 'ok %d - %s\n' "$PASSED" "$*"; }
expect_eq() { # description actual expected
  [ "$2" = "$3" ] || die "$1:
expected: $3
actual:   $2"
  ok "$1"
}

for tool in git cargo python3; do
  command -v "$tool" >/dev/null || die "$tool not found: install it (python3: Debian/Ubuntu apt-get install python3)"
done

# --- the registry server -------------------------------------------------------------------
REGISTRY_VERSION=0.1.8
TOOLS=${RUNLIMIT_TOOLS_DIR:-${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}}
REGISTRY_BIN=$TOOLS/bin/cargo-http-registry
# (`cargo-http-registry --version` prints its version, then exits non-zero.)
if [ "$("$REGISTRY_BIN" --version 2>/dev/null || true)" != "cargo-http-registry $REGISTRY_VERSION" ]; then
  step "installing cargo-http-registry $REGISTRY_VERSION from crates.io into $TOOLS (once)"
  cargo install --quiet --locked --root "$TOOLS" cargo-http-registry --version "$REGISTRY_VERSION" \
    || die "cargo install cargo-http-registry $REGISTRY_VERSION failed (above): it needs crates.io and a C compiler (libgit2)"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/runlimit-release-test.XXXXXX")
REGISTRY_PID=""
REGISTRY=$WORK/registry
# Cargo keeps a registry's index, downloads and unpacked packages under $CARGO_HOME/registry/
# {index,cache,src}/<name>-<hash>, the name empty for a file:// index. Ours is the one whose index
# serves this run's config.json (its server's random port in it).
forget_test_registry() {
  local home=${CARGO_HOME:-$HOME/.cargo} d
  [ -f "$REGISTRY/config.json" ] || return 0
  for d in "$home"/registry/index/-*; do
    if [ -d "$d/.git" ] && git --git-dir="$d/.git" show refs/remotes/origin/HEAD:config.json 2>/dev/null \
      | cmp -s - "$REGISTRY/config.json"; then
      rm -rf "$d" "$home/registry/cache/${d##*/}" "$home/registry/src/${d##*/}"
    fi
  done
}
finish() {
  local status=$?
  if [ -n "$REGISTRY_PID" ]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; fi
  forget_test_registry
  if [ "$status" = 0 ]; then
    rm -rf "$WORK"
  else
    printf 'test-release.sh: kept %s for inspection (repo/, remote.git/, registry/, *.log)\n' "$WORK" >&2
  fi
}
trap finish EXIT

start_registry() {
  "$REGISTRY_BIN" --addr 127.0.0.1:0 "$REGISTRY" >>"$WORK/registry.log" 2>&1 &
  REGISTRY_PID=$!
  local port="" _
  for _ in $(seq 1 100); do
    port=$(python3 -c 'import json, sys, urllib.parse; print(urllib.parse.urlsplit(json.load(open(sys.argv[1]))["api"]).port)' \
      "$REGISTRY/config.json" 2>/dev/null || true)
    if [ -n "$port" ] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    kill -0 "$REGISTRY_PID" 2>/dev/null || { cat "$WORK/registry.log" >&2; die "cargo-http-registry exited (log above)"; }
    sleep 0.1
  done
  die "cargo-http-registry did not listen within 10 s (log: $WORK/registry.log)"
}

# "name version" of every entry the registry's index holds at its committed head, sorted.
registry_entries() {
  (cd "$REGISTRY" && git ls-tree -r --name-only HEAD | grep -E '^ru/nl/' || true) | while read -r path; do
    git -C "$REGISTRY" show "HEAD:$path" | python3 -c 'import json, sys
for line in sys.stdin:
    if line.strip():
        e = json.loads(line)
        print(e["name"], e["vers"])'
  done | sort
}
# The registry's publications, oldest first ("Add NAME in version V" commits).
registry_log() { git -C "$REGISTRY" log --reverse --format=%s | grep '^Add runlimit' || true; }
# The checksum the registry's index records for NAME VERSION.
registry_checksum() {
  git -C "$REGISTRY" show "HEAD:ru/nl/$1" | python3 -c 'import json, sys
for line in sys.stdin:
    e = json.loads(line)
    if e["vers"] == sys.argv[1]:
        print(e["cksum"])' "$2"
}
# The commit a tag on the bare remote points at ("" when there is none).
remote_tag() { git -C "$WORK/remote.git" rev-parse --quiet --verify "refs/tags/$1^{commit}" || true; }
remote_tags() { git -C "$WORK/remote.git" tag --list | tr '\n' ' ' | sed 's/ $//'; }

# Runs a release script in the copy, output in $WORK/<log>.log; expects exit status 0 or not.
run() { # log expect(0|fail) command...
  local log=$WORK/$1.log expect=$2 status=0
  shift 2
  (cd "$WORK/repo" && "$@") >"$log" 2>&1 || status=$?
  if [ "$expect" = 0 ] && [ "$status" != 0 ]; then cat "$log" >&2; die "$* exited $status (output above)"; fi
  if [ "$expect" = fail ] && [ "$status" = 0 ]; then cat "$log" >&2; die "$* succeeded, expected it to stop (output above)"; fi
  return 0
}
expect_line() { # description log exact-line
  grep -qxF -- "$3" "$WORK/$2.log" || { cat "$WORK/$2.log" >&2; die "$1: no line
  $3
in the output of $2 (above)"; }
  ok "$1"
}

# --- the throwaway copy and its upstream ---------------------------------------------------
step "copying the working tree to $WORK/repo, upstream $WORK/remote.git"
mkdir -p "$WORK/repo"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi; done \
  | tar --null --no-recursion -T - -cf -) | tar -xf - -C "$WORK/repo"
CRATES=$(cd "$WORK/repo" && python3 scripts/release.py crates)
python3 - "$WORK/repo" "file://$WORK/remote.git" $CRATES <<'EOF'
import pathlib, re, sys
root, repository, crates = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
manifest = root / "Cargo.toml"
lines = manifest.read_text().split("\n")
section, out, has_repository = None, [], False
for line in lines:
    header = re.match(r"^\[([^\]]+)\]\s*$", line)
    if header:
        if section == "workspace.package" and not has_repository:
            while out and not out[-1].strip():
                out.pop()
            out += [f'repository = "{repository}"', ""]
        section = header.group(1)
    name = line.split("=", 1)[0].strip()
    if section == "workspace.package" and name == "repository":
        line, has_repository = f'repository = "{repository}"', True
    if section == "workspace.dependencies" and name in crates:
        assert "registry" not in line and line.rstrip().endswith("}"), line
        line = line.rstrip()[:-1].rstrip() + ', registry = "runlimit-test" }'
    out.append(line)
manifest.write_text("\n".join(out))
for crate in crates:
    path = root / "crates" / crate / "Cargo.toml"
    text = path.read_text()
    if "repository" not in text:
        text = text.replace("license.workspace = true\n", "license.workspace = true\nrepository.workspace = true\n", 1)
    path.write_text(text)
EOF
git_in() { git -C "$WORK/repo" "$@"; }
git_in init --quiet -b main
git_in config user.name "Release Test"
git_in config user.email release-test@example.invalid
git_in config commit.gpgsign false
git_in config tag.gpgsign false
git_in add -A
git_in commit --quiet -m "Runlimit, publishing to the test registry"
git init --quiet --bare -b main "$WORK/remote.git"
git_in remote add origin "$WORK/remote.git"
git_in push --quiet -u origin main

step "starting cargo-http-registry on 127.0.0.1 (registry root $REGISTRY)"
start_registry

# Cargo: the test registry, and the builds shared with the packaging check.
export CARGO_REGISTRIES_RUNLIMIT_TEST_INDEX="file://$REGISTRY"
export CARGO_REGISTRIES_RUNLIMIT_TEST_TOKEN="cargo-http-registry-checks-no-token"
export CARGO_NET_GIT_FETCH_WITH_CLI=true
export RUNLIMIT_RELEASE_REGISTRY=runlimit-test
export RUNLIMIT_PREPARE_SKIP_TEST_COMMAND=1
export RUNLIMIT_PACKAGE_CHECK_TARGET_DIR=${RUNLIMIT_PACKAGE_CHECK_TARGET_DIR:-$REPO/target/package-check}
export CARGO_TARGET_DIR=$RUNLIMIT_PACKAGE_CHECK_TARGET_DIR
export CARGO_PROFILE_DEV_DEBUG=false
export CARGO_INCREMENTAL=0
unset RESUME_RELEASE RUNLIMIT_RELEASE_INDEX_TIMEOUT

CURRENT=$(cd "$WORK/repo" && python3 scripts/release.py current-version)
read -r V1 V2 < <(python3 -c 'import sys; a, b, c = sys.argv[1].split("-")[0].split("."); print(f"{a}.{b}.{int(c) + 1}", f"{a}.{b}.{int(c) + 2}")' "$CURRENT")
TODAY=$(date -u +%F)
ORDER=$(echo $CRATES)
printf 'current version %s; releases %s and %s of: %s\n' "$CURRENT" "$V1" "$V2" "$ORDER"
# The order the releases follow starts with these five; newer library crates come after them.
expect_eq "the published crates start in dependency order" "$(echo $CRATES | cut -d' ' -f1-5)" \
  "runlimit-core runlimit-memory runlimit-postgres runlimit-http runlimit-axum"

clean_tree() { expect_eq "$1: the working tree is clean" "$(git_in status --porcelain)" ""; }

# --- 1. prepare refuses ------------------------------------------------------------------------
step "1. prepare-release.sh refuses a malformed version, a version not above $CURRENT, a dirty tree"
run prepare-malformed fail scripts/prepare-release.sh "${V1%.*}"
expect_line "malformed version refused" prepare-malformed \
  "release.py: malformed version '${V1%.*}': give MAJOR.MINOR.PATCH (for example 0.3.0), optionally with a pre-release such as 1.0.0-rc.1, without a leading 'v'"
clean_tree "after the malformed version"
run prepare-same fail scripts/prepare-release.sh "$CURRENT"
expect_line "the current version refused" prepare-same \
  "release.py: version $CURRENT is not above the current version $CURRENT: choose a higher version"
clean_tree "after the current version"
run prepare-lower fail scripts/prepare-release.sh "0.0.1"
expect_line "a lower version refused" prepare-lower \
  "release.py: version 0.0.1 is not above the current version $CURRENT: choose a higher version"
echo "stray" >"$WORK/repo/stray.txt"
run prepare-dirty fail scripts/prepare-release.sh "$V1"
expect_line "a dirty tree refused" prepare-dirty \
  "prepare-release.sh: the working tree has uncommitted or untracked files (above): commit, stash or remove them first, so the release holds only its own changes; nothing was changed"
rm "$WORK/repo/stray.txt"
clean_tree "after the dirty tree"

# --- 2. prepare ----------------------------------------------------------------------------------
step "2. prepare-release.sh $V1 (packaging check included)"
run prepare-v1 0 scripts/prepare-release.sh "$V1"
expect_line "the test command is skipped only as announced" prepare-v1 \
  "==> RUNLIMIT_PREPARE_SKIP_TEST_COMMAND=1: scripts/test SKIPPED (only the release scripts own test may skip it); the packaging check alone"
expect_eq "prepare leaves its changes uncommitted" "$(git_in status --porcelain | tr '\n' ' ')" \
  " M CHANGELOG.md  M Cargo.lock  M Cargo.toml  M smoke/external-consumer/Cargo.lock "
(cd "$WORK/repo" && python3 scripts/release.py check-version "$V1") || die "the workspace is not at $V1 after prepare"
ok "every published crate is at $V1 and requires $V1 of the others"
locked_versions() { # lockfile: "name version" of the Runlimit crates it locks
  python3 -c 'import sys, tomllib
for p in tomllib.load(open(sys.argv[1], "rb"))["package"]:
    if p["name"].startswith("runlimit-") and "source" not in p and p["name"] != "runlimit-external-consumer":
        print(p["name"], p["version"])' "$1" | sort | tr '\n' ',' | sed 's/,$//'
}
unpublished() { # the workspace members that say publish = false, as an extended regex alternation
  (cd "$WORK/repo" && cargo metadata --no-deps --format-version 1 --offline) | python3 -c 'import json, sys
print("|".join(p["name"] for p in json.load(sys.stdin)["packages"] if p["publish"] == []))'
}
expect_eq "Cargo.lock locks the published crates at $V1" \
  "$(locked_versions "$WORK/repo/Cargo.lock" | tr ',' '\n' | grep -vE "^($(unpublished)) " | tr '\n' ',' | sed 's/,$//')" \
  "$(for c in $CRATES; do echo "$c $V1"; done | sort | tr '\n' ',' | sed 's/,$//')"
expect_eq "the smoke consumer's lock follows" "$(locked_versions "$WORK/repo/smoke/external-consumer/Cargo.lock")" \
  "runlimit-core $V1,runlimit-memory $V1"
expect_eq "the changelog's new heading sits under [Unreleased]" \
  "$(grep -A2 -xF '## [Unreleased]' "$WORK/repo/CHANGELOG.md" | tail -n1)" "## [$V1] - $TODAY"
expect_eq "the packaging check packaged every crate at $V1" \
  "$(cd "$CARGO_TARGET_DIR/package" && for c in $CRATES; do [ -f "$c-$V1.crate" ] && echo "$c"; done | tr '\n' ' ' | sed 's/ $//')" "$ORDER"

# The author's part: the changelog entry, the commit, the push.
describe_release() {
  python3 - "$WORK/repo/CHANGELOG.md" "$1" <<'EOF'
import pathlib, sys
path, version = pathlib.Path(sys.argv[1]), sys.argv[2]
text = path.read_text()
heading = next(l for l in text.split("\n") if l.startswith(f"## [{version}] - "))
start = text.index(heading) + len(heading)
end = text.find("\n## [", start)
text = text[:start] + f"\n\n### Changed\n\n- Release {version} of the release-process test.\n" + text[end:]
path.write_text(text)
EOF
}
describe_release "$V1"
git_in commit --quiet -am "Release $V1"
git_in push --quiet
RELEASE1=$(git_in rev-parse HEAD)

# --- 3. publish refuses before publishing anything ------------------------------------------------
step "3. publish-release.sh refuses a wrong version, a dirty tree, a branch that does not match its upstream"
nothing_published() {
  expect_eq "$1: the registry holds nothing" "$(registry_entries)" ""
  expect_eq "$1: the remote has no tag" "$(remote_tags)" ""
}
run publish-wrong-version fail scripts/publish-release.sh "$V2"
expect_line "a wrong version refused" publish-wrong-version \
  "publish-release.sh: this commit is not release $V2 (above): run scripts/prepare-release.sh $V2, commit and push first; nothing was published"
nothing_published "after the wrong version"
echo "stray" >"$WORK/repo/stray.txt"
run publish-dirty fail scripts/publish-release.sh "$V1"
expect_line "a dirty tree refused" publish-dirty \
  "publish-release.sh: the working tree has uncommitted or untracked files (above): publish only the commit CI tested (commit and push, or stash); nothing was published"
rm "$WORK/repo/stray.txt"
nothing_published "after the dirty tree"
git_in commit --quiet --allow-empty -m "Not pushed"
run publish-ahead fail scripts/publish-release.sh "$V1"
expect_line "a branch ahead of its upstream refused" publish-ahead \
  "publish-release.sh: local main ($(git_in rev-parse HEAD)) does not match its upstream origin/main ($RELEASE1): 1 commit(s) only here, 0 only there. Push or pull until they match and CI has passed on that commit; nothing was published"
git_in reset --quiet --hard "$RELEASE1"
nothing_published "after the unpushed commit"
# The upstream moves on without this clone.
git clone --quiet -b main "$WORK/remote.git" "$WORK/other"
git -C "$WORK/other" -c user.name=Other -c user.email=other@example.invalid commit --quiet --allow-empty -m "Pushed elsewhere"
git -C "$WORK/other" push --quiet origin HEAD:main
run publish-behind fail scripts/publish-release.sh "$V1"
expect_line "a branch behind its upstream refused" publish-behind \
  "publish-release.sh: local main ($RELEASE1) does not match its upstream origin/main ($(git -C "$WORK/other" rev-parse HEAD)): 0 commit(s) only here, 1 only there. Push or pull until they match and CI has passed on that commit; nothing was published"
nothing_published "after the upstream moved"
git -C "$WORK/remote.git" update-ref refs/heads/main "$RELEASE1"
git_in fetch --quiet origin

# --- 4. publish --------------------------------------------------------------------------------
step "4. publish-release.sh $V1: every crate in order, then the tag"
run publish-v1 0 scripts/publish-release.sh "$V1"
expect_line "publish names its branch and upstream" publish-v1 \
  "==> release branch main matches its upstream origin/main at $RELEASE1"
expect_eq "the registry received the crates in order" "$(registry_log | tr '\n' ',')" \
  "$(for c in $CRATES; do printf 'Add %s in version %s,' "$c" "$V1"; done)"
expect_eq "the registry's index serves every crate at $V1, and nothing else" "$(registry_entries | tr '\n' ',')" \
  "$(for c in $CRATES; do echo "$c $V1"; done | sort | tr '\n' ',')"
for c in $CRATES; do
  expect_line "$c $V1 verified against this commit's package" publish-v1 \
    "==> $c $V1: verified, the published package is this commit's (sha256 $(registry_checksum "$c" "$V1"))"
done
expect_eq "runlimit-memory $V1 requires runlimit-core ^$V1 from the same registry" \
  "$(git -C "$REGISTRY" show "HEAD:ru/nl/runlimit-memory" | python3 -c 'import json, sys
for d in json.loads(sys.stdin.readline())["deps"]:
    if d["name"] == "runlimit-core":
        print(d["req"], d.get("registry"), d["kind"])')" "^$V1 None normal"
expect_eq "tag v$V1 is on the remote, on the release commit" "$(remote_tag "v$V1")" "$RELEASE1"
expect_line "publish says it pushed the tag" publish-v1 "==> pushed tag v$V1 ($RELEASE1) to origin"

# --- 5. an interrupted publish, resumed ---------------------------------------------------------
step "5. prepare-release.sh $V2; publish stops at the third crate; RESUME_RELEASE=1 finishes"
run prepare-v2 0 scripts/prepare-release.sh "$V2"
describe_release "$V2"
git_in commit --quiet -am "Release $V2"
git_in push --quiet
RELEASE2=$(git_in rev-parse HEAD)
THIRD=$(echo $CRATES | cut -d' ' -f3)
# The registry fails to store the third crate's file (its path is taken by a directory): it
# answers the upload with an error and commits nothing to its index.
mkdir "$REGISTRY/$THIRD-$V2.crate"
run publish-v2-interrupted fail scripts/publish-release.sh "$V2"
expect_line "the interrupted publish says how to resume" publish-v2-interrupted \
  "publish-release.sh: cargo publish -p $THIRD failed (above). Crates published before it stay published: fix the cause, then rerun with RESUME_RELEASE=1 scripts/publish-release.sh $V2 to verify them and publish the rest"
published_v2() { registry_entries | grep " $V2\$" | tr '\n' ',' || true; }
expect_eq "only the first two crates are on the registry at $V2" "$(published_v2)" "runlimit-core $V2,runlimit-memory $V2,"
expect_eq "no tag v$V2 after the interruption" "$(remote_tag "v$V2")" ""
run publish-v2-rerun fail scripts/publish-release.sh "$V2"
expect_line "a rerun without RESUME_RELEASE stops" publish-v2-rerun \
  "publish-release.sh: runlimit-core $V2 is already on registry 'runlimit-test'. If an earlier run of this script published it and then stopped partway, rerun with RESUME_RELEASE=1 scripts/publish-release.sh $V2: it verifies each published crate against this commit and publishes the rest. Otherwise choose another version: a published version cannot be replaced. Nothing was published"
expect_eq "the rerun published nothing" "$(published_v2)" "runlimit-core $V2,runlimit-memory $V2,"
# The registry's operator clears the fault: the directory goes, and the index entry the server
# wrote before failing (it never commits one on failure) is dropped from its working copy.
rmdir "$REGISTRY/$THIRD-$V2.crate"
git -C "$REGISTRY" checkout --quiet -- .
run publish-v2-resumed 0 env RESUME_RELEASE=1 scripts/publish-release.sh "$V2"
for c in runlimit-core runlimit-memory; do
  expect_line "the resumed publish finds $c $V2 published" publish-v2-resumed \
    "==> $c $V2 is already on registry 'runlimit-test' (RESUME_RELEASE=1): verifying it"
  expect_line "the resumed publish verifies $c $V2 against this commit" publish-v2-resumed \
    "==> $c $V2: verified, the published package is this commit's (sha256 $(registry_checksum "$c" "$V2"))"
done
expect_eq "the registry received every crate once, in order" "$(registry_log | tr '\n' ',')" \
  "$(for v in "$V1" "$V2"; do for c in $CRATES; do printf 'Add %s in version %s,' "$c" "$v"; done; done)"
expect_eq "the registry's index serves every crate at $V1 and $V2" "$(registry_entries | tr '\n' ',')" \
  "$(for c in $CRATES; do echo "$c $V1"; echo "$c $V2"; done | sort | tr '\n' ',')"
expect_eq "tag v$V2 is on the remote, on the release commit" "$(remote_tag "v$V2")" "$RELEASE2"
expect_eq "the remote holds exactly the two release tags" "$(remote_tags)" "v$V1 v$V2"

step "release scripts tested in $((SECONDS - START)) s"
printf '%d passed, 0 failed\n' "$PASSED"
