//! `validate_batch`: exact errors in their documented order (empty, too many, mixed quota
//! modes with the index, duplicate counter keys with the earliest pair), on both the small
//! (≤ 16, pairwise) and the large (> 16, sorted) duplicate-search paths, and a property test
//! of both paths against a brute-force model (and `validate_shape`, every rule but the
//! duplicate-key one, against the same model).

use std::time::Duration;

use proptest::{prelude::*, test_runner::FileFailurePersistence};
use runlimit_core::{
    BatchError, Check, FixedWindowPolicy, PolicyId, QuotaMode, RateLimitPolicy, ScopeId, SubjectKey,
    backend::batch::{validate as validate_batch, validate_shape},
};

/// Policy families: the same family in both modes shares one fingerprint.
fn family(index: usize) -> FixedWindowPolicy {
    let (id, limit) = [("api", 5), ("api", 6), ("auth", 5), ("other", 5)][index];
    FixedWindowPolicy::new(
        PolicyId::new(id).unwrap(),
        ScopeId::new("client").unwrap(),
        limit,
        Duration::from_secs(60),
    )
    .unwrap()
}

struct Pool {
    /// `[family][mode]`, mode 0 = enforce, 1 = shadow.
    policies: Vec<[FixedWindowPolicy; 2]>,
}

impl Pool {
    fn new() -> Self {
        let policies = (0..4).map(|i| [family(i), family(i).with_quota_mode(QuotaMode::Shadow)]).collect();
        Self { policies }
    }

    /// A check of `(family, shadow, subject)`.
    fn check(&self, (family, shadow, subject): (usize, bool, u8)) -> Check<'_, FixedWindowPolicy> {
        let policy = &self.policies[family][usize::from(shadow)];
        Check::new(SubjectKey::from_digest([subject; 32]).bind(policy))
    }

    fn checks(&self, spec: &[(usize, bool, u8)]) -> Vec<Check<'_, FixedWindowPolicy>> {
        spec.iter().map(|&s| self.check(s)).collect()
    }
}

const E: bool = false;
const S: bool = true;

#[test]
fn families_have_distinct_fingerprints_shared_across_modes() {
    let pool = Pool::new();
    for (i, a) in pool.policies.iter().enumerate() {
        assert_eq!(a[0].fingerprint(), a[1].fingerprint());
        assert_eq!((a[0].quota_mode(), a[1].quota_mode()), (QuotaMode::Enforce, QuotaMode::Shadow));
        for b in &pool.policies[i + 1..] {
            assert_ne!(a[0].fingerprint(), b[0].fingerprint());
        }
    }
}

#[test]
fn empty_batches_fail_first() {
    let pool = Pool::new();
    let none: Vec<Check<'_, FixedWindowPolicy>> = pool.checks(&[]);
    assert_eq!(validate_batch(&none, 0), Err(BatchError::EmptyBatch));
    assert_eq!(validate_batch(&none, usize::MAX), Err(BatchError::EmptyBatch));
    assert_eq!(BatchError::EmptyBatch.to_string(), "empty batch");
}

#[test]
fn too_many_checks_before_mode_and_duplicate_rules() {
    let pool = Pool::new();
    // Mixed modes and a duplicate key, but too many checks is reported first.
    let checks = pool.checks(&[(0, E, 1), (0, S, 1), (0, E, 1)]);
    assert_eq!(validate_batch(&checks, 2), Err(BatchError::TooManyChecks { batch_size: 3, maximum: 2 }));
    assert_eq!(validate_batch(&checks[..1], 0), Err(BatchError::TooManyChecks { batch_size: 1, maximum: 0 }));
    assert_eq!(
        BatchError::TooManyChecks { batch_size: 3, maximum: 2 }.to_string(),
        "batch of 3 checks exceeds the maximum of 2"
    );
    // Exactly the maximum is fine.
    let distinct = pool.checks(&[(0, E, 1), (0, E, 2), (0, E, 3)]);
    assert_eq!(validate_batch(&distinct, 3), Ok(QuotaMode::Enforce));
}

#[test]
fn mixed_modes_name_the_first_differing_check_before_duplicates() {
    let pool = Pool::new();
    let checks = pool.checks(&[(0, E, 1), (0, E, 1), (2, S, 2), (3, E, 3), (1, S, 4)]);
    assert_eq!(
        validate_batch(&checks, 8),
        Err(BatchError::MixedQuotaModes { index: 2, mode: QuotaMode::Shadow })
    );
    let checks = pool.checks(&[(0, S, 1), (1, S, 2), (2, E, 3)]);
    assert_eq!(
        validate_batch(&checks, 8),
        Err(BatchError::MixedQuotaModes { index: 2, mode: QuotaMode::Enforce })
    );
    assert_eq!(
        BatchError::MixedQuotaModes { index: 2, mode: QuotaMode::Enforce }.to_string(),
        "check 2 uses quota mode Enforce, unlike check 0"
    );
}

#[test]
fn duplicates_report_the_earliest_pair_in_small_batches() {
    let pool = Pool::new();
    // Same subject under different fingerprints is not a duplicate.
    let distinct = pool.checks(&[(0, E, 1), (1, E, 1), (2, E, 1), (3, E, 1)]);
    assert_eq!(validate_batch(&distinct, 16), Ok(QuotaMode::Enforce));
    let shadow = pool.checks(&[(0, S, 1), (0, S, 2)]);
    assert_eq!(validate_batch(&shadow, 16), Ok(QuotaMode::Shadow));
    // [x, y, y, x]: the pair with the smallest later index, (1, 2), not (0, 3).
    let checks = pool.checks(&[(0, E, 1), (0, E, 2), (0, E, 2), (0, E, 1)]);
    assert_eq!(
        validate_batch(&checks, 16),
        Err(BatchError::DuplicateCounterKey { first_index: 1, duplicate_index: 2 })
    );
    // [x, y, x, x]: (0, 2).
    let checks = pool.checks(&[(0, E, 1), (0, E, 2), (0, E, 1), (0, E, 1)]);
    assert_eq!(
        validate_batch(&checks, 16),
        Err(BatchError::DuplicateCounterKey { first_index: 0, duplicate_index: 2 })
    );
    assert_eq!(
        BatchError::DuplicateCounterKey { first_index: 0, duplicate_index: 2 }.to_string(),
        "check 2 repeats the storage key of check 0"
    );
}

/// `count` distinct enforced checks (subjects 100, 101, ...), then the given overrides.
fn spec(count: usize, overrides: &[(usize, u8)]) -> Vec<(usize, bool, u8)> {
    let mut spec: Vec<_> = (0..count).map(|i| (0, E, 100 + u8::try_from(i).unwrap())).collect();
    for &(index, subject) in overrides {
        spec[index].2 = subject;
    }
    spec
}

#[test]
fn duplicates_report_the_earliest_pair_in_large_batches() {
    let pool = Pool::new();
    assert_eq!(validate_batch(&pool.checks(&spec(16, &[])), 64), Ok(QuotaMode::Enforce));
    assert_eq!(validate_batch(&pool.checks(&spec(17, &[])), 64), Ok(QuotaMode::Enforce));
    assert_eq!(validate_batch(&pool.checks(&spec(100, &[])), 100), Ok(QuotaMode::Enforce));
    // At the 16/17 boundary.
    assert_eq!(
        validate_batch(&pool.checks(&spec(16, &[(15, 100)])), 64),
        Err(BatchError::DuplicateCounterKey { first_index: 0, duplicate_index: 15 })
    );
    assert_eq!(
        validate_batch(&pool.checks(&spec(17, &[(16, 103)])), 64),
        Err(BatchError::DuplicateCounterKey { first_index: 3, duplicate_index: 16 })
    );
    // Two duplicated keys: X at 0 and 20, Y at 5 and 10 → (5, 10), the smaller later index,
    // even though X's run sorts first.
    let keys = spec(30, &[(0, 1), (20, 1), (5, 2), (10, 2)]);
    assert_eq!(
        validate_batch(&pool.checks(&keys), 64),
        Err(BatchError::DuplicateCounterKey { first_index: 5, duplicate_index: 10 })
    );
    // A key three times (0, 30, 31) and another twice (29, 40): (0, 30).
    let keys = spec(41, &[(0, 1), (30, 1), (31, 1), (29, 2), (40, 2)]);
    assert_eq!(
        validate_batch(&pool.checks(&keys), 64),
        Err(BatchError::DuplicateCounterKey { first_index: 0, duplicate_index: 30 })
    );
    // Mixed modes are still reported before duplicates in large batches.
    let mut keys = spec(20, &[(0, 1), (1, 1)]);
    keys[18].1 = S;
    assert_eq!(
        validate_batch(&pool.checks(&keys), 64),
        Err(BatchError::MixedQuotaModes { index: 18, mode: QuotaMode::Shadow })
    );
}

/// The documented rules, brute force, on the test's own description of each check.
fn model(spec: &[(usize, bool, u8)], maximum: usize) -> Result<QuotaMode, BatchError> {
    let mode = |shadow: bool| if shadow { QuotaMode::Shadow } else { QuotaMode::Enforce };
    let Some(first) = spec.first() else {
        return Err(BatchError::EmptyBatch);
    };
    if spec.len() > maximum {
        return Err(BatchError::TooManyChecks { batch_size: spec.len(), maximum });
    }
    if let Some(index) = spec.iter().position(|check| check.1 != first.1) {
        return Err(BatchError::MixedQuotaModes { index, mode: mode(spec[index].1) });
    }
    // The storage key is (fingerprint, subject); a family's fingerprint is shared by both modes.
    for later in 1..spec.len() {
        for earlier in 0..later {
            if (spec[earlier].0, spec[earlier].2) == (spec[later].0, spec[later].2) {
                return Err(BatchError::DuplicateCounterKey { first_index: earlier, duplicate_index: later });
            }
        }
    }
    Ok(mode(first.1))
}

fn batch() -> impl Strategy<Value = (Vec<(usize, bool, u8)>, usize)> {
    (0usize..=70, 1u8..=120, any::<bool>(), prop_oneof![3 => Just(0u32), 1 => 1u32..=100]).prop_flat_map(
        |(len, subjects, shadow, flip_percent)| {
            let check = (0usize..4, 0u32..100, 0u8..subjects)
                .prop_map(move |(family, roll, subject)| (family, shadow ^ (roll < flip_percent), subject));
            let maximum = prop_oneof![Just(len), Just(len.saturating_sub(1)), 0usize..=80, Just(usize::MAX)];
            (prop::collection::vec(check, len), maximum)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2_048,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn validate_batch_matches_brute_force((spec, maximum) in batch()) {
        let pool = Pool::new();
        let checks = pool.checks(&spec);
        prop_assert_eq!(validate_batch(&checks, maximum), model(&spec, maximum));
        // `validate_shape` is every rule but the duplicate-key one.
        let shape = match model(&spec, maximum) {
            Err(BatchError::DuplicateCounterKey { .. }) => Ok(checks[0].policy().quota_mode()),
            other => other,
        };
        prop_assert_eq!(validate_shape(&checks, maximum), shape);
        // The model's keys are the real storage keys.
        for (check, &(family, _, subject)) in checks.iter().zip(&spec) {
            prop_assert_eq!(check.policy().fingerprint(), pool.policies[family][0].fingerprint());
            prop_assert_eq!(check.counter_key().subject(), SubjectKey::from_digest([subject; 32]));
        }
    }
}
