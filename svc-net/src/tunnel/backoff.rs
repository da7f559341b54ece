//! The agent's reconnect backoff: linear steps of 1 s up to
//! 8 s, with jitter, reset after a success; and the quick redial that finds a proxy behind a
//! load balancer (see [`duplicate_redial`]). Pure: the caller supplies the random source, so the
//! schedule is testable without clocks.

use std::time::Duration;

/// Linear backoff with jitter.
#[derive(Clone, Debug)]
pub struct Backoff {
    step: Duration,
    max: Duration,
    attempt: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(8))
    }
}

impl Backoff {
    /// Steps of `step`, capped at `max`.
    pub fn new(step: Duration, max: Duration) -> Self {
        Self {
            step,
            max,
            attempt: 0,
        }
    }

    /// The next delay: `min(step × attempt, max)` scaled by a jitter factor in `[0.5, 1.0]`
    /// taken from `unit` (a number in `[0, 1)`), so agents that lost the same proxy spread out.
    pub fn next_delay(&mut self, unit: f64) -> Duration {
        self.attempt = self.attempt.saturating_add(1);
        let base = self.step.saturating_mul(self.attempt).min(self.max);
        base.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }

    /// The upper bound of any delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// Starts over after a successful connection.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// The shortest quick redial.
pub(super) const QUICK_REDIAL_MIN: Duration = Duration::from_millis(50);

/// The spread of a quick redial above [`QUICK_REDIAL_MIN`] (jitter).
pub(super) const QUICK_REDIAL_SPREAD: Duration = Duration::from_millis(200);

/// How many consecutive dials reaching an already-held proxy are retried quickly, per proxy
/// the agent should hold: with `n` proxies behind a balancer that spreads dials evenly, `4 n`
/// tries miss one given proxy with a probability of about `e^-4` (2 %).
pub(super) const QUICK_REDIALS_PER_PROXY: u32 = 4;

/// A quick redial: between [`QUICK_REDIAL_MIN`] and that plus [`QUICK_REDIAL_SPREAD`], placed
/// by `unit` (a number in `[0, 1)`). Used after a dial reached a proxy the agent already holds
/// and after a tunnel that was up dropped.
pub(super) fn quick_redial(unit: f64) -> Duration {
    QUICK_REDIAL_MIN + QUICK_REDIAL_SPREAD.mul_f64(unit.clamp(0.0, 1.0))
}

/// The pause after `consecutive` dials in a row reached a proxy the agent already holds, while
/// it should hold `proxies` tunnels: a quick redial for the first
/// `QUICK_REDIALS_PER_PROXY × proxies` of them (at least one proxy counted), then `None`: the
/// caller waits out its reconnect backoff, so that a fleet does not hammer its load balancer
/// when the missing proxy is really gone.
pub(super) fn duplicate_redial(consecutive: u32, proxies: usize, unit: f64) -> Option<Duration> {
    let proxies = u32::try_from(proxies.max(1)).unwrap_or(u32::MAX);
    let budget = QUICK_REDIALS_PER_PROXY.saturating_mul(proxies);
    (consecutive <= budget).then(|| quick_redial(unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_capped_jittered_and_reset() {
        let mut b = Backoff::default();
        let full: Vec<_> = (0..10).map(|_| b.next_delay(1.0).as_secs()).collect();
        assert_eq!(full, [1, 2, 3, 4, 5, 6, 7, 8, 8, 8]);
        b.reset();
        assert_eq!(b.next_delay(0.0), Duration::from_millis(500));
        assert_eq!(b.next_delay(0.5), Duration::from_millis(1500));
        assert!(b.next_delay(7.0) <= b.max());
    }

    #[test]
    fn duplicates_are_redialed_quickly_up_to_a_budget_per_proxy() {
        // Three proxies: twelve quick tries, jittered within [50 ms, 250 ms].
        for n in 1..=12 {
            assert_eq!(duplicate_redial(n, 3, 0.0), Some(Duration::from_millis(50)));
            assert_eq!(duplicate_redial(n, 3, 1.0), Some(Duration::from_millis(250)));
        }
        assert_eq!(duplicate_redial(7, 3, 0.5), Some(Duration::from_millis(150)));
        assert_eq!(duplicate_redial(13, 3, 0.0), None);
        assert_eq!(duplicate_redial(u32::MAX, 3, 0.0), None);
        // No proxy known yet counts as one; out-of-range randomness is clamped.
        assert!(duplicate_redial(4, 0, 0.3).is_some());
        assert_eq!(duplicate_redial(5, 0, 0.3), None);
        assert_eq!(quick_redial(-1.0), Duration::from_millis(50));
        assert_eq!(quick_redial(9.0), Duration::from_millis(250));
    }
}
