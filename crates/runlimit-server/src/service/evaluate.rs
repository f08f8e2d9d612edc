//! One request's matched rules in, one verdict per descriptor out: the only place the server
//! talks to a limiter.
//!
//! The steps, each skipped once the request is denied (so a denied request charges nothing):
//!
//! 1. static denials: a matched rule of `requests_per_unit: 0`, or hits above what a rule can
//!    ever grant, deny without storage;
//! 2. check-only descriptors (`hits_addend: 0`) are peeked: an exhausted quota denies;
//! 3. the enforced rules' checks go to the limiter as **one atomic batch**: either every one
//!    is charged its hits, or none is;
//! 4. then the shadow-mode rules' checks, as a second batch (Runlimit refuses batches that mix
//!    enforced and shadow policies): they are reported and counted, never enforced. When step
//!    1 or 2 already found a shadow-mode rule over its limit, that batch would be denied, so,
//!    as for a batch the limiter shadow-denies, none of it is charged. A full store denies a
//!    batch in every mode (Runlimit's storage bounds are never shadowed), but once step 3 has
//!    charged the enforced rules a denial would break "all or none": the shadow batch's full
//!    store is then reported as a shadow denial, and the request admitted.
//!
//! Two descriptors of one request that reach the same counter (same rule and subject) become
//! one check costing the sum of their hits.

use runlimit_core::{
    Allowance, BatchDecisionView, Check, ConsumptionStatus, Delay, Denial, FixedWindowPolicy, GcraPolicy,
    KeyHasher, Limiter, PolicySubject, QuotaControl, QuotaMode, QuotaSnapshot, RateLimitPolicy,
};

use crate::config::{Quota, Rule, RulePolicy};

/// A Runlimit policy type a domain's rules can use.
pub(crate) trait RuleAlgorithm: RateLimitPolicy + Sized + 'static {
    /// The policy of this type, if `policy` is one.
    fn of(policy: &RulePolicy) -> Option<&Self>;
}

impl RuleAlgorithm for FixedWindowPolicy {
    fn of(policy: &RulePolicy) -> Option<&Self> {
        match policy {
            RulePolicy::FixedWindow(policy) => Some(policy),
            RulePolicy::Gcra(_) => None,
        }
    }
}

impl RuleAlgorithm for GcraPolicy {
    fn of(policy: &RulePolicy) -> Option<&Self> {
        match policy {
            RulePolicy::Gcra(policy) => Some(policy),
            RulePolicy::FixedWindow(_) => None,
        }
    }
}

/// A request descriptor that matched a limited rule: the rule, the descriptor's subject (the
/// bytes hashed into the counter's key) and its hits (0: check without charging).
#[derive(Debug)]
pub(crate) struct Charge<'a> {
    pub(crate) rule: &'a Rule,
    pub(crate) subject: Vec<u8>,
    pub(crate) hits: u64,
}

/// What became of one limited descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not evaluated: the request was denied by another descriptor first (nothing charged).
    Unevaluated,
    /// Charged; what remains.
    Allowed(Allowance),
    /// Checked without charging (`hits_addend: 0`), with quota left.
    Available(QuotaSnapshot),
    /// Over its limit. `enforced` is false for a shadow-mode rule, which admits anyway.
    Exhausted { enforced: bool, reason: Exhaustion },
}

/// Why a descriptor is over its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exhaustion {
    /// The quota is used up; the same hits fit after `retry_after`.
    Quota { retry_after: Delay },
    /// `requests_per_unit: 0`, or more hits than the rule grants per unit: no wait helps.
    Never,
    /// A new key found its storage shard full (always enforced, even in shadow mode).
    StorageCapacity { retry_after: Option<Delay> },
}

impl Exhaustion {
    pub(crate) fn retry_after(self) -> Option<Delay> {
        match self {
            Self::Quota { retry_after } => Some(retry_after),
            Self::Never => None,
            Self::StorageCapacity { retry_after } => retry_after,
        }
    }
}

/// A limiter failure: its message and whether this request's quota may have been consumed.
#[derive(Debug)]
pub(crate) struct BackendFailure {
    pub(crate) consumption: ConsumptionStatus,
    pub(crate) message: String,
}

/// The consumption certainty of a backend error.
pub(crate) trait Failure: std::error::Error {
    fn consumption(&self) -> ConsumptionStatus;
}

macro_rules! never_consumed {
    ($($error:ty),*) => {$(
        /// Memory store errors are all returned before anything is stored.
        impl Failure for $error {
            fn consumption(&self) -> ConsumptionStatus {
                ConsumptionStatus::NotConsumed
            }
        }
    )*};
}
never_consumed!(
    runlimit_memory::PoisonedShardError,
    runlimit_memory::MemoryBatchError,
    runlimit_memory::GcraCheckError,
    runlimit_memory::GcraBatchError
);

macro_rules! classified {
    ($($error:ty),*) => {$(
        impl Failure for $error {
            fn consumption(&self) -> ConsumptionStatus {
                <$error>::consumption(self)
            }
        }
    )*};
}
classified!(
    runlimit_redis::CheckError,
    runlimit_redis::BatchCheckError,
    runlimit_postgres::CheckError,
    runlimit_postgres::BatchCheckError
);

fn failure(error: &impl Failure) -> BackendFailure {
    BackendFailure { consumption: error.consumption(), message: crate::error_chain(error) }
}

/// One counter of the request: its subject bound to the rule's policy, the summed hits and the
/// charges (indexes into the request's charges) it stands for.
struct Counter<'p, P> {
    subject: PolicySubject<'p, P>,
    cost: u64,
    charges: Vec<usize>,
}

/// Evaluates `charges` against `limiter`, one verdict per charge, in order.
///
/// # Errors
///
/// A [`BackendFailure`] when the limiter fails; an internal inconsistency (a rule whose policy
/// is not of the domain's algorithm) is reported the same way, as not consumed.
pub(crate) async fn evaluate<P, L>(
    limiter: &L,
    hasher: &KeyHasher,
    charges: &[Charge<'_>],
) -> Result<Vec<Verdict>, BackendFailure>
where
    P: RuleAlgorithm,
    L: Limiter<Policy = P> + QuotaControl<Policy = P>,
    L::CheckAllError: Failure,
    L::PeekError: Failure,
{
    let mut verdicts = vec![Verdict::Unevaluated; charges.len()];
    let mut denied = false;
    // A shadow-mode rule found over its limit before the shadow batch runs: that batch would
    // be denied, so it is not run (a would-be-denied batch consumes nothing).
    let mut shadow_denied = false;
    let mut peeks: Vec<(usize, PolicySubject<'_, P>)> = Vec::new();
    let mut enforced: Vec<Counter<'_, P>> = Vec::new();
    let mut shadow: Vec<Counter<'_, P>> = Vec::new();

    for (index, charge) in charges.iter().enumerate() {
        let Quota::Limited { policy, .. } = &charge.rule.quota else { continue };
        let Some(policy) = policy else {
            // `requests_per_unit: 0`.
            let enforced = !charge.rule.shadow;
            denied |= enforced;
            shadow_denied |= !enforced;
            verdicts[index] = Verdict::Exhausted { enforced, reason: Exhaustion::Never };
            continue;
        };
        let Some(policy) = P::of(policy) else {
            return Err(BackendFailure {
                consumption: ConsumptionStatus::NotConsumed,
                message: format!(
                    "rule {} does not use its domain's algorithm",
                    crate::escape::Escaped(&charge.rule.path)
                ),
            });
        };
        let subject = hasher.hash_for(policy, &charge.subject);
        if charge.hits == 0 {
            peeks.push((index, subject));
            continue;
        }
        let counters = match policy.quota_mode() {
            QuotaMode::Enforce => &mut enforced,
            QuotaMode::Shadow => &mut shadow,
        };
        let key = subject.into_unbound_subject_key();
        match counters.iter_mut().find(|counter| {
            counter.subject.policy().fingerprint() == policy.fingerprint()
                && counter.subject.into_unbound_subject_key() == key
        }) {
            Some(counter) => {
                counter.cost = counter.cost.saturating_add(charge.hits);
                counter.charges.push(index);
            }
            None => counters.push(Counter { subject, cost: charge.hits, charges: vec![index] }),
        }
    }

    // Hits above the capacity never fit: denied without storage.
    for (counters, enforced_mode) in [(&enforced, true), (&shadow, false)] {
        for counter in counters {
            if counter.cost > counter.subject.policy().capacity().get() {
                denied |= enforced_mode;
                shadow_denied |= !enforced_mode;
                for &index in &counter.charges {
                    verdicts[index] =
                        Verdict::Exhausted { enforced: enforced_mode, reason: Exhaustion::Never };
                }
            }
        }
    }
    if denied {
        return Ok(verdicts);
    }
    enforced.retain(|counter| counter.cost <= counter.subject.policy().capacity().get());
    shadow.retain(|counter| counter.cost <= counter.subject.policy().capacity().get());

    for (index, subject) in peeks {
        let snapshot = limiter.peek(subject).await.map_err(|error| failure(&error))?;
        verdicts[index] = if snapshot.available() == 0 {
            let enforced = subject.policy().quota_mode() == QuotaMode::Enforce;
            denied |= enforced;
            shadow_denied |= !enforced;
            // A quota with nothing available is not full, so the next unit's time is known.
            let retry_after = snapshot.next_unit_after().unwrap_or(snapshot.replenishes_after());
            Verdict::Exhausted { enforced, reason: Exhaustion::Quota { retry_after } }
        } else {
            Verdict::Available(snapshot)
        };
    }
    if denied {
        return Ok(verdicts);
    }

    let charged = !enforced.is_empty();
    if charged && !admit(limiter, &enforced, false, &mut verdicts).await? {
        return Ok(verdicts);
    }
    if !shadow.is_empty() && !shadow_denied {
        match admit(limiter, &shadow, charged, &mut verdicts).await {
            Ok(_) => {}
            // The enforced batch is committed: this request's quota was consumed.
            Err(failure) if charged => {
                return Err(BackendFailure { consumption: ConsumptionStatus::Consumed, ..failure });
            }
            Err(failure) => return Err(failure),
        }
    }
    Ok(verdicts)
}

/// Runs one atomic batch and records its verdicts; `false` when it was denied under
/// enforcement (a quota denial of an enforced batch, or a storage-capacity denial of either).
///
/// `after_commit`: the request's enforced batch is already committed (this is its shadow
/// batch). A full store then cannot deny the request any more without breaking "all or
/// none" (the enforced rules were charged), so it is reported as a shadow denial instead,
/// with its reason: the request is admitted, as its enforced rules decided.
async fn admit<P, L>(
    limiter: &L,
    counters: &[Counter<'_, P>],
    after_commit: bool,
    verdicts: &mut [Verdict],
) -> Result<bool, BackendFailure>
where
    P: RuleAlgorithm,
    L: Limiter<Policy = P>,
    L::CheckAllError: Failure,
{
    let mut checks = Vec::with_capacity(counters.len());
    for counter in counters {
        // Every cost is between 1 and the capacity here (checked above), so this never fails.
        let check = Check::new(counter.subject).with_cost(counter.cost).map_err(|error| BackendFailure {
            consumption: ConsumptionStatus::NotConsumed,
            message: error.to_string(),
        })?;
        checks.push(check);
    }
    let decision = limiter.check_all(&checks).await.map_err(|error| failure(&error))?;
    match decision.view() {
        BatchDecisionView::Allowed { allowances } => {
            for (counter, allowance) in counters.iter().zip(allowances) {
                for &index in &counter.charges {
                    verdicts[index] = Verdict::Allowed(*allowance);
                }
            }
            Ok(true)
        }
        BatchDecisionView::Denied { index, denial, .. } => {
            let reason = match denial {
                Denial::QuotaExceeded(quota) => Exhaustion::Quota { retry_after: quota.retry_after() },
                Denial::StorageCapacity { retry_after } => {
                    Exhaustion::StorageCapacity { retry_after: *retry_after }
                }
            };
            let enforced = !(after_commit && matches!(reason, Exhaustion::StorageCapacity { .. }));
            if let Some(counter) = counters.get(index) {
                for &charge in &counter.charges {
                    verdicts[charge] = Verdict::Exhausted { enforced, reason };
                }
            }
            Ok(!enforced)
        }
        BatchDecisionView::ShadowDenied { index, denial, .. } => {
            if let Some(counter) = counters.get(index) {
                for &charge in &counter.charges {
                    verdicts[charge] = Verdict::Exhausted {
                        enforced: false,
                        reason: Exhaustion::Quota { retry_after: denial.retry_after() },
                    };
                }
            }
            Ok(true)
        }
    }
}
