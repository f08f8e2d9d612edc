//! The attempt state machine shared by every attempt limiter.
//!
//! A subject's state is an [`AttemptState`]: its consecutive failure count `f`, the instant
//! of its latest failure `t_f` and at most one admission lease with its deadline `t_l`, all in
//! whole milliseconds of the backend's clock. Where no state is stored the subject has none.
//! With the [`AttemptPolicy`]'s initial delay, delay cap `c`, quiet period `q` and lease `l`:
//!
//! ```text
//! settle (every operation first):  a lease with t_l ≤ now becomes a failure at t_l:
//!                                  f := f + 1 (saturating), t_f := t_l, no lease
//! expiry:                          e = t_l + q with a lease, t_f + q without one;
//!                                  from e on the state is equivalent to none
//! admit:  a live lease             → InProgress, retry after t_l − now
//!         f > 0, now < t_f + d(f)  → Backoff, retry after t_f + d(f) − now   (d = retry_delay)
//!         otherwise                → admitted: lease until now + l; f kept, or 0 once
//!                                    t_f + q ≤ now (quiet expiry); t_f kept (now for a new
//!                                    subject)
//! complete (receipt holding the live lease):
//!         Success                  → remove the state (retry state reset, slot freed)
//!         Failure / Abandoned      → f := f + 1, t_f := now, no lease; retry after d(f)
//! complete (lease expired or not the receipt's) → Stale: nothing recorded
//! ```
//!
//! Consequences a backend gets for free by calling these functions:
//!
//! - dropping a receipt is no refund: its lease becomes a failure at its deadline, so the
//!   backoff it causes is measured from the deadline, not from when the subject is next seen;
//! - quiet expiry never erases an active lease, because a leased state's expiry is measured
//!   from the lease deadline, and `q ≥ c` means an expired state never still owes a backoff;
//! - a late success never resets a newer reservation: its lease has expired, so it is stale.
//!
//! Instants saturate at `u64::MAX`, which never passes ([`is_expired`]); failure counts
//! saturate at `u32::MAX`; delays are [`AttemptPolicy::retry_delay`] (doubling from the
//! initial delay, saturating at the cap).
//!
//! Storage capacity (a new subject in a full shard) and lease tokens are the backend's: this
//! module only says whether a receipt's lease is the one stored, through `holds_lease`. A
//! backend issues its receipts with [`issue`], for its own [`LeaseToken`] type.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use runlimit_core::{Delay, PolicyId, ScopeId};
//! use runlimit_core::attempts::{AttemptCompletionResult, AttemptDenial, AttemptOutcome, AttemptPolicy};
//! use runlimit_core::backend::attempts::{admit, complete, Completion};
//!
//! // Initial delay 1 s, cap 8 s, quiet period 60 s, lease 5 s.
//! let policy = AttemptPolicy::new(
//!     PolicyId::new("auth.password")?, ScopeId::new("identity")?,
//!     Duration::from_secs(1), Duration::from_secs(8), Duration::from_secs(60), Duration::from_secs(5))?;
//! let leased = admit(&policy, None, 10_000).expect("a new subject is admitted");
//! assert_eq!(leased.lease_deadline_ms, Some(15_000));
//! assert_eq!(
//!     admit(&policy, Some(leased), 12_000),
//!     Err(AttemptDenial::InProgress { retry_after: Delay::from_millis(3_000) }),
//! );
//! // A wrong password at 12 s: one failure, one second of backoff.
//! let Completion::Store { state, result } = complete(&policy, Some(leased), true, AttemptOutcome::Failure, 12_000)
//!     else { panic!() };
//! assert_eq!(result, AttemptCompletionResult::FailureRecorded {
//!     consecutive_failures: 1, retry_after: Delay::from_millis(1_000) });
//! assert_eq!(
//!     admit(&policy, Some(state), 12_400),
//!     Err(AttemptDenial::Backoff { retry_after: Delay::from_millis(600), consecutive_failures: 1 }),
//! );
//! assert!(admit(&policy, Some(state), 13_000).is_ok());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::{
    attempts::{AttemptCompletionResult, AttemptDenial, AttemptOutcome, AttemptPolicy, AttemptReceipt},
    backend::is_expired,
    delay::Delay,
    key::CounterKey,
};

/// A backend's opaque lease token: what its [`AttemptReceipt`]s hold to prove they hold the
/// live lease.
///
/// Give it no public constructor and no `Clone`: [`issue`] takes the token by value and a
/// receipt lends it only by reference ([`receipt_token`]), so nobody outside the backend can
/// issue a receipt (for instance one naming another policy) that the backend would accept.
pub trait LeaseToken: Send + Sync + 'static {
    /// The name a receipt holding this token shows in its `Debug` output, such as
    /// `"MemoryAttemptReceipt"`.
    const RECEIPT_NAME: &'static str;
}

/// Issues the receipt of an attempt admitted under `policy` for the subject stored under `key`,
/// holding the lease proved by `token`.
pub fn issue<T: LeaseToken>(policy: AttemptPolicy, key: CounterKey, token: T) -> AttemptReceipt<T> {
    AttemptReceipt { policy, key, token }
}

/// The storage key of the subject a receipt was issued for.
#[must_use]
pub fn receipt_key<T>(receipt: &AttemptReceipt<T>) -> &CounterKey {
    &receipt.key
}

/// The lease token a receipt holds.
#[must_use]
pub fn receipt_token<T>(receipt: &AttemptReceipt<T>) -> &T {
    &receipt.token
}

/// One subject's stored attempt state, in whole milliseconds of the backend's clock.
///
/// Every combination of values is a state the machine can be in, so the fields are public.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttemptState {
    /// Consecutive failures recorded (saturates at `u32::MAX`).
    pub consecutive_failures: u32,
    /// The instant of the latest failure (for a subject that never failed: its first
    /// admission).
    pub last_failure_at_ms: u64,
    /// The deadline of the subject's single admission lease, when one is held.
    pub lease_deadline_ms: Option<u64>,
}

impl AttemptState {
    /// The state with an expired lease (deadline ≤ `now_ms`) converted into a failure at its
    /// deadline; unchanged otherwise.
    #[must_use]
    pub fn settled(self, now_ms: u64) -> Self {
        match self.lease_deadline_ms {
            Some(deadline) if is_expired(deadline, now_ms) => Self {
                consecutive_failures: self.consecutive_failures.saturating_add(1),
                last_failure_at_ms: deadline,
                lease_deadline_ms: None,
            },
            _ => self,
        }
    }

    /// The first millisecond at which the state is equivalent to none and may be removed:
    /// the lease deadline plus the quiet period while a lease is held, else the latest failure
    /// plus the quiet period. Saturates at `u64::MAX`.
    #[must_use]
    pub fn expires_at_ms(&self, policy: &AttemptPolicy) -> u64 {
        let base = self.lease_deadline_ms.unwrap_or(self.last_failure_at_ms);
        base.saturating_add(policy.quiet_period().as_millis())
    }
}

/// [`AttemptPolicy::retry_delay`] in whole milliseconds (at most the delay cap, so it fits).
fn retry_delay_millis(policy: &AttemptPolicy, consecutive_failures: u32) -> u64 {
    u64::try_from(policy.retry_delay(consecutive_failures).as_millis()).unwrap_or(u64::MAX)
}

/// Decides an admission at `now_ms` for a subject whose stored state is `stored` (`None`: no
/// state). Settles an expired lease first.
///
/// # Errors
///
/// The [`AttemptDenial`]: [`InProgress`](AttemptDenial::InProgress) while a lease is live,
/// [`Backoff`](AttemptDenial::Backoff) while the retry delay of the latest failure runs.
/// (Storage capacity is the backend's to decide.) A backend may store
/// [`AttemptState::settled`] after a denial or not: both are the same state.
///
/// Otherwise the state to store: a lease until `now_ms + lease`.
pub fn admit(
    policy: &AttemptPolicy,
    stored: Option<AttemptState>,
    now_ms: u64,
) -> Result<AttemptState, AttemptDenial> {
    let lease_deadline_ms = Some(now_ms.saturating_add(policy.lease().as_millis()));
    let Some(stored) = stored.map(|state| state.settled(now_ms)) else {
        return Ok(AttemptState { consecutive_failures: 0, last_failure_at_ms: now_ms, lease_deadline_ms });
    };
    if let Some(deadline) = stored.lease_deadline_ms {
        return Err(AttemptDenial::InProgress {
            retry_after: Delay::from_millis(deadline.saturating_sub(now_ms)),
        });
    }
    let mut failures = stored.consecutive_failures;
    if failures > 0 && is_expired(stored.expires_at_ms(policy), now_ms) {
        failures = 0;
    }
    if failures > 0 {
        let ready_at = stored.last_failure_at_ms.saturating_add(retry_delay_millis(policy, failures));
        if now_ms < ready_at {
            return Err(AttemptDenial::Backoff {
                retry_after: Delay::from_millis(ready_at - now_ms),
                consecutive_failures: failures,
            });
        }
    }
    Ok(AttemptState {
        consecutive_failures: failures,
        last_failure_at_ms: stored.last_failure_at_ms,
        lease_deadline_ms,
    })
}

/// What an operator's reset does to a subject's attempt state (see [`reset`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptReset {
    /// Nothing live was stored (no state, or state whose quiet period has passed): remove
    /// whatever is stored; the reset reports `false`.
    NothingLive,
    /// Failure state without a live lease: remove it; the reset reports `true`.
    Remove,
    /// A live lease: keep it, with its token, and clear the failures: store `state`. The
    /// reset reports `true`.
    KeepLease {
        /// The state to store: no failures, the same lease deadline.
        state: AttemptState,
    },
}

impl AttemptReset {
    /// Whether the subject held live state: what the reset reports.
    #[must_use]
    pub const fn had_live_state(&self) -> bool {
        !matches!(self, Self::NothingLive)
    }
}

/// An operator's reset of a subject's failure state at `now_ms` (a support desk unlocking a
/// user): the failures and their backoff are forgotten, so the next admission behaves as for
/// a subject that never failed.
///
/// A reset never cancels a live lease, so it cannot be used to run a second attempt beside one
/// in flight or to void its outcome silently: the lease is kept ([`AttemptReset::KeepLease`])
/// and the outstanding receipt completes normally, a success removing the state and a failure
/// counting as the first after the reset. An expired lease is settled first (it counted as a
/// failure at its deadline), so it is cleared like any failure.
#[must_use]
pub fn reset(policy: &AttemptPolicy, stored: Option<AttemptState>, now_ms: u64) -> AttemptReset {
    let Some(state) = stored.map(|state| state.settled(now_ms)) else { return AttemptReset::NothingLive };
    match state.lease_deadline_ms {
        Some(deadline) => AttemptReset::KeepLease {
            state: AttemptState {
                consecutive_failures: 0,
                last_failure_at_ms: now_ms,
                lease_deadline_ms: Some(deadline),
            },
        },
        None if is_expired(state.expires_at_ms(policy), now_ms) => AttemptReset::NothingLive,
        None => AttemptReset::Remove,
    }
}

/// What completing a receipt does to the subject's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Completion {
    /// Remove the state: [`AttemptCompletionResult::Reset`].
    Remove,
    /// Store `state`: a failure was recorded.
    Store {
        /// The state to store (no lease).
        state: AttemptState,
        /// [`AttemptCompletionResult::FailureRecorded`] with the new count and its delay.
        result: AttemptCompletionResult,
    },
    /// The receipt no longer holds the live reservation: record nothing,
    /// [`AttemptCompletionResult::Stale`]. A backend may store `settled` (the state with an
    /// expired lease settled) or leave the state as it was: both are the same state.
    Stale {
        /// The stored state, settled; `None` when nothing was stored.
        settled: Option<AttemptState>,
    },
}

impl Completion {
    /// The result to report.
    #[must_use]
    pub const fn result(&self) -> AttemptCompletionResult {
        match *self {
            Self::Remove => AttemptCompletionResult::Reset,
            Self::Store { result, .. } => result,
            Self::Stale { .. } => AttemptCompletionResult::Stale,
        }
    }
}

/// Completes a receipt at `now_ms` with `outcome`. `stored` is the subject's stored state and
/// `holds_lease` whether its stored lease is the receipt's (the backend compares its tokens).
/// Settles an expired lease first, so a receipt whose lease expired is stale (the lease already
/// counted as a failure at its deadline).
#[must_use]
pub fn complete(
    policy: &AttemptPolicy,
    stored: Option<AttemptState>,
    holds_lease: bool,
    outcome: AttemptOutcome,
    now_ms: u64,
) -> Completion {
    let settled = stored.map(|state| state.settled(now_ms));
    match settled {
        Some(state) if holds_lease && state.lease_deadline_ms.is_some() => {
            record(policy, state, outcome, now_ms)
        }
        _ => Completion::Stale { settled },
    }
}

/// Records `outcome` at `now_ms` for a state whose reservation the caller holds, without
/// re-checking the lease deadline: for a backend whose lock on the subject's state held the
/// reservation through application work (a claim inside a host transaction).
#[must_use]
pub fn record(
    policy: &AttemptPolicy,
    state: AttemptState,
    outcome: AttemptOutcome,
    now_ms: u64,
) -> Completion {
    match outcome {
        AttemptOutcome::Success => Completion::Remove,
        AttemptOutcome::Failure | AttemptOutcome::Abandoned => {
            let failures = state.consecutive_failures.saturating_add(1);
            Completion::Store {
                state: AttemptState {
                    consecutive_failures: failures,
                    last_failure_at_ms: now_ms,
                    lease_deadline_ms: None,
                },
                result: AttemptCompletionResult::FailureRecorded {
                    consecutive_failures: failures,
                    retry_after: Delay::from_millis(retry_delay_millis(policy, failures)),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{PolicyId, ScopeId};

    /// Initial 1 s, cap 8 s, quiet 60 s, lease 5 s.
    fn policy() -> AttemptPolicy {
        AttemptPolicy::new(
            PolicyId::new("auth.password").unwrap(),
            ScopeId::new("identity").unwrap(),
            Duration::from_secs(1),
            Duration::from_secs(8),
            Duration::from_secs(60),
            Duration::from_secs(5),
        )
        .unwrap()
    }

    fn state(failures: u32, last_failure: u64, lease: Option<u64>) -> AttemptState {
        AttemptState {
            consecutive_failures: failures,
            last_failure_at_ms: last_failure,
            lease_deadline_ms: lease,
        }
    }

    fn backoff(retry_ms: u64, failures: u32) -> Result<AttemptState, AttemptDenial> {
        Err(AttemptDenial::Backoff {
            retry_after: Delay::from_millis(retry_ms),
            consecutive_failures: failures,
        })
    }

    fn failed(failures: u32, now: u64, retry_ms: u64) -> Completion {
        Completion::Store {
            state: state(failures, now, None),
            result: AttemptCompletionResult::FailureRecorded {
                consecutive_failures: failures,
                retry_after: Delay::from_millis(retry_ms),
            },
        }
    }

    #[test]
    fn backoff_doubles_to_the_cap_from_each_failure() {
        let p = policy();
        let mut stored = None;
        let mut now = 0;
        for (failures, delay) in [(1, 1_000), (2, 2_000), (3, 4_000), (4, 8_000), (5, 8_000)] {
            let leased = admit(&p, stored, now).unwrap();
            assert_eq!(leased.lease_deadline_ms, Some(now + 5_000));
            let completion = complete(&p, Some(leased), true, AttemptOutcome::Failure, now + 10);
            assert_eq!(completion, failed(failures, now + 10, delay));
            let Completion::Store { state, .. } = completion else { unreachable!() };
            assert_eq!(admit(&p, Some(state), now + 10 + delay - 1), backoff(1, failures));
            stored = Some(state);
            now += 10 + delay;
        }
        assert_eq!(
            complete(&p, None, true, AttemptOutcome::Success, now),
            Completion::Stale { settled: None }
        );
        let leased = admit(&p, stored, now).unwrap();
        assert_eq!(leased.consecutive_failures, 5, "the count is kept while the backoff is over");
        assert_eq!(
            complete(&p, Some(leased), true, AttemptOutcome::Success, now).result(),
            AttemptCompletionResult::Reset
        );
    }

    #[test]
    fn an_expired_lease_is_a_failure_at_its_deadline_and_its_receipt_is_stale() {
        let p = policy();
        let leased = admit(&p, Some(state(4, 0, None)), 20_000).unwrap();
        assert_eq!(leased, state(4, 0, Some(25_000)));
        assert_eq!(
            admit(&p, Some(leased), 24_999),
            Err(AttemptDenial::InProgress { retry_after: Delay::from_millis(1) })
        );
        // At the deadline the lease is failure 5 at 25,000: cap 8 s from then.
        assert_eq!(leased.settled(24_999), leased);
        assert_eq!(leased.settled(25_000), state(5, 25_000, None));
        assert_eq!(admit(&p, Some(leased), 25_500), backoff(7_500, 5));
        // A late success records nothing.
        assert_eq!(
            complete(&p, Some(leased), true, AttemptOutcome::Success, 31_000),
            Completion::Stale { settled: Some(state(5, 25_000, None)) }
        );
        // A receipt that is not the stored lease's is stale while the lease is live.
        assert_eq!(
            complete(&p, Some(leased), false, AttemptOutcome::Failure, 21_000),
            Completion::Stale { settled: Some(leased) }
        );
        // `record` trusts the caller's hold (a claim's row lock): no deadline re-check.
        assert_eq!(record(&p, leased, AttemptOutcome::Abandoned, 40_000), failed(5, 40_000, 8_000));
    }

    #[test]
    fn quiet_expiry_forgets_failures_but_never_an_active_lease() {
        let p = policy();
        let failed_state = state(3, 1_000, None);
        assert_eq!(failed_state.expires_at_ms(&p), 61_000);
        assert_eq!(admit(&p, Some(failed_state), 60_999).map(|s| s.consecutive_failures), Ok(3));
        assert_eq!(admit(&p, Some(failed_state), 61_000).map(|s| s.consecutive_failures), Ok(0));
        // A lease longer than the quiet period: the state lives until lease deadline + quiet.
        let long = AttemptPolicy::new(
            PolicyId::new("p").unwrap(),
            ScopeId::new("s").unwrap(),
            Duration::from_millis(10),
            Duration::from_millis(20),
            Duration::from_millis(30),
            Duration::from_millis(100),
        )
        .unwrap();
        let leased = admit(&long, Some(state(2, 0, None)), 40).unwrap();
        assert_eq!(leased.expires_at_ms(&long), 170);
        assert_eq!(
            admit(&long, Some(leased), 139),
            Err(AttemptDenial::InProgress { retry_after: Delay::from_millis(1) })
        );
    }

    #[test]
    fn counts_and_instants_saturate() {
        let p = policy();
        let leased = admit(&p, Some(state(u32::MAX, 992_000, None)), 1_000_000).unwrap();
        assert_eq!(
            complete(&p, Some(leased), true, AttemptOutcome::Failure, 1_000_001),
            failed(u32::MAX, 1_000_001, 8_000)
        );
        let end = admit(&p, None, u64::MAX - 1).unwrap();
        assert_eq!(end.lease_deadline_ms, Some(u64::MAX));
        assert_eq!(end.settled(u64::MAX), end, "a saturated deadline never passes");
        assert_eq!(end.expires_at_ms(&p), u64::MAX);
    }

    #[test]
    fn reset_clears_failures_and_keeps_a_live_lease() {
        let p = policy();
        assert_eq!(reset(&p, None, 0), AttemptReset::NothingLive);
        // 3 failures, latest at 10 s: removed; the next admission is immediate.
        assert_eq!(reset(&p, Some(state(3, 10_000, None)), 11_000), AttemptReset::Remove);
        assert!(admit(&p, None, 11_000).is_ok());
        // Past the quiet period (10 s + 60 s) nothing is live.
        let quiet = reset(&p, Some(state(3, 10_000, None)), 70_000);
        assert_eq!((quiet, quiet.had_live_state()), (AttemptReset::NothingLive, false));
        // A live lease (deadline 15 s) is kept with its deadline; failures are cleared.
        let kept = reset(&p, Some(state(2, 9_000, Some(15_000))), 12_000);
        assert_eq!(kept, AttemptReset::KeepLease { state: state(0, 12_000, Some(15_000)) });
        let AttemptReset::KeepLease { state: kept } = kept else { unreachable!() };
        // The receipt still holds it: a failure counts as the first after the reset.
        assert_eq!(complete(&p, Some(kept), true, AttemptOutcome::Failure, 13_000), failed(1, 13_000, 1_000));
        // An expired lease was a failure at its deadline: settled, then removed.
        assert_eq!(reset(&p, Some(state(2, 9_000, Some(15_000))), 15_000), AttemptReset::Remove);
    }
}
