//! Time as an input: the [`Clock`] every time-dependent piece of svc is handed.
//!
//! Maintenance windows, token expiry and schedule exports are pure functions of "now". The
//! services pass a [`SystemClock`]; tests pass a [`ManualClock`] and move it by hand, so no test
//! ever sleeps or depends on the wall clock.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime},
};

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The real wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to; for tests and simulations.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    /// A clock stopped at `now`.
    pub fn new(now: SystemTime) -> Self {
        Self { now: Mutex::new(now) }
    }

    /// A clock stopped at `secs` seconds after the Unix epoch.
    pub fn at_unix(secs: u64) -> Self {
        Self::new(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    }

    /// Moves the clock to `now` (backwards too: tests of clock skew need it).
    pub fn set(&self, now: SystemTime) {
        // A poisoned lock still holds a valid SystemTime; there is no invariant to lose.
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = now;
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> SystemTime {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::at_unix(1_000);
        assert_eq!(clock.now(), SystemTime::UNIX_EPOCH + Duration::from_secs(1_000));
        clock.advance(Duration::from_secs(60));
        assert_eq!(clock.now(), SystemTime::UNIX_EPOCH + Duration::from_secs(1_060));
        clock.set(SystemTime::UNIX_EPOCH);
        assert_eq!(clock.now(), SystemTime::UNIX_EPOCH);
    }

    #[test]
    fn shared_clock_is_a_clock() {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_unix(5));
        fn takes(c: &impl Clock) -> SystemTime {
            c.now()
        }
        assert_eq!(takes(&clock), SystemTime::UNIX_EPOCH + Duration::from_secs(5));
        assert!(SystemClock.now() > SystemTime::UNIX_EPOCH);
    }
}
