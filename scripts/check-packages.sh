#!/usr/bin/env bash
# Packages every published crate as a registry would receive it and builds each one from its
# packaged sources alone: `cargo package` on the crates listed under
# [workspace.metadata.release] in Cargo.toml, together, so a crate whose Runlimit dependencies are
# not on the registry yet is verified against their packages (cargo 1.90 or newer).
#
# Run by scripts/test-packaging and scripts/prepare-release.sh. It checks the working tree as it is
# (--allow-dirty), so it also runs before a change is committed; scripts/publish-release.sh
# publishes only a clean, pushed tree. It builds in its own target directory,
# RUNLIMIT_PACKAGE_CHECK_TARGET_DIR (default target/package-check), where the packages land too
# (package/*.crate). With RUNLIMIT_RELEASE_REGISTRY set, the crates are packaged for that
# registry (see scripts/publish-release.sh). Extra arguments go to cargo package.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'check-packages.sh: %s\n' "$*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 not found: it reads the published-crate list (Debian/Ubuntu: apt-get install python3)"

crates=$(python3 scripts/release.py crates) || die "the published-crate list is not valid (see above)"
args=()
for crate in $crates; do args+=(-p "$crate"); done
if [ -n "${RUNLIMIT_RELEASE_REGISTRY:-}" ]; then args+=(--registry "$RUNLIMIT_RELEASE_REGISTRY"); fi

export CARGO_TARGET_DIR=${RUNLIMIT_PACKAGE_CHECK_TARGET_DIR:-$PWD/target/package-check}
# Debug info is of no use to a build that only proves the packages compile.
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-false}

# cargo verifies each crate against the others' packages through a local registry it writes to
# <target>/package/tmp-registry, unpacks them under $CARGO_HOME/registry/src/-<hash>/ and
# fingerprints what it builds from them by version alone. So after a change that keeps the version,
# a second run would reuse the first run's unpacked sources and builds of the Runlimit crates and
# could pass on stale code. Forget them first (the dependencies' builds are kept): the Runlimit
# crates' builds in this target directory, and every Runlimit package unpacked from a local
# registry (directories of file:// registries start with '-'; cargo unpacks again what it needs).
rm -rf "$CARGO_TARGET_DIR"/debug/.fingerprint/runlimit-* "$CARGO_TARGET_DIR"/debug/build/runlimit-* \
  "$CARGO_TARGET_DIR"/debug/deps/*runlimit_*
for crate in $crates; do
  rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/"$crate"-[0-9]*
done

cargo package --locked --allow-dirty "${args[@]}" "$@" \
  || die "cargo package failed for one of: $(echo $crates): the error above names the crate and file. A packaged crate builds only from the files inside its own directory (README, SQL, licenses) and the packages of its dependencies"
