#!/usr/bin/env bash
# Prints the [dependencies] lines that pin every Runlimit library crate to this checkout's
# commit, for an application that depends on Runlimit by Git URL (see README.md,
# "Installation"). The URL is this clone's `origin` remote (override with RUNLIMIT_GIT_URL); the
# revision is the commit checked out (`git rev-parse HEAD`). Commit or push what you want to pin
# first: a revision nobody else can fetch pins nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

url="${RUNLIMIT_GIT_URL:-$(git remote get-url origin 2>/dev/null || true)}"
if [ -z "$url" ]; then
  echo "scripts/dependency-lines.sh: this clone has no 'origin' remote; set RUNLIMIT_GIT_URL to the URL you serve it from" >&2
  exit 1
fi
case "$url" in
  /*) url="file://$url" ;; # a local clone: Cargo needs a URL
esac
rev="$(git rev-parse HEAD)"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "scripts/dependency-lines.sh: warning: uncommitted changes are not part of $rev" >&2
fi

echo "[dependencies]"
# The published library crates, in dependency order; the optional ones commented out.
for crate in runlimit-core runlimit-memory; do
  echo "$crate = { git = \"$url\", rev = \"$rev\" }"
done
for crate in runlimit-postgres runlimit-redis runlimit-http runlimit-axum runlimit-metrics; do
  echo "# $crate = { git = \"$url\", rev = \"$rev\" }"
done
