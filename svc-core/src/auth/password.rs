//! Password hashing: argon2id with the crate's default (OWASP) parameters, stored as a PHC
//! string. Passwords only ever travel in [`Secret`].

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
pub fn hash_password(password: &Secret) -> Result<Secret, AuthError> {
    let salt = SaltString::encode_b64(&random_bytes::<16>()?)
        .map_err(|e| AuthError::Invalid(format!("password salt: {e}")))?;
    Argon2::default()
        .hash_password(password.expose().as_bytes(), &salt)
        .map(|hash| Secret::new(hash.to_string()))
        .map_err(|e| AuthError::Invalid(format!("hashing the password failed: {e}")))
}

/// Whether `password` matches the PHC string `hash`. A malformed hash matches nothing.
pub fn verify_password(password: &Secret, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.expose().as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
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
}
