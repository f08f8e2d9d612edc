//! The per-request record of every layer that admitted a request.

use std::{fmt, sync::Arc};

use runlimit_core::{Admitted, RateLimitPolicy};
use smallvec::SmallVec;

/// One layer's admission: the policy it evaluated and the [`Admitted`] outcome (allowed, or
/// shadow-denied).
///
/// A handler passes [`decision`](Self::decision) straight to `runlimit-http`'s
/// `draft_11::service_limit` (or `RateLimitFields::push` with [`policy`](Self::policy)); a
/// shadow denial then reports the values enforcement would have applied.
#[derive(Clone)]
pub struct Admission {
    policy: Arc<dyn RateLimitPolicy>,
    decision: Admitted,
}

impl Admission {
    /// An admission record. The layer builds these; the constructor is public so handler
    /// tests can build an [`Admissions`] extension without a limiter.
    #[must_use]
    pub fn new(policy: Arc<dyn RateLimitPolicy>, decision: Admitted) -> Self {
        Self { policy, decision }
    }

    /// The policy the layer evaluated (its configured policy, not one chosen by the key
    /// extractor). `Arc<dyn RateLimitPolicy>` implements
    /// [`RateLimitPolicy`] itself, so it can be passed as is to code generic over policies,
    /// such as `runlimit-http`'s `RateLimitFields::push`.
    #[must_use]
    pub fn policy(&self) -> &Arc<dyn RateLimitPolicy> {
        &self.policy
    }

    /// The outcome: [`Admitted::Allowed`] (the check's cost consumed) or [`Admitted::ShadowDenied`]
    /// (nothing consumed; what enforcement would have answered).
    #[must_use]
    pub fn decision(&self) -> Admitted {
        self.decision
    }
}

impl fmt::Debug for Admission {
    /// Names the policy by identifier, scope and mode; never prints a subject.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("policy", self.policy.id())
            .field("scope", self.policy.scope())
            .field("quota_mode", &self.policy.quota_mode())
            .field("decision", &self.decision)
            .finish()
    }
}

/// The request extension listing every [`Admission`] a request collected, in the order the
/// layers ran (outermost first).
///
/// Every [`RateLimitLayer`](crate::RateLimitLayer) a request passes appends its admission,
/// so stacking a client gate and an identity gate keeps both decisions. Read it in a handler
/// with `axum::Extension<Admissions>` and look a layer up with [`get`](Self::get).
///
/// # Examples
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use runlimit_axum::{Admission, Admissions};
/// use runlimit_core::{
///     Admitted, Allowance, Capacity, Delay, FixedWindowPolicy, PolicyId, ScopeId,
/// };
///
/// let client = Arc::new(FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?, ScopeId::new("client")?, 40, Duration::from_secs(60))?);
/// let identity = FixedWindowPolicy::new(
///     PolicyId::new("auth.login")?, ScopeId::new("identity")?, 8, Duration::from_secs(60))?;
/// let allowed = Admitted::Allowed(Allowance::new(Capacity::new(40)?, 39, Delay::from_millis(60_000))?);
///
/// let mut admissions = Admissions::default();
/// admissions.push(Admission::new(client.clone(), allowed));
/// assert_eq!(admissions.get(&*client).map(|a| a.decision()), Some(allowed));
/// assert!(admissions.get(&identity).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Admissions {
    // Inline up to two admissions (a client gate and an identity gate): the request extension
    // then holds the whole record in its one allocation.
    entries: SmallVec<[Admission; 2]>,
}

impl Admissions {
    /// The admission recorded for `policy`, matched by its
    /// [`fingerprint`](RateLimitPolicy::fingerprint) (kind, identifier, scope, counts and
    /// periods). When several layers evaluated the same fingerprint, the first (outermost)
    /// is returned; [`iter`](Self::iter) lists all of them. `P` may be unsized.
    #[must_use]
    pub fn get<P: RateLimitPolicy + ?Sized>(&self, policy: &P) -> Option<&Admission> {
        let fingerprint = policy.fingerprint();
        self.entries.iter().find(|admission| admission.policy.fingerprint() == fingerprint)
    }

    /// Appends an admission. The layer calls this; public for handler tests.
    pub fn push(&mut self, admission: Admission) {
        self.entries.push(admission);
    }

    /// All admissions, outermost layer first.
    pub fn iter(&self) -> std::slice::Iter<'_, Admission> {
        self.entries.iter()
    }

    /// The number of recorded admissions.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no layer recorded an admission.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<'a> IntoIterator for &'a Admissions {
    type Item = &'a Admission;
    type IntoIter = std::slice::Iter<'a, Admission>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

impl fmt::Debug for Admissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.entries).finish()
    }
}
