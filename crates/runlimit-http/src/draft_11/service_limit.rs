//! `RateLimit` items: `"name";r=N;t=S`.

use http::HeaderValue;
use runlimit_core::{Admitted, Allowance, Delay, QuotaDenial};

use super::{
    name::PolicyName,
    sf::{self, Key, MAX_INTEGER, SfInteger},
};

/// A quota state a `RateLimit` item can describe: units still available, or exhausted.
///
/// Only [`Allowance`], [`QuotaDenial`] and [`Admitted`] convert into it (by value or by
/// reference), so [`service_limit`] and [`ServiceLimit::new`] accept exactly those. A
/// storage-capacity denial has no quota to describe and does not convert, so it can never
/// become an encoding error in a response path:
///
/// ```compile_fail
/// use runlimit_core::Denial;
/// use runlimit_http::draft_11::{service_limit, PolicyName};
///
/// let name = PolicyName::new("default").unwrap();
/// let _ = service_limit(&name, Denial::StorageCapacity { retry_after: None });
/// ```
///
/// A rejection mapper matches its [`Denial`](runlimit_core::Denial) and passes the
/// [`QuotaDenial`] of the `QuotaExceeded` arm.
///
/// | source | variant | `r` | `t` |
/// |---|---|---|---|
/// | [`Allowance`], [`Admitted::Allowed`] | [`Available`](Self::Available) | [`Allowance::available`] | ⌈[`Allowance::replenishes_after`]⌉ s |
/// | [`QuotaDenial`], [`Admitted::ShadowDenied`] | [`Exhausted`](Self::Exhausted) | 0 | ⌈[`QuotaDenial::retry_after`]⌉ s |
///
/// A shadow-denied admission therefore exposes the value enforcement would have applied:
/// `r=0` and the retry delay. See [the `t` choice](super#the-t-parameter) for what `t` means
/// for fixed windows and GCRA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaState {
    /// Allowed: units remain.
    Available(Allowance),
    /// Exhausted: enforced, or shadow-denied (admitted, but enforcement would have denied).
    Exhausted(QuotaDenial),
}

impl QuotaState {
    /// `r`, the available quota in units (D11 §4.1.1): the allowance's available units, or 0
    /// when exhausted. Not range-checked here; [`ServiceLimit::new`] checks it.
    #[must_use]
    pub fn available(&self) -> u64 {
        match self {
            Self::Available(allowance) => allowance.available(),
            Self::Exhausted(_) => 0,
        }
    }

    /// The exact source of `t` (D11 §4.1.2): the allowance's time to full replenishment, or
    /// the denial's retry delay. `t` is its [`Delay::seconds`], rounded up.
    #[must_use]
    pub fn effective_window(&self) -> Delay {
        match self {
            Self::Available(allowance) => allowance.replenishes_after(),
            Self::Exhausted(denial) => denial.retry_after(),
        }
    }
}

impl From<Allowance> for QuotaState {
    fn from(allowance: Allowance) -> Self {
        Self::Available(allowance)
    }
}

impl From<&Allowance> for QuotaState {
    fn from(allowance: &Allowance) -> Self {
        Self::Available(*allowance)
    }
}

impl From<QuotaDenial> for QuotaState {
    fn from(denial: QuotaDenial) -> Self {
        Self::Exhausted(denial)
    }
}

impl From<&QuotaDenial> for QuotaState {
    fn from(denial: &QuotaDenial) -> Self {
        Self::Exhausted(*denial)
    }
}

impl From<Admitted> for QuotaState {
    /// Allowed becomes [`Available`](Self::Available); shadow-denied becomes
    /// [`Exhausted`](Self::Exhausted), the state enforcement would have reported.
    fn from(admitted: Admitted) -> Self {
        match admitted {
            Admitted::Allowed(allowance) => Self::Available(allowance),
            Admitted::ShadowDenied(denial) => Self::Exhausted(denial),
        }
    }
}

impl From<&Admitted> for QuotaState {
    fn from(admitted: &Admitted) -> Self {
        Self::from(*admitted)
    }
}

/// Why a `RateLimit` item could not be built by [`ServiceLimit::new`] or [`service_limit`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceLimitError {
    /// `r` is above RFC 9651's largest Integer, [`MAX_INTEGER`] (RFC 9651 §3.3.1). Only a
    /// policy whose capacity exceeds [`MAX_INTEGER`] can produce this.
    #[error("available quota {available} is above the structured field integer maximum of {maximum}")]
    AvailableOutOfRange {
        /// The rejected available quota.
        available: u64,
        /// [`MAX_INTEGER`].
        maximum: u64,
    },
    /// `t`, rounded up to whole seconds, is above [`MAX_INTEGER`]. Backend delays never are
    /// (they are bounded by `runlimit_core::MAX_WINDOW`); a hand-built [`Delay`] can be.
    #[error(
        "effective window of {seconds} seconds is above the structured field integer maximum of {maximum}"
    )]
    WindowOutOfRange {
        /// The rejected window in whole seconds (rounded up).
        seconds: u64,
        /// [`MAX_INTEGER`].
        maximum: u64,
    },
}

/// One validated `RateLimit` item, `"name";r=N;t=S` (D11 §4.1).
///
/// # Examples
///
/// The draft's `RateLimit: "default";r=50;t=30` (D11 §4.2); 29.5 s rounds up to 30:
///
/// ```
/// use runlimit_core::{Allowance, Capacity, Delay, QuotaDenial};
/// use runlimit_http::draft_11::{service_limits, PolicyName, ServiceLimit};
///
/// let allowance = Allowance::new(Capacity::new(100)?, 50, Delay::from_millis(29_500))?;
/// let denial = QuotaDenial::new(Capacity::new(10)?, Delay::from_millis(9_001));
/// let items = [
///     ServiceLimit::new(PolicyName::new("default")?, allowance)?,
///     ServiceLimit::new(PolicyName::new("problemPolicy")?, denial)?,
/// ];
/// assert_eq!(items[1].window_seconds(), 10);
/// let value = service_limits(&items).ok_or("no items")?;
/// assert_eq!(value, r#""default";r=50;t=30, "problemPolicy";r=0;t=10"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceLimit {
    name: PolicyName,
    available: SfInteger,
    window_seconds: SfInteger,
}

impl ServiceLimit {
    /// Describes `state` under `name`: `r` = [`QuotaState::available`], `t` =
    /// [`QuotaState::effective_window`] rounded up to whole seconds.
    ///
    /// # Errors
    ///
    /// - [`ServiceLimitError::AvailableOutOfRange`] when `r` exceeds [`MAX_INTEGER`];
    /// - [`ServiceLimitError::WindowOutOfRange`] when `t` exceeds [`MAX_INTEGER`] seconds.
    pub fn new(name: PolicyName, state: impl Into<QuotaState>) -> Result<Self, ServiceLimitError> {
        let (available, window_seconds) = validate(state.into())?;
        Ok(Self { name, available, window_seconds })
    }

    /// The policy name.
    #[must_use]
    pub fn name(&self) -> &PolicyName {
        &self.name
    }

    /// `r`: available quota units, at most [`MAX_INTEGER`].
    #[must_use]
    pub fn available(&self) -> u64 {
        self.available.get()
    }

    /// `t`: the effective window in whole seconds, rounded up, at most [`MAX_INTEGER`].
    #[must_use]
    pub fn window_seconds(&self) -> u64 {
        self.window_seconds.get()
    }

    fn write(&self, out: &mut sf::Buffer) {
        write(out, &self.name, self.available, self.window_seconds);
    }
}

fn validate(state: QuotaState) -> Result<(SfInteger, SfInteger), ServiceLimitError> {
    let available = state.available();
    let available = SfInteger::new(available)
        .ok_or(ServiceLimitError::AvailableOutOfRange { available, maximum: MAX_INTEGER })?;
    let seconds = state.effective_window().seconds();
    let window_seconds = SfInteger::new(seconds)
        .ok_or(ServiceLimitError::WindowOutOfRange { seconds, maximum: MAX_INTEGER })?;
    Ok((available, window_seconds))
}

fn write(out: &mut sf::Buffer, name: &PolicyName, available: SfInteger, window_seconds: SfInteger) {
    sf::write_item(out, name.as_str(), [(Key::Remaining, available), (Key::EffectiveWindow, window_seconds)]);
}

/// The `RateLimit` value for one policy: `"name";r=N;t=S`.
///
/// `state` is an [`Allowance`], a [`QuotaDenial`] or an [`Admitted`] (see [`QuotaState`]).
/// A handler passes an admission's decision straight through; a rejection mapper passes the
/// [`QuotaDenial`] of its `Denial::QuotaExceeded` arm.
///
/// # Errors
///
/// - [`ServiceLimitError::AvailableOutOfRange`] when `r` exceeds [`MAX_INTEGER`];
/// - [`ServiceLimitError::WindowOutOfRange`] when `t` exceeds [`MAX_INTEGER`] seconds.
///
/// # Examples
///
/// ```
/// use runlimit_core::{Admitted, Capacity, Delay, QuotaDenial};
/// use runlimit_http::draft_11::{service_limit, PolicyName};
///
/// let name = PolicyName::new("default")?;
/// // A shadow denial exposes what enforcement would have sent.
/// let shadow = Admitted::ShadowDenied(QuotaDenial::new(Capacity::new(5)?, Delay::from_millis(1_001)));
/// assert_eq!(service_limit(&name, shadow)?, r#""default";r=0;t=2"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn service_limit(
    name: &PolicyName,
    state: impl Into<QuotaState>,
) -> Result<HeaderValue, ServiceLimitError> {
    let (available, window_seconds) = validate(state.into())?;
    let mut out = sf::Buffer::new();
    write(&mut out, name, available, window_seconds);
    Ok(sf::header_value(&out))
}

/// The `RateLimit` value for several items, in order, joined by `", "` (RFC 9651 §4.1.1).
///
/// Returns `None` when `items` is empty: an empty List is not serialized (RFC 9651 §4.1) and
/// D11 §4 requires a non-empty field.
#[must_use]
pub fn service_limits<'a>(items: impl IntoIterator<Item = &'a ServiceLimit>) -> Option<HeaderValue> {
    sf::list(items, |out, item: &ServiceLimit| item.write(out))
}
