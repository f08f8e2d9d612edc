//! The crate docs name the `metrics` version the tests run against; this keeps them true.

/// The version locked for `name` in the workspace's `Cargo.lock`.
fn locked(name: &str) -> Option<String> {
    let lock = include_str!("../../../Cargo.lock");
    let entry = format!("name = \"{name}\"\nversion = \"");
    let start = lock.find(&entry)? + entry.len();
    lock[start..].split('"').next().map(str::to_owned)
}

#[test]
fn the_documented_metrics_version_is_the_locked_one() {
    let docs = include_str!("../src/lib.rs");
    let locked = locked("metrics").expect("metrics is locked");
    assert!(locked.starts_with("0.24."), "the crate records through metrics 0.24, locked {locked}");
    assert!(
        docs.contains(&format!("(tested with {locked})")),
        "the crate docs name the tested version {locked}"
    );
}
