//! Sign-in and join abuse limits: failed attempts per user and per source address, and the
//! lockout that follows. A pure type: the time comes from the [`Clock`] passed in, so tests move
//! a `ManualClock` instead of waiting.
//!
//! Rules (the defaults follow Teleport: five failures lock the user for thirty minutes):
//!
//! - each subject (a user name, or a source address: IPv4, or the `/64` of an IPv6 address) has
//!   a count of failures; failures older than the lockout duration are forgotten;
//! - an attempt in flight counts as a failure until it ends, so concurrent guesses cannot
//!   outrun the count; an attempt dropped before it ended (a client that hung up while its
//!   password was being checked) is a failure;
//! - reaching the limit locks the subject for the lockout duration; while locked every attempt
//!   is refused before any password or token is looked at — the right password too;
//! - a successful sign-in forgets the user's failures (not the source's: one valid account must
//!   not reset the count of a guessing address).
//!
//! State lives in memory, per Auth Service process: a restart forgets failures and locks. That
//! is the trade-off chosen over storing every failed attempt in the backend (a write per bogus
//! login is itself an amplification an attacker could use); `docs/security.md` says so. Memory is
//! bounded: at most [`MAX_TRACKED`] subjects are tracked; when full, idle entries are dropped
//! first (at most once a second), and a new subject beyond that is not tracked (logged once).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::clock::Clock;

/// Subjects (users and source addresses together) tracked at most.
pub const MAX_TRACKED: usize = 131_072;

/// The limits (from `auth_service.authentication`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoginLimits {
    /// Failed sign-ins that lock a user (`max_login_attempts`, default 5).
    pub max_user_failures: u32,
    /// Failed sign-ins or joins that lock a source address (`max_source_attempts`, default 20).
    pub max_source_failures: u32,
    /// How long a lock lasts, and how long a failure is remembered (`lockout_duration`, default
    /// 30 minutes).
    pub lockout: Duration,
}

impl LoginLimits {
    /// The default number of failures that lock a user.
    pub(crate) const DEFAULT_MAX_USER_FAILURES: u32 = 5;
    /// The default number of failures that lock a source address.
    pub(crate) const DEFAULT_MAX_SOURCE_FAILURES: u32 = 20;
    /// The default lock duration.
    pub(crate) const DEFAULT_LOCKOUT: Duration = Duration::from_secs(30 * 60);

    /// Limits with these values (each count at least 1).
    pub fn new(max_user_failures: u32, max_source_failures: u32, lockout: Duration) -> Self {
        Self {
            max_user_failures: max_user_failures.max(1),
            max_source_failures: max_source_failures.max(1),
            lockout,
        }
    }
}

impl Default for LoginLimits {
    fn default() -> Self {
        Self::new(
            Self::DEFAULT_MAX_USER_FAILURES,
            Self::DEFAULT_MAX_SOURCE_FAILURES,
            Self::DEFAULT_LOCKOUT,
        )
    }
}

/// What is limited.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Subject {
    /// A user name.
    User(String),
    /// A source address (IPv6 addresses are grouped by `/64`).
    Source(IpAddr),
}

impl Subject {
    /// The subject for a source address: IPv4 (an IPv4-mapped IPv6 address too) as is, IPv6
    /// by its `/64` network, since one host usually owns a whole `/64`.
    pub fn source(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V6(v6) => {
                let net = u128::from(v6) & !((1u128 << 64) - 1);
                Subject::Source(IpAddr::V6(net.into()))
            }
            v4 => Subject::Source(v4),
        }
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::User(name) => write!(f, "user {name:?}"),
            Subject::Source(IpAddr::V6(net)) => write!(f, "source address {net}/64"),
            Subject::Source(ip) => write!(f, "source address {ip}"),
        }
    }
}

/// Why an attempt was refused before it was checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The subject reached its limit and is locked.
    #[error("{subject} is locked after {failures} failed attempts; try again after {}", rfc3339(*until))]
    Locked {
        /// Who is locked.
        subject: Subject,
        /// The limit that was reached.
        failures: u32,
        /// When the lock ends.
        until: SystemTime,
    },
    /// Attempts in flight already reach the limit (each counts as a failure until it ends).
    #[error("{subject} has too many attempts in progress ({in_flight}, limit {limit}); try again later")]
    Busy {
        /// Whose attempts.
        subject: Subject,
        /// Attempts being checked now.
        in_flight: u32,
        /// The limit.
        limit: u32,
    },
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[derive(Debug, Default)]
struct Entry {
    failures: u32,
    /// When the oldest remembered failure happened.
    since: Option<SystemTime>,
    in_flight: u32,
    locked_until: Option<SystemTime>,
}

impl Entry {
    /// Forgets expired failures and an expired lock.
    fn refresh(&mut self, now: SystemTime, lockout: Duration) {
        if self.locked_until.is_some_and(|t| now >= t) {
            self.locked_until = None;
        }
        if self.since.is_some_and(|t| now >= t + lockout) {
            self.failures = 0;
            self.since = None;
        }
    }

    fn idle(&self) -> bool {
        self.failures == 0 && self.in_flight == 0 && self.locked_until.is_none()
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Subject, Entry>,
    /// Whether the "not tracked" warning was logged since the table was last not full.
    warned_full: bool,
    /// When idle entries were last dropped from a full table.
    pruned: Option<SystemTime>,
}

/// The limiter: shared by every sign-in (and join) of one Auth Service.
pub struct LoginLimiter {
    limits: LoginLimits,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl std::fmt::Debug for LoginLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginLimiter")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// One attempt in flight. End it with [`Attempt::succeeded`] or [`Attempt::failed`]; dropping it
/// counts as a failure.
#[derive(Debug)]
#[must_use = "an attempt dropped without an outcome counts as a failure"]
pub(crate) struct Attempt {
    limiter: Arc<LoginLimiter>,
    subjects: Vec<Subject>,
    done: bool,
}

impl LoginLimiter {
    /// A limiter with `limits`, reading the time from `clock`.
    pub fn new(limits: LoginLimits, clock: Arc<dyn Clock>) -> Self {
        Self {
            limits,
            clock,
            state: Mutex::new(State::default()),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> LoginLimits {
        self.limits
    }

    fn limit_of(&self, subject: &Subject) -> u32 {
        match subject {
            Subject::User(_) => self.limits.max_user_failures,
            Subject::Source(_) => self.limits.max_source_failures,
        }
    }

    /// Starts an attempt by `user` (if any) from `source` (if known): refused when either is
    /// locked or has as many attempts in flight (plus failures) as its limit.
    pub(crate) fn begin(
        self: &Arc<Self>,
        user: Option<&str>,
        source: Option<IpAddr>,
    ) -> Result<Attempt, Refusal> {
        let now = self.clock.now();
        let mut subjects = Vec::with_capacity(2);
        if let Some(user) = user {
            subjects.push(Subject::User(user.to_owned()));
        }
        if let Some(ip) = source {
            subjects.push(Subject::source(ip));
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // Check every subject before counting anything, so a refusal changes nothing.
        for subject in &subjects {
            let limit = self.limit_of(subject);
            let Some(entry) = state.entries.get_mut(subject) else {
                continue;
            };
            entry.refresh(now, self.limits.lockout);
            if let Some(until) = entry.locked_until {
                return Err(Refusal::Locked {
                    subject: subject.clone(),
                    failures: limit,
                    until,
                });
            }
            if entry.failures + entry.in_flight >= limit {
                return Err(Refusal::Busy {
                    subject: subject.clone(),
                    in_flight: entry.in_flight,
                    limit,
                });
            }
        }
        let mut tracked = Vec::with_capacity(subjects.len());
        for subject in subjects {
            if !state.entries.contains_key(&subject) && !self.make_room(&mut state, now) {
                continue;
            }
            state.entries.entry(subject.clone()).or_default().in_flight += 1;
            tracked.push(subject);
        }
        Ok(Attempt {
            limiter: Arc::clone(self),
            subjects: tracked,
            done: false,
        })
    }

    /// Whether a new subject fits; drops idle entries first when the table is full.
    fn make_room(&self, state: &mut State, now: SystemTime) -> bool {
        if state.entries.len() < MAX_TRACKED {
            state.warned_full = false;
            return true;
        }
        // Pruning walks the whole table under the lock: at most once a second, so a flood of
        // new subjects cannot turn every attempt into a full scan.
        if state.pruned.is_none_or(|t| now >= t + Duration::from_secs(1)) {
            state.pruned = Some(now);
            let lockout = self.limits.lockout;
            state.entries.retain(|_, e| {
                e.refresh(now, lockout);
                !e.idle()
            });
        }
        if state.entries.len() < MAX_TRACKED {
            state.warned_full = false;
            return true;
        }
        if !state.warned_full {
            state.warned_full = true;
            tracing::warn!(
                limit = MAX_TRACKED,
                "sign-in limiter: too many users or addresses with recent failures; new ones are not tracked"
            );
        }
        false
    }

    fn finish(&self, subjects: &[Subject], success: bool) {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for subject in subjects {
            let limit = self.limit_of(subject);
            let Some(entry) = state.entries.get_mut(subject) else {
                continue;
            };
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.refresh(now, self.limits.lockout);
            if success {
                if matches!(subject, Subject::User(_)) {
                    entry.failures = 0;
                    entry.since = None;
                }
            } else if entry.locked_until.is_none() {
                entry.failures += 1;
                entry.since.get_or_insert(now);
                if entry.failures >= limit {
                    let until = now + self.limits.lockout;
                    entry.locked_until = Some(until);
                    entry.failures = 0;
                    entry.since = None;
                    tracing::warn!(%subject, failures = limit, until = %rfc3339(until), "sign-in locked after too many failures");
                }
            }
            if entry.idle() {
                state.entries.remove(subject);
            }
        }
    }

    fn cancel(&self, subjects: &[Subject]) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for subject in subjects {
            if let Some(entry) = state.entries.get_mut(subject) {
                entry.in_flight = entry.in_flight.saturating_sub(1);
                if entry.idle() {
                    state.entries.remove(subject);
                }
            }
        }
    }

    /// Whether `subject` is locked now, and until when.
    pub fn locked_until(&self, subject: &Subject) -> Option<SystemTime> {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = state.entries.get_mut(subject)?;
        entry.refresh(now, self.limits.lockout);
        entry.locked_until
    }
}

impl Attempt {
    /// The attempt succeeded: the user's failures are forgotten.
    pub(crate) fn succeeded(mut self) {
        self.done = true;
        self.limiter.finish(&self.subjects, true);
    }

    /// The attempt ended without saying anything about the caller (storage failed, the Auth
    /// Service was busy): it counts neither way.
    pub(crate) fn cancelled(mut self) {
        self.done = true;
        self.limiter.cancel(&self.subjects);
    }

    /// The attempt failed (wrong password, unknown user, invalid token).
    pub(crate) fn failed(mut self) {
        self.done = true;
        self.limiter.finish(&self.subjects, false);
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.done {
            self.limiter.finish(&self.subjects, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::ManualClock;

    const ALICE: Option<&str> = Some("alice");
    const HOME: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));

    fn limiter(user: u32, source: u32) -> (Arc<ManualClock>, Arc<LoginLimiter>) {
        let clock = Arc::new(ManualClock::at_unix(1_700_000_000));
        let limits = LoginLimits::new(user, source, Duration::from_secs(30 * 60));
        (clock.clone(), Arc::new(LoginLimiter::new(limits, clock)))
    }

    fn fail(l: &Arc<LoginLimiter>, user: Option<&str>, source: Option<IpAddr>) {
        l.begin(user, source).expect("attempt allowed").failed();
    }

    #[test]
    fn the_defaults_are_teleports() {
        let d = LoginLimits::default();
        assert_eq!(d.max_user_failures, 5);
        assert_eq!(d.lockout, Duration::from_secs(1800));
        assert_eq!(d.max_source_failures, 20);
    }

    #[test]
    fn five_failures_lock_the_user_for_thirty_minutes_even_for_the_right_password() {
        let (clock, l) = limiter(5, 100);
        for _ in 0..4 {
            fail(&l, ALICE, HOME);
        }
        // The fifth failure locks.
        fail(&l, ALICE, HOME);
        let e = l.begin(ALICE, HOME).unwrap_err();
        assert_eq!(
            e.to_string(),
            "user \"alice\" is locked after 5 failed attempts; try again after 2023-11-14T22:43:20Z"
        );
        // From another address too: the lock is on the user.
        let other = Some(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)));
        assert!(matches!(l.begin(ALICE, other), Err(Refusal::Locked { .. })));
        // Other users are not affected.
        l.begin(Some("bob"), HOME).unwrap().succeeded();
        clock.advance(Duration::from_secs(30 * 60 - 1));
        assert!(
            l.begin(ALICE, HOME).is_err(),
            "still locked one second before the end"
        );
        clock.advance(Duration::from_secs(1));
        l.begin(ALICE, HOME).expect("the lock ended").succeeded();
    }

    #[test]
    fn a_success_forgets_the_users_failures_and_old_failures_expire() {
        let (clock, l) = limiter(3, 100);
        fail(&l, ALICE, None);
        fail(&l, ALICE, None);
        l.begin(ALICE, None).unwrap().succeeded();
        fail(&l, ALICE, None);
        fail(&l, ALICE, None);
        l.begin(ALICE, None)
            .expect("two failures after the success do not lock")
            .cancelled();
        // Failures older than the lockout duration are forgotten: two old plus two new do not
        // reach three.
        clock.advance(Duration::from_secs(31 * 60));
        fail(&l, ALICE, None);
        fail(&l, ALICE, None);
        assert!(l.locked_until(&Subject::User("alice".into())).is_none());
    }

    #[test]
    fn a_guessing_address_is_locked_across_user_names_and_a_success_does_not_reset_it() {
        let (_clock, l) = limiter(5, 3);
        fail(&l, Some("u1"), HOME);
        // A valid sign-in from the same address does not reset the address's count.
        l.begin(Some("mallory"), HOME).unwrap().succeeded();
        fail(&l, Some("u2"), HOME);
        fail(&l, Some("u3"), HOME);
        let e = l.begin(Some("u4"), HOME).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("source address 192.0.2.7 is locked after 3 failed attempts"),
            "{e}"
        );
        // Joins carry no user: the address lock refuses them too.
        assert!(matches!(l.begin(None, HOME), Err(Refusal::Locked { .. })));
        // Another address is fine.
        assert!(l.begin(Some("u4"), Some(IpAddr::V4(Ipv4Addr::LOCALHOST))).is_ok());
    }

    #[test]
    fn ipv6_addresses_are_grouped_by_64_and_mapped_ipv4_is_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(Subject::source(a), Subject::source(b));
        assert_eq!(Subject::source(a).to_string(), "source address 2001:db8:1:2::/64");
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped());
        assert_eq!(Subject::source(mapped), Subject::source(HOME.unwrap()));
        assert_ne!(
            Subject::source(a),
            Subject::source(IpAddr::V6(Ipv6Addr::LOCALHOST))
        );
    }

    #[test]
    fn concurrent_guesses_cannot_outrun_the_count() {
        let (_clock, l) = limiter(5, 100);
        let in_flight: Vec<Attempt> = (0..5).map(|_| l.begin(ALICE, None).unwrap()).collect();
        let e = l.begin(ALICE, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "user \"alice\" has too many attempts in progress (5, limit 5); try again later"
        );
        // Dropped attempts (clients that hung up) count as failures: the user is locked.
        drop(in_flight);
        assert!(matches!(l.begin(ALICE, None), Err(Refusal::Locked { .. })));
    }

    #[test]
    fn a_refused_attempt_changes_nothing_and_idle_entries_are_dropped() {
        let (_clock, l) = limiter(2, 100);
        fail(&l, ALICE, HOME);
        fail(&l, ALICE, HOME);
        for _ in 0..10 {
            assert!(l.begin(ALICE, HOME).is_err());
        }
        // The address saw two failures only: the ten refusals were not counted against it.
        let state = l.state.lock().unwrap();
        assert_eq!(state.entries[&Subject::source(HOME.unwrap())].failures, 2);
        drop(state);
        l.begin(Some("bob"), None).unwrap().succeeded();
        assert!(
            !l.state
                .lock()
                .unwrap()
                .entries
                .contains_key(&Subject::User("bob".into()))
        );
    }

    #[test]
    fn memory_is_bounded_and_expired_entries_make_room_again() {
        let (clock, l) = limiter(1, 1_000_000);
        for i in 0..MAX_TRACKED {
            fail(&l, Some(&format!("u{i}")), None);
        }
        assert_eq!(l.state.lock().unwrap().entries.len(), MAX_TRACKED);
        // Full of locked users: a newcomer is not tracked, so its failure locks nothing.
        fail(&l, Some("newcomer"), None);
        assert!(l.begin(Some("newcomer"), None).is_ok());
        assert_eq!(l.state.lock().unwrap().entries.len(), MAX_TRACKED);
        // Once the locks have expired, the table makes room and the newcomer is tracked.
        clock.advance(Duration::from_secs(30 * 60 + 1));
        fail(&l, Some("newcomer"), None);
        assert!(matches!(
            l.begin(Some("newcomer"), None),
            Err(Refusal::Locked { .. })
        ));
        assert_eq!(l.state.lock().unwrap().entries.len(), 1);
    }
}
