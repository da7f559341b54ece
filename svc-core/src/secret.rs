//! A wrapper for secrets: passwords, proxy credentials, join tokens, private keys.
//!
//! [`Secret`] never shows what it holds in `Debug` or `Display`, so a secret that ends up in a
//! log line, an error or a `{:?}` of a config struct prints `***`. The value is reached only
//! through [`Secret::expose`], which makes every use easy to find in review.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value that must never be printed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret<T = String>(T);

impl<T> Secret<T> {
    /// Wraps a secret value.
    pub fn new(value: T) -> Self {
        Self(value)
    }

    /// The secret value. Call it only where the value is really used (a header, a hash check),
    /// never to print.
    pub fn expose(&self) -> &T {
        &self.0
    }

    /// Unwraps the secret value.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Secret<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Secret)
    }
}

/// Serializes the real value: resources are written to storage and, on an explicit
/// `--with-secrets`, to the administrator. Everything that must not carry the value (default
/// `tctl get`, logs) removes the field before serializing.
impl<T: Serialize> Serialize for Secret<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_printed() {
        let s = Secret::new("hunter2".to_owned());
        assert_eq!(format!("{s:?} {s} {s:#?}"), "*** *** ***");
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Holder {
            password: Secret,
        }
        assert!(!format!("{:?}", Holder { password: s.clone() }).contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn serde_is_transparent() {
        let s: Secret = serde_json::from_str("\"k\"").unwrap();
        assert_eq!(s.expose(), "k");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"k\"");
    }
}
