//! The agent's reconnect backoff: linear steps of 1 s up to
//! 8 s, with jitter, reset after a success. Pure: the caller supplies the random source, so the
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
}
