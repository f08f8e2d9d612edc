//! Manual-clock tests of `MemoryAttemptLimiter`: every delay of the backoff sequence
//! and the cap with the store emptied by a success, clock clamping, capacity, observers,
//! receipts, concurrency and an eager reference model. Quiet expiry, lease expiry as a failure
//! and late completions, the rules every backend shares, are scenarios of the conformance suite
//! (`tests/conformance.rs`).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use runlimit_core::{
    AttemptSubject, Delay, KeyHasher, PolicyId, ScopeId,
    attempts::{
        AttemptCompletionResult, AttemptDecision, AttemptDenial, AttemptDenialReason, AttemptEvent,
        AttemptObservation, AttemptObserver, AttemptOperation, AttemptOutcome, AttemptPolicy,
    },
};
use runlimit_memory::{Clock, ManualClock, MemoryAttemptLimiter, MemoryAttemptReceipt, MemoryStoreConfig};

/// initial 100 ms, cap 1,000 ms, quiet 5,000 ms, lease 50 ms.
fn policy() -> AttemptPolicy {
    AttemptPolicy::new(
        PolicyId::new("auth.password").unwrap(),
        ScopeId::new("identity").unwrap(),
        Duration::from_millis(100),
        Duration::from_millis(1_000),
        Duration::from_millis(5_000),
        Duration::from_millis(50),
    )
    .unwrap()
}

fn hasher() -> KeyHasher {
    KeyHasher::new(&[42; 32]).unwrap()
}

fn limiter(max_keys: usize, clock: &ManualClock) -> MemoryAttemptLimiter<ManualClock> {
    MemoryAttemptLimiter::builder(MemoryStoreConfig::new(max_keys).unwrap()).with_clock(clock.clone()).build()
}

fn admit<C: Clock, O: AttemptObserver>(
    limiter: &MemoryAttemptLimiter<C, O>,
    subject: &AttemptSubject<'_>,
) -> MemoryAttemptReceipt {
    match limiter.acquire(subject).unwrap() {
        AttemptDecision::Admitted(receipt) => receipt,
        AttemptDecision::Denied(denial) => panic!("expected admission, got {denial:?}"),
    }
}

fn denial<C: Clock, O: AttemptObserver>(
    limiter: &MemoryAttemptLimiter<C, O>,
    subject: &AttemptSubject<'_>,
) -> AttemptDenial {
    match limiter.acquire(subject).unwrap() {
        AttemptDecision::Admitted(receipt) => panic!("expected denial, got {receipt:?}"),
        AttemptDecision::Denied(denial) => denial,
    }
}

fn failure(failures: u32, millis: u64) -> AttemptCompletionResult {
    AttemptCompletionResult::FailureRecorded {
        consecutive_failures: failures,
        retry_after: Delay::from_millis(millis),
    }
}

fn backoff(failures: u32, millis: u64) -> AttemptDenial {
    AttemptDenial::Backoff { retry_after: Delay::from_millis(millis), consecutive_failures: failures }
}

#[test]
fn backoff_sequence_doubles_to_the_cap_and_success_resets() {
    let policy = policy();
    let clock = ManualClock::new();
    let limiter = limiter(10, &clock);
    let subject = hasher().hash_attempt_for(&policy, b"user@example.test");
    let expected = [100, 200, 400, 800, 1_000, 1_000, 1_000];
    for (index, &delay) in expected.iter().enumerate() {
        let failures = u32::try_from(index + 1).unwrap();
        let receipt = admit(&limiter, &subject);
        clock.advance_millis(10);
        assert_eq!(limiter.complete(receipt, AttemptOutcome::Failure).unwrap(), failure(failures, delay));
        assert_eq!(denial(&limiter, &subject), backoff(failures, delay));
        clock.advance_millis(delay - 1);
        assert_eq!(denial(&limiter, &subject), backoff(failures, 1), "one millisecond early");
        clock.advance_millis(1);
    }
    let receipt = admit(&limiter, &subject);
    assert_eq!(limiter.complete(receipt, AttemptOutcome::Success).unwrap(), AttemptCompletionResult::Reset);
    assert!(limiter.is_empty(), "success frees the slot");
    // After the reset the next failure starts at the initial delay again.
    let receipt = admit(&limiter, &subject);
    assert_eq!(limiter.complete(receipt, AttemptOutcome::Abandoned).unwrap(), failure(1, 100));
}

#[test]
fn backwards_clock_readings_are_clamped() {
    let policy = policy();
    let clock = ManualClock::new();
    let limiter = limiter(10, &clock);
    let subject = hasher().hash_attempt_for(&policy, b"user");
    clock.set(Duration::from_millis(10_000));
    let receipt = admit(&limiter, &subject);
    assert_eq!(limiter.complete(receipt, AttemptOutcome::Failure).unwrap(), failure(1, 100));
    clock.set(Duration::from_millis(0));
    assert_eq!(denial(&limiter, &subject), backoff(1, 100), "a backwards step never shortens a delay");
}

#[test]
fn full_storage_fails_closed_and_reclaims_only_expired_entries() {
    let policy = policy();
    let clock = ManualClock::new();
    let limiter = limiter(2, &clock);
    let hasher = hasher();
    let a = hasher.hash_attempt_for(&policy, b"a");
    let b = hasher.hash_attempt_for(&policy, b"b");
    let c = hasher.hash_attempt_for(&policy, b"c");
    let held = admit(&limiter, &a); // live lease: expires (as state) at 50 + 5,000
    let failed = admit(&limiter, &b);
    clock.set(Duration::from_millis(10));
    assert_eq!(limiter.complete(failed, AttemptOutcome::Failure).unwrap(), failure(1, 100)); // state until 5,010
    assert_eq!(
        denial(&limiter, &c),
        AttemptDenial::StorageCapacity { retry_after: Some(Delay::from_millis(5_000)) }
    );
    clock.set(Duration::from_millis(5_009));
    assert_eq!(
        denial(&limiter, &c),
        AttemptDenial::StorageCapacity { retry_after: Some(Delay::from_millis(1)) }
    );
    // b's failure state (5,010) expires; a's lease failed at 50 and expires at 5,050.
    clock.set(Duration::from_millis(5_010));
    let receipt = admit(&limiter, &c);
    assert_eq!(limiter.len(), 2);
    assert_eq!(limiter.complete(held, AttemptOutcome::Success).unwrap(), AttemptCompletionResult::Stale);
    // The lease counted as failure 1 at 50; its backoff is long over, so the next failure is the 2nd.
    let again = admit(&limiter, &a);
    assert_eq!(limiter.complete(again, AttemptOutcome::Failure).unwrap(), failure(2, 200));
    drop(receipt);
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(AttemptOperation, AttemptEvent)>>);

impl AttemptObserver for Recorder {
    fn observe_attempt(&self, observation: &AttemptObservation<'_>) {
        assert_eq!(observation.policy().id().as_str(), "auth.password");
        self.0.lock().unwrap().push((observation.operation(), observation.event()));
    }
}

struct Panics;
impl AttemptObserver for Panics {
    fn observe_attempt(&self, _: &AttemptObservation<'_>) {
        panic!("observer bug");
    }
}

#[test]
fn observers_see_every_outcome_and_cannot_change_results() {
    let policy = policy();
    let clock = ManualClock::new();
    let recorder = Arc::new(Recorder::default());
    let limiter = MemoryAttemptLimiter::builder(MemoryStoreConfig::new(10).unwrap())
        .with_clock(clock.clone())
        .with_observer(Arc::clone(&recorder))
        .build();
    let subject = hasher().hash_attempt_for(&policy, b"user");
    let receipt = admit(&limiter, &subject);
    let _ = denial(&limiter, &subject);
    assert_eq!(limiter.complete(receipt, AttemptOutcome::Failure).unwrap(), failure(1, 100));
    let _ = denial(&limiter, &subject);
    clock.advance_millis(100);
    let stale = admit(&limiter, &subject);
    clock.advance_millis(50);
    assert_eq!(limiter.complete(stale, AttemptOutcome::Success).unwrap(), AttemptCompletionResult::Stale);
    assert!(limiter.reset(&subject).unwrap());
    assert!(!limiter.reset(&subject).unwrap());
    assert_eq!(
        *recorder.0.lock().unwrap(),
        [
            (AttemptOperation::Admission, AttemptEvent::Admitted),
            (AttemptOperation::Admission, AttemptEvent::Denied(AttemptDenialReason::InProgress)),
            (
                AttemptOperation::Completion(AttemptOutcome::Failure),
                AttemptEvent::Completed(AttemptOutcome::Failure)
            ),
            (AttemptOperation::Admission, AttemptEvent::Denied(AttemptDenialReason::Backoff)),
            (AttemptOperation::Admission, AttemptEvent::Admitted),
            (AttemptOperation::Completion(AttemptOutcome::Success), AttemptEvent::Stale),
            (AttemptOperation::Reset, AttemptEvent::Reset { had_live_state: true }),
            (AttemptOperation::Reset, AttemptEvent::Reset { had_live_state: false }),
        ]
    );

    let panicking = MemoryAttemptLimiter::builder(MemoryStoreConfig::new(10).unwrap())
        .with_clock(ManualClock::new())
        .with_observer(Panics)
        .build();
    let receipt = admit(&panicking, &subject);
    assert_eq!(panicking.complete(receipt, AttemptOutcome::Success).unwrap(), AttemptCompletionResult::Reset);
}

#[test]
fn receipts_are_redacted_and_bound_to_their_limiter() {
    let policy = policy();
    let clock = ManualClock::new();
    let first = limiter(10, &clock);
    let second = limiter(10, &clock);
    let subject = hasher().hash_attempt_for(&policy, b"user");
    let receipt = admit(&first, &subject);
    let _other = admit(&second, &subject);
    assert_eq!(format!("{receipt:?}"), "MemoryAttemptReceipt { policy: PolicyId(\"auth.password\"), .. }");
    assert_eq!(second.complete(receipt, AttemptOutcome::Success).unwrap(), AttemptCompletionResult::Stale);
}

#[test]
fn concurrent_acquires_admit_exactly_one() {
    let policy = policy();
    let limiter = Arc::new(MemoryAttemptLimiter::new(MemoryStoreConfig::new(10).unwrap()));
    let hasher = hasher();
    let admitted: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                let subject = hasher.hash_attempt_for(&policy, b"user");
                scope.spawn(move || match limiter.acquire(&subject).unwrap() {
                    AttemptDecision::Admitted(receipt) => {
                        std::mem::forget(receipt);
                        1
                    }
                    AttemptDecision::Denied(_) => 0,
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).sum()
    });
    assert_eq!(admitted, 1);
}

/// An eager reference model of one subject: lease expiry and quiet expiry are applied while
/// time advances, instead of lazily when the subject is next touched.
mod model {
    use super::*;
    use proptest::prelude::*;

    const INITIAL: u64 = 100;
    const CAP: u64 = 800;
    const QUIET: u64 = 2_000;
    const LEASE: u64 = 300;

    #[derive(Default)]
    struct Model {
        now: u64,
        failures: u32,
        last_failure: u64,
        lease: Option<(u64, usize)>,
    }

    fn delay(failures: u32) -> u64 {
        if failures == 0 {
            return 0;
        }
        let mut delay = INITIAL;
        for _ in 1..failures {
            delay = (delay * 2).min(CAP);
        }
        delay
    }

    impl Model {
        fn advance(&mut self, by: u64) {
            let target = self.now + by;
            if let Some((deadline, _)) = self.lease
                && deadline <= target
            {
                self.failures = self.failures.saturating_add(1);
                self.last_failure = deadline;
                self.lease = None;
            }
            if self.lease.is_none() && self.failures > 0 && self.last_failure + QUIET <= target {
                self.failures = 0;
            }
            self.now = target;
        }

        fn acquire(&mut self, id: usize) -> Result<(), AttemptDenial> {
            if let Some((deadline, _)) = self.lease {
                return Err(AttemptDenial::InProgress {
                    retry_after: Delay::from_millis(deadline - self.now),
                });
            }
            let ready = self.last_failure + delay(self.failures);
            if self.failures > 0 && self.now < ready {
                return Err(AttemptDenial::Backoff {
                    retry_after: Delay::from_millis(ready - self.now),
                    consecutive_failures: self.failures,
                });
            }
            self.lease = Some((self.now + LEASE, id));
            Ok(())
        }

        fn complete(&mut self, id: usize, outcome: AttemptOutcome) -> AttemptCompletionResult {
            if self.lease.map(|(_, holder)| holder) != Some(id) {
                return AttemptCompletionResult::Stale;
            }
            self.lease = None;
            match outcome {
                AttemptOutcome::Success => {
                    self.failures = 0;
                    AttemptCompletionResult::Reset
                }
                AttemptOutcome::Failure | AttemptOutcome::Abandoned => {
                    self.failures = self.failures.saturating_add(1);
                    self.last_failure = self.now;
                    failure(self.failures, delay(self.failures))
                }
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Acquire,
        Complete(usize, AttemptOutcome),
        Drop(usize),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let outcome = prop_oneof![
            Just(AttemptOutcome::Success),
            Just(AttemptOutcome::Failure),
            Just(AttemptOutcome::Abandoned)
        ];
        prop_oneof![
            3 => Just(Op::Acquire),
            3 => (0..8usize, outcome).prop_map(|(index, outcome)| Op::Complete(index, outcome)),
            1 => (0..8usize).prop_map(Op::Drop),
            4 => prop_oneof![0..=400u64, Just(LEASE), Just(QUIET), 0..=3_000u64].prop_map(Op::Advance),
        ]
    }

    proptest! {
        #[test]
        fn the_limiter_matches_the_eager_model(ops in proptest::collection::vec(op(), 1..80)) {
            let policy = AttemptPolicy::new(
                PolicyId::new("auth.password").unwrap(),
                ScopeId::new("model").unwrap(),
                Duration::from_millis(INITIAL),
                Duration::from_millis(CAP),
                Duration::from_millis(QUIET),
                Duration::from_millis(LEASE),
            )
            .unwrap();
            let subject = hasher().hash_attempt_for(&policy, b"user");
            let clock = ManualClock::new();
            let limiter = limiter(1, &clock);
            let mut model = Model::default();
            let mut receipts: Vec<Option<MemoryAttemptReceipt>> = Vec::new();
            for op in ops {
                match op {
                    Op::Acquire => {
                        let expected = model.acquire(receipts.len());
                        match limiter.acquire(&subject).unwrap() {
                            AttemptDecision::Admitted(receipt) => {
                                prop_assert_eq!(expected, Ok(()));
                                receipts.push(Some(receipt));
                            }
                            AttemptDecision::Denied(denial) => {
                                prop_assert_eq!(expected, Err(denial));
                                if expected.is_ok() { receipts.push(None); }
                            }
                        }
                    }
                    Op::Complete(index, outcome) => {
                        if let Some(receipt) = receipts.get_mut(index).and_then(Option::take) {
                            let expected = model.complete(index, outcome);
                            prop_assert_eq!(limiter.complete(receipt, outcome).unwrap(), expected);
                        }
                    }
                    Op::Drop(index) => {
                        drop(receipts.get_mut(index).and_then(Option::take));
                    }
                    Op::Advance(by) => {
                        clock.advance_millis(by);
                        model.advance(by);
                    }
                }
            }
        }
    }
}
