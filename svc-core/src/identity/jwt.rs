//! [`JwtKey`]: the cluster's key for the JWTs the Proxy Service hands to web apps (header
//! `svc-jwt-assertion`), and [`Jwks`], its public half as a JSON Web Key Set.
//!
//! The key is ECDSA P-256 (`ES256`, RFC 7518 §3.4), signed with ring. It is kept by the Auth
//! Service like the CAs (`/authorities/jwt/<cluster>` in the backend); the private key never
//! leaves the Auth Service and is held in [`Secret`]. Apps verify with the public key from
//! `/.well-known/jwks.json` on the proxy's web port, picking it by `kid`.

use std::fmt;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::IdentityError;
use crate::Secret;
use crate::backend::{Backend, Item, Key, Revision};

const STORED_VERSION: u8 = 1;

/// The claims of an app JWT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppJwtClaims {
    /// The user name (same as `username`).
    pub sub: String,
    /// The user name.
    pub username: String,
    /// The user's roles.
    pub roles: Vec<String>,
    /// The cluster name.
    pub iss: String,
    /// The app's URI (its `uri` in the Application Service's configuration).
    pub aud: String,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// Not before, seconds since the Unix epoch (= `iat`).
    pub nbf: u64,
}

/// One public key of a [`Jwks`] (RFC 7517 §4, EC P-256).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    /// `EC`.
    pub kty: String,
    /// `P-256`.
    pub crv: String,
    /// The X coordinate, base64url.
    pub x: String,
    /// The Y coordinate, base64url.
    pub y: String,
    /// The key ID, as in the JWT header.
    pub kid: String,
    /// `ES256`.
    pub alg: String,
    /// `sig`.
    #[serde(rename = "use")]
    pub use_: String,
}

/// A JSON Web Key Set: what `/.well-known/jwks.json` serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwks {
    /// The keys.
    pub keys: Vec<Jwk>,
}

/// Why a JWT did not verify.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum JwtError {
    /// Not three base64url parts, or undecodable JSON.
    #[error("malformed JWT: {0}")]
    Malformed(String),
    /// No key in the set has the JWT's `kid`.
    #[error("no key with kid {0:?}")]
    UnknownKey(String),
    /// The signature does not verify.
    #[error("the JWT signature does not verify")]
    BadSignature,
    /// `exp` is past.
    #[error("the JWT expired")]
    Expired,
}

/// The cluster's JWT signing key. `Debug` shows the key ID only.
pub struct JwtKey {
    cluster: String,
    kid: String,
    pkcs8: Secret<Vec<u8>>,
    pair: Secret<EcdsaKeyPair>,
}

impl fmt::Debug for JwtKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtKey")
            .field("cluster", &self.cluster)
            .field("kid", &self.kid)
            .field("key", &self.pair)
            .finish()
    }
}

/// Stored form (JSON). Not `Debug`: it holds the private key.
#[derive(Serialize, Deserialize)]
struct StoredJwtKey {
    version: u8,
    cluster: String,
    pkcs8_pem: String,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

impl JwtKey {
    /// A new key for `cluster`.
    pub fn generate(cluster: &str) -> Result<Self, IdentityError> {
        let pair = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        Self::from_pkcs8(cluster.to_owned(), pair.serialize_der())
    }

    fn from_pkcs8(cluster: String, pkcs8: Vec<u8>) -> Result<Self, IdentityError> {
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8, &SystemRandom::new())
            .map_err(|_| IdentityError::MalformedStored("JWT key: not a P-256 PKCS#8 key".into()))?;
        let kid = B64.encode(&Sha256::digest(pair.public_key().as_ref())[..16]);
        Ok(Self {
            cluster,
            kid,
            pkcs8: Secret::new(pkcs8),
            pair: Secret::new(pair),
        })
    }

    /// The key ID (`kid`): base64url of the first 16 bytes of the public key's SHA-256.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a one-key [`Jwks`].
    pub fn jwks(&self) -> Jwks {
        // ring's public key is the uncompressed point 0x04 || X || Y.
        let point = self.pair.expose().public_key().as_ref();
        let (x, y) = point
            .get(1..)
            .unwrap_or_default()
            .split_at(point.len().saturating_sub(1) / 2);
        Jwks {
            keys: vec![Jwk {
                kty: "EC".into(),
                crv: "P-256".into(),
                x: B64.encode(x),
                y: B64.encode(y),
                kid: self.kid.clone(),
                alg: "ES256".into(),
                use_: "sig".into(),
            }],
        }
    }

    /// Signs `claims` as a compact JWS (`ES256`, with this key's `kid`).
    pub fn sign(&self, claims: &AppJwtClaims) -> Result<String, IdentityError> {
        let header = serde_json::json!({ "alg": "ES256", "typ": "JWT", "kid": self.kid });
        let payload = serde_json::to_vec(claims).map_err(|e| IdentityError::KeyGeneration(e.to_string()))?;
        let input = format!("{}.{}", B64.encode(header.to_string()), B64.encode(payload));
        let sig = self
            .pair
            .expose()
            .sign(&SystemRandom::new(), input.as_bytes())
            .map_err(|_| IdentityError::KeyGeneration("ECDSA signing failed".into()))?;
        Ok(format!("{input}.{}", B64.encode(sig.as_ref())))
    }

    /// Claims for `username` with `roles` for the app at `aud`, issued `now`, valid for `ttl`.
    pub fn claims(
        &self,
        username: &str,
        roles: &[String],
        aud: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> AppJwtClaims {
        let iat = unix(now);
        AppJwtClaims {
            sub: username.to_owned(),
            username: username.to_owned(),
            roles: roles.to_vec(),
            iss: self.cluster.clone(),
            aud: aud.to_owned(),
            exp: iat + ttl.as_secs(),
            iat,
            nbf: iat,
        }
    }

    /// Where the key lives in the backend: `/authorities/jwt/<cluster>`.
    pub fn backend_key(cluster: &str) -> Key {
        Key::from_segments(["authorities", "jwt", cluster])
    }

    fn to_stored(&self) -> Result<Secret<Vec<u8>>, IdentityError> {
        let stored = StoredJwtKey {
            version: STORED_VERSION,
            cluster: self.cluster.clone(),
            pkcs8_pem: pem::encode(&pem::Pem::new("PRIVATE KEY", self.pkcs8.expose().clone())),
        };
        serde_json::to_vec(&stored)
            .map(Secret::new)
            .map_err(|e| IdentityError::MalformedStored(e.to_string()))
    }

    fn from_stored(bytes: &[u8]) -> Result<Self, IdentityError> {
        let stored: StoredJwtKey =
            serde_json::from_slice(bytes).map_err(|e| IdentityError::MalformedStored(e.to_string()))?;
        if stored.version != STORED_VERSION {
            return Err(IdentityError::MalformedStored(format!(
                "JWT key: expected version {STORED_VERSION}, found {}",
                stored.version
            )));
        }
        let der = pem::parse(&stored.pkcs8_pem)
            .map_err(|_| IdentityError::MalformedStored("JWT key PEM".into()))?;
        Self::from_pkcs8(stored.cluster, der.into_contents())
    }

    /// Stores the key (never replacing one already stored).
    pub async fn save(&self, backend: &dyn Backend) -> Result<Revision, IdentityError> {
        Ok(backend
            .create(Item::new(
                Self::backend_key(&self.cluster),
                self.to_stored()?.into_inner(),
            ))
            .await?)
    }

    /// Loads the key of `cluster`, if one is stored.
    pub async fn load(backend: &dyn Backend, cluster: &str) -> Result<Option<Self>, IdentityError> {
        let Some(item) = backend.get(&Self::backend_key(cluster)).await? else {
            return Ok(None);
        };
        let key = Self::from_stored(&item.value)?;
        if key.cluster != cluster {
            return Err(IdentityError::MalformedStored(format!(
                "expected the JWT key of {cluster}, found that of {}",
                key.cluster
            )));
        }
        Ok(Some(key))
    }
}

impl Jwks {
    /// Verifies a compact ES256 JWT against these keys (by `kid`) and returns its claims when
    /// it has not expired at `now`. Audience and issuer are the caller's to check.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<AppJwtClaims, JwtError> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed("expected three dot-separated parts".into()));
        };
        let decode = |part: &str, what: &str| {
            B64.decode(part)
                .map_err(|e| JwtError::Malformed(format!("{what}: {e}")))
        };
        let header: serde_json::Value = serde_json::from_slice(&decode(h, "header")?)
            .map_err(|e| JwtError::Malformed(format!("header: {e}")))?;
        if header["alg"] != "ES256" {
            return Err(JwtError::Malformed(format!("alg {} is not ES256", header["alg"])));
        }
        let kid = header["kid"].as_str().unwrap_or_default();
        let key = self
            .keys
            .iter()
            .find(|k| k.kid == kid)
            .ok_or_else(|| JwtError::UnknownKey(kid.to_owned()))?;
        let mut point = vec![4u8];
        point.extend(decode(&key.x, "x")?);
        point.extend(decode(&key.y, "y")?);
        ring::signature::UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &point)
            .verify(format!("{h}.{p}").as_bytes(), &decode(s, "signature")?)
            .map_err(|_| JwtError::BadSignature)?;
        let claims: AppJwtClaims = serde_json::from_slice(&decode(p, "claims")?)
            .map_err(|e| JwtError::Malformed(format!("claims: {e}")))?;
        if claims.exp <= unix(now) {
            return Err(JwtError::Expired);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_jwt_verifies_and_tampering_does_not() {
        let key = JwtKey::generate("example.com").unwrap();
        let now = SystemTime::now();
        let claims = key.claims(
            "alice",
            &["access".into()],
            "http://app:8080",
            now,
            Duration::from_secs(60),
        );
        let jwt = key.sign(&claims).unwrap();
        let jwks = key.jwks();
        assert_eq!(jwks.verify(&jwt, now).unwrap(), claims);
        assert_eq!(
            jwks.verify(&jwt, now + Duration::from_secs(61)),
            Err(JwtError::Expired)
        );
        let mut forged = claims.clone();
        forged.username = "admin".into();
        let parts: Vec<&str> = jwt.split('.').collect();
        let swapped = format!(
            "{}.{}.{}",
            parts[0],
            B64.encode(serde_json::to_vec(&forged).unwrap()),
            parts[2]
        );
        assert_eq!(jwks.verify(&swapped, now), Err(JwtError::BadSignature));
        let other = JwtKey::generate("example.com").unwrap();
        assert!(other.jwks().verify(&jwt, now).is_err());
    }

    #[test]
    fn stored_round_trip_and_debug_hides_the_key() {
        let key = JwtKey::generate("example.com").unwrap();
        let back = JwtKey::from_stored(key.to_stored().unwrap().expose()).unwrap();
        assert_eq!(back.jwks(), key.jwks());
        let debug = format!("{key:?}");
        assert!(
            debug.contains("key: ***") && !debug.contains("PRIVATE"),
            "{debug}"
        );
        assert_eq!(format!("{:?}", key.to_stored().unwrap()), "***");
    }
}
