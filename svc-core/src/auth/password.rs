//! Password hashing: argon2id with the crate's default (OWASP) parameters, stored as a PHC
//! string. Passwords only ever travel in [`Secret`].
//!
//! argon2 costs tens of milliseconds of CPU and 19 MiB per check on purpose. The Auth Service
//! runs it through a [`PasswordPool`]: on tokio's blocking threads (never on the async workers
//! that carry heartbeats and joins), at most a few at a time, with a bounded queue in front — a
//! storm of bogus sign-ins waits or is refused, and the rest of the API keeps its latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use ring::rand::{SecureRandom, SystemRandom};

use super::AuthError;
use crate::Secret;

/// A valid hash of a random password, verified against when the user does not exist so that
/// an unknown user costs as much time as a wrong password.
pub(super) const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c3ZjZHVtbXlzYWx0MDAwMA$zSbGv3RzzxOQ0O6G8tpcEhQXyoxRzq4ZI1PJJ4R6/W8";

pub(super) fn random_bytes<const N: usize>() -> Result<[u8; N], AuthError> {
    let mut bytes = [0u8; N];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| AuthError::Invalid("the system random source failed".into()))?;
    Ok(bytes)
}

/// Hashes `password` with a fresh random salt; returns the PHC string (`$argon2id$...`).
pub(crate) fn hash_password(password: &Secret) -> Result<Secret, AuthError> {
    let salt = SaltString::encode_b64(&random_bytes::<16>()?)
        .map_err(|e| AuthError::Invalid(format!("password salt: {e}")))?;
    Argon2::default()
        .hash_password(password.expose().as_bytes(), &salt)
        .map(|hash| Secret::new(hash.to_string()))
        .map_err(|e| AuthError::Invalid(format!("hashing the password failed: {e}")))
}

/// Whether `password` matches the PHC string `hash`. A malformed hash matches nothing.
pub(crate) fn verify_password(password: &Secret, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.expose().as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

/// Runs argon2 on tokio's blocking pool, `workers` at a time, with at most `max_queued` callers
/// waiting for a turn.
#[derive(Debug)]
pub(crate) struct PasswordPool {
    permits: Arc<tokio::sync::Semaphore>,
    workers: usize,
    waiting: AtomicUsize,
    max_queued: usize,
}

/// Counts a caller as waiting until it has a permit (or gave up).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl PasswordPool {
    /// Half the CPUs (at least one) check passwords at once; 64 callers per worker may wait.
    pub(crate) fn for_this_machine() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Self::new((cpus / 2).max(1), 64 * (cpus / 2).max(1))
    }

    pub(crate) fn new(workers: usize, max_queued: usize) -> Self {
        let workers = workers.max(1);
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(workers)),
            workers,
            waiting: AtomicUsize::new(0),
            max_queued,
        }
    }

    /// Checks being run now plus callers waiting (for tests and metrics).
    pub(crate) fn load(&self) -> (usize, usize) {
        (
            self.workers - self.permits.available_permits(),
            self.waiting.load(Ordering::Acquire),
        )
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, AuthError> {
        let queued = self.waiting.fetch_add(1, Ordering::AcqRel);
        let waiting = Waiting(&self.waiting);
        if queued >= self.max_queued {
            return Err(AuthError::Busy(format!(
                "{queued} password checks are already waiting (limit {}); try again later",
                self.max_queued
            )));
        }
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| AuthError::Busy("the password pool is closed".into()))?;
        drop(waiting);
        tokio::task::spawn_blocking(move || {
            let out = work();
            drop(permit);
            out
        })
        .await
        .map_err(|e| AuthError::Busy(format!("a password check did not finish: {e}")))
    }

    /// [`verify_password`] on the pool.
    pub(crate) async fn verify(&self, password: &Secret, hash: String) -> Result<bool, AuthError> {
        let password = password.clone();
        self.run(move || verify_password(&password, &hash)).await
    }

    /// [`hash_password`] on the pool.
    pub(crate) async fn hash(&self, password: &Secret) -> Result<Secret, AuthError> {
        let password = password.clone();
        self.run(move || hash_password(&password)).await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_then_verify() {
        let pw = Secret::new("correct horse".to_owned());
        let hash = hash_password(&pw).unwrap();
        assert!(hash.expose().starts_with("$argon2id$"));
        assert!(!hash.expose().contains("correct horse"));
        assert!(verify_password(&pw, hash.expose()));
        assert!(!verify_password(
            &Secret::new("wrong horse".to_owned()),
            hash.expose()
        ));
        assert!(!verify_password(&pw, "not a hash"));
        // The dummy hash parses, so an unknown user costs a full verification.
        assert!(PasswordHash::new(DUMMY_HASH).is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pool_bounds_its_queue_and_runs_off_the_async_workers() {
        let pool = Arc::new(PasswordPool::new(1, 3));
        let pw = Secret::new("whatever-password".to_owned());
        let hash = pool.hash(&pw).await.unwrap();
        assert!(pool.verify(&pw, hash.expose().clone()).await.unwrap());
        // Hold the only permit so callers queue.
        let held = Arc::clone(&pool.permits).acquire_owned().await.unwrap();
        let mut waiting = Vec::new();
        for _ in 0..3 {
            let pool = pool.clone();
            let pw = pw.clone();
            waiting.push(tokio::spawn(
                async move { pool.verify(&pw, DUMMY_HASH.into()).await },
            ));
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while pool.load().1 < 3 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "three callers never queued: {:?}",
                pool.load()
            );
            tokio::task::yield_now().await;
        }
        let e = pool.verify(&pw, DUMMY_HASH.into()).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "the Auth Service is busy: 3 password checks are already waiting (limit 3); try again later"
        );
        drop(held);
        for w in waiting {
            assert!(!w.await.unwrap().unwrap(), "a wrong password never matches");
        }
        assert_eq!(pool.load(), (0, 0));
    }
}
