//! The two algorithms' halves of the protocol: the arguments each script needs, the stored
//! state's encoding, and the decision, always computed by `runlimit_core::backend`'s rules from
//! the state the script read and the time it used.

use runlimit_core::{
    Allowance, Check, FixedWindowPolicy, GcraPolicy, QuotaDenial, QuotaSnapshot, RateLimitPolicy,
    backend::{
        fixed_window::{self, FixedWindowOutcome, FixedWindowParameters, Window},
        gcra::{self, GcraOutcome, GcraParameters, TheoreticalArrivalTime},
        is_expired,
    },
};

pub(crate) use sealed::Verdict;

#[cfg(test)]
mod tests {
    use super::is_state;

    #[test]
    fn is_state_matches_exactly_the_formatted_state() {
        for (a, b) in [(0, 0), (7, 10), (1_796_287_181_321, 5), (u64::MAX, u64::MAX)] {
            assert!(is_state(&format!("{a}:{b}"), (a, b)));
        }
        for text in
            ["", ":", "7", "7:", ":10", "07:10", "7:010", "+7:10", "7:+10", "7:10:", "7 :10", "8:10", "7:11"]
        {
            assert!(!is_state(text, (7, 10)), "{text}");
        }
    }
}

/// A policy type a [`RedisStore`](crate::RedisStore) can count: [`FixedWindowPolicy`]
/// ([`RedisLimiter`](crate::RedisLimiter)) or [`GcraPolicy`]
/// ([`RedisGcraLimiter`](crate::RedisGcraLimiter)). Sealed: only this crate implements it.
pub trait RedisAlgorithm: RateLimitPolicy + Sized + sealed::Algorithm {}

impl RedisAlgorithm for FixedWindowPolicy {}
impl RedisAlgorithm for GcraPolicy {}

#[expect(unnameable_types, reason = "the sealed half of `RedisAlgorithm`")]
pub(crate) mod sealed {
    use super::{Allowance, Check, QuotaDenial, QuotaSnapshot};

    /// The rule's answer for one check, with the state an allowed check stores.
    #[derive(Debug)]
    pub enum Verdict {
        /// Allowed: store `next`, the state `"<next.0>:<next.1>"`.
        Allowed { allowance: Allowance, next: (u64, u64) },
        /// Denied by the quota: store nothing.
        Exhausted(QuotaDenial),
    }

    /// One algorithm's half of the protocol.
    pub trait Algorithm: runlimit_core::RateLimitPolicy + Sized {
        /// The name the store shows in its `Debug` output.
        const NAME: &'static str;
        /// The algorithm's tag in key names.
        const TAG: &'static str;
        /// Its admission script's source (shebang, the rule on plain numbers, the single-check
        /// fast path, shared functions, the exact rule, the general admission body).
        const ADMIT: &'static str;
        /// Its cleanup script's source (cleanup reads states to find their real expiry).
        const CLEANUP: &'static str;
        /// The decoded stored state.
        type State: Copy + std::fmt::Debug;

        /// Appends the rule's arguments for `check` to an `EVALSHA` (see the rule's Lua file).
        fn arguments(check: &Check<'_, Self>, command: &mut redis::Cmd);

        /// Decodes a stored state; `None` when it is malformed.
        fn parse(&self, state: &str) -> Option<Self::State>;

        /// The rule's answer at `now_ms`; `None` for a stored state no rule could have produced.
        fn evaluate(&self, state: Option<Self::State>, now_ms: u64, cost: u64) -> Option<Verdict>;

        /// The quota at `now_ms` without consuming; `None` for an impossible state.
        fn peek(&self, state: Option<Self::State>, now_ms: u64) -> Option<QuotaSnapshot>;

        /// Whether the state is live (not yet equivalent to no state) at `now_ms`.
        fn is_live(&self, state: Self::State, now_ms: u64) -> bool;
    }
}

/// Whether `state` is exactly `"<a>:<b>"` (as `format!("{a}:{b}")` writes it), without
/// allocating.
pub(crate) fn is_state(state: &str, (a, b): (u64, u64)) -> bool {
    let canonical = |text: &str, value: u64| {
        text.bytes().all(|byte| byte.is_ascii_digit())
            && (text == "0" || !text.starts_with('0'))
            && text.parse::<u64>() == Ok(value)
    };
    state.split_once(':').is_some_and(|(first, second)| canonical(first, a) && canonical(second, b))
}

/// `"<a>:<b>"` of two unsigned decimals.
fn split(state: &str) -> Option<(u64, u64)> {
    let (first, second) = state.split_once(':')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(first) || !digits(second) {
        return None;
    }
    Some((first.parse().ok()?, second.parse().ok()?))
}

impl sealed::Algorithm for FixedWindowPolicy {
    const NAME: &'static str = "RedisLimiter";
    const TAG: &'static str = "fw";
    const ADMIT: &'static str = concat!(
        "#!lua\n",
        include_str!("lua/fixed_window.lua"),
        include_str!("lua/single.lua"),
        include_str!("lua/core.lua"),
        include_str!("lua/fixed_window_exact.lua"),
        include_str!("lua/shard.lua"),
        include_str!("lua/admit.lua")
    );
    const CLEANUP: &'static str = concat!(
        "#!lua\n",
        include_str!("lua/fixed_window.lua"),
        include_str!("lua/core.lua"),
        include_str!("lua/fixed_window_exact.lua"),
        include_str!("lua/shard.lua"),
        include_str!("lua/cleanup.lua")
    );
    type State = Window;

    fn arguments(check: &Check<'_, Self>, command: &mut redis::Cmd) {
        let limit = check.policy().limit().get();
        let cost = check.cost();
        // A check's cost is between 1 and the limit (validated when it was built).
        command.arg(check.policy().window().as_millis()).arg(limit.saturating_sub(cost)).arg(cost);
    }

    fn parse(&self, state: &str) -> Option<Window> {
        let (deadline, used) = split(state)?;
        Window::new(deadline, used).ok()
    }

    fn evaluate(&self, state: Option<Window>, now_ms: u64, cost: u64) -> Option<Verdict> {
        Some(match fixed_window::evaluate(&FixedWindowParameters::of(self), state, now_ms, cost) {
            FixedWindowOutcome::Allowed { allowance, window, .. } => {
                Verdict::Allowed { allowance, next: (window.deadline_ms(), window.used()) }
            }
            FixedWindowOutcome::Exhausted(denial) => Verdict::Exhausted(denial),
        })
    }

    fn peek(&self, state: Option<Window>, now_ms: u64) -> Option<QuotaSnapshot> {
        Some(fixed_window::peek(&FixedWindowParameters::of(self), state, now_ms))
    }

    fn is_live(&self, state: Window, now_ms: u64) -> bool {
        !is_expired(state.deadline_ms(), now_ms)
    }
}

impl sealed::Algorithm for GcraPolicy {
    const NAME: &'static str = "RedisGcraLimiter";
    const TAG: &'static str = "gcra";
    const ADMIT: &'static str = concat!(
        "#!lua\n",
        include_str!("lua/gcra.lua"),
        include_str!("lua/single.lua"),
        include_str!("lua/core.lua"),
        include_str!("lua/gcra_exact.lua"),
        include_str!("lua/shard.lua"),
        include_str!("lua/admit.lua")
    );
    const CLEANUP: &'static str = concat!(
        "#!lua\n",
        include_str!("lua/gcra.lua"),
        include_str!("lua/core.lua"),
        include_str!("lua/gcra_exact.lua"),
        include_str!("lua/shard.lua"),
        include_str!("lua/cleanup.lua")
    );
    type State = TheoreticalArrivalTime;

    fn arguments(check: &Check<'_, Self>, command: &mut redis::Cmd) {
        let parameters = GcraParameters::of(check.policy());
        let quota = u128::from(parameters.quota().get());
        let period = u128::from(parameters.period().as_millis());
        let burst = u128::from(parameters.burst_capacity().get());
        let cost = u128::from(check.cost());
        // c·P = a·Q + b and (B − c)·P = m·Q + n, exactly (below 2^127); a and m are at most
        // the policy's full replenishment time in ms.
        let spend = cost * period;
        let room = burst.saturating_sub(cost) * period;
        command
            .arg(spend / quota)
            .arg(spend % quota)
            .arg(quota - spend % quota)
            .arg(room / quota)
            .arg(room % quota);
    }

    fn parse(&self, state: &str) -> Option<TheoreticalArrivalTime> {
        let (millis, remainder) = split(state)?;
        TheoreticalArrivalTime::from_parts(millis, remainder, GcraParameters::of(self))
    }

    fn evaluate(&self, state: Option<TheoreticalArrivalTime>, now_ms: u64, cost: u64) -> Option<Verdict> {
        let parameters = GcraParameters::of(self);
        let outcome = gcra::evaluate(parameters, state, now_ms, cost).ok()?;
        match outcome {
            GcraOutcome::Allowed { tat, .. } => {
                let (millis, remainder) = tat.to_parts(parameters)?;
                Some(Verdict::Allowed {
                    allowance: outcome.allowance(parameters)?,
                    next: (millis, remainder),
                })
            }
            GcraOutcome::Denied { .. } => outcome.quota_denial(parameters).map(Verdict::Exhausted),
        }
    }

    fn peek(&self, state: Option<TheoreticalArrivalTime>, now_ms: u64) -> Option<QuotaSnapshot> {
        gcra::peek(GcraParameters::of(self), state, now_ms).ok()
    }

    fn is_live(&self, state: TheoreticalArrivalTime, now_ms: u64) -> bool {
        !is_expired(state.expires_at_millis(GcraParameters::of(self)), now_ms)
    }
}
