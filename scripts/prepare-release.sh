#!/usr/bin/env bash
# Prepares release X.Y.Z in the working tree, for review:
#
#   RUNLIMIT_POSTGRES_TEST_DATABASE_URL=postgresql://... scripts/prepare-release.sh X.Y.Z
#
# 1. Refuses a dirty tree (uncommitted or untracked files), a malformed version, and a version
#    that is not above the current workspace version.
# 2. Sets the version of every published crate (the list under [workspace.metadata.release] in
#    Cargo.toml) and every requirement between them, refreshes Cargo.lock and the smoke
#    consumer's lock (smoke/external-consumer/Cargo.lock) for the new versions only, and adds a
#    dated '## [X.Y.Z] - YYYY-MM-DD' heading to CHANGELOG.md: the notes gathered under
#    [Unreleased] move under it, or a placeholder does when there are none, for the author to
#    fill (scripts/publish-release.sh refuses while the placeholder is there).
# 3. Runs the full test command, scripts/test, then the packaging check
#    (scripts/check-packages.sh: every published crate packaged and built from its package). The
#    test command needs PostgreSQL: RUNLIMIT_POSTGRES_TEST_DATABASE_URL, or the server binaries
#    for the disposable cluster scripts/test starts (see the README).
# 4. Leaves every change uncommitted. Review `git diff`, finish the changelog, commit, push and
#    wait for CI to pass on that exact commit; then run scripts/publish-release.sh X.Y.Z.
#
# RUNLIMIT_PREPARE_SKIP_TEST_COMMAND=1 skips step 3's scripts/test and runs only the packaging
# check. It exists for the release scripts' own end-to-end test (scripts/test-release.sh), which
# prepares throwaway copies of the repository from inside scripts/test-packaging; never set it when
# preparing a real release.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf '\nprepare-release.sh: %s\n' "$*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: scripts/prepare-release.sh X.Y.Z (the version to prepare, for example 0.3.0)"
VERSION=$1
for tool in git cargo python3; do
  command -v "$tool" >/dev/null || die "$tool not found: install it (python3: Debian/Ubuntu apt-get install python3)"
done

python3 scripts/release.py check-next "$VERSION" || die "nothing was changed"

if [ -n "$(git status --porcelain --untracked-files=normal)" ]; then
  git status --short >&2
  die "the working tree has uncommitted or untracked files (above): commit, stash or remove them first, so the release holds only its own changes; nothing was changed"
fi

CURRENT=$(python3 scripts/release.py current-version)
CRATES=$(python3 scripts/release.py crates) || die "the published-crate list is not valid (above); nothing was changed"
SMOKE=smoke/external-consumer
EDITED=(Cargo.toml Cargo.lock CHANGELOG.md "$SMOKE/Cargo.lock")

# Until the tests start, a failure undoes the edits (the tree was clean, so only ours are undone).
undo_edits() {
  git checkout --quiet -- "${EDITED[@]}" 2>/dev/null || true
  printf 'prepare-release.sh: stopped before the tests; the edits were undone, nothing was changed\n' >&2
}
trap undo_edits ERR

printf '==> %s -> %s for: %s\n' "$CURRENT" "$VERSION" "$(echo $CRATES)"
python3 scripts/release.py changelog-add "$VERSION" "$(date -u +%F)"
python3 scripts/release.py set-version "$VERSION"

printf '==> refreshing Cargo.lock and %s/Cargo.lock (the Runlimit crates only)\n' "$SMOKE"
cargo update --workspace
smoke_packages=()
for crate in $CRATES; do
  if grep -q "^name = \"$crate\"$" "$SMOKE/Cargo.lock"; then smoke_packages+=("$crate"); fi
done
if [ ${#smoke_packages[@]} -gt 0 ]; then
  cargo update --manifest-path "$SMOKE/Cargo.toml" "${smoke_packages[@]}"
fi
cargo metadata --format-version 1 --locked --manifest-path "$SMOKE/Cargo.toml" >/dev/null
cargo metadata --format-version 1 --locked >/dev/null
trap - ERR

on_test_failure() {
  printf '\nprepare-release.sh: stopped: a check failed (above). The version edits are left in the working tree: fix the cause and rerun the failing check, or discard them with: git checkout -- %s\n' "${EDITED[*]}" >&2
}
trap on_test_failure ERR

if [ "${RUNLIMIT_PREPARE_SKIP_TEST_COMMAND:-}" = 1 ]; then
  printf '==> RUNLIMIT_PREPARE_SKIP_TEST_COMMAND=1: scripts/test SKIPPED (only the release scripts own test may skip it); the packaging check alone\n'
  bash scripts/check-packages.sh
else
  printf '==> scripts/test (the full test command), then the packaging check\n'
  bash scripts/test
  bash scripts/check-packages.sh
fi
trap - ERR

printf '\n==> prepared %s (uncommitted):\n' "$VERSION"
git status --short
cat <<EOF

Next:
  1. Review the changes (git diff) and describe the release in CHANGELOG.md's '## [$VERSION]' section.
  2. Commit them, push the release branch and wait for CI to pass on that exact commit.
  3. scripts/publish-release.sh $VERSION
EOF
