//! Verifying a compact JWS (an OIDC ID token) against a JSON Web Key Set, with ring: RS256/384/512,
//! PS256/384/512 and ES256/384. `none` and HMAC algorithms are refused.

use base64::Engine;
use ring::signature::{self, UnparsedPublicKey};
use serde::Deserialize;

/// One key of a JWKS (`kty` RSA or EC); other members are ignored.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Jwk {
    #[serde(default)]
    pub(super) kid: Option<String>,
    pub(super) kty: String,
    #[serde(default, rename = "use")]
    pub(super) use_: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

/// A JWKS document.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Jwks {
    pub(super) keys: Vec<Jwk>,
}

/// Why a token did not verify.
#[derive(Debug, thiserror::Error)]
pub(super) enum JwsError {
    /// Not three base64url parts with a JSON header and payload.
    #[error("the ID token is malformed: {0}")]
    Malformed(&'static str),
    /// The header's algorithm is not one svc accepts.
    #[error("the ID token's algorithm \"{0}\" is not accepted (RS256/384/512, PS256/384/512, ES256/384)")]
    Algorithm(String),
    /// No key of the set has the header's `kid`.
    #[error("the ID token is signed by a key the provider does not publish (kid \"{0}\")")]
    UnknownKey(String),
    /// The signature does not verify.
    #[error("the ID token's signature does not verify with the provider's key \"{0}\"")]
    BadSignature(String),
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
}

fn b64(s: &str) -> Result<Vec<u8>, JwsError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| JwsError::Malformed("a part is not base64url"))
}

/// The `kid` of a token's header (empty when absent), for deciding whether to refetch the keys.
pub(super) fn header_kid(token: &str) -> Result<String, JwsError> {
    let head = token.split('.').next().ok_or(JwsError::Malformed("no header"))?;
    let header: Header =
        serde_json::from_slice(&b64(head)?).map_err(|_| JwsError::Malformed("the header is not JSON"))?;
    Ok(header.kid.unwrap_or_default())
}

/// Verifies `token` with the matching key of `keys` and returns its payload (the claims).
pub(super) fn verify(token: &str, keys: &[Jwk]) -> Result<serde_json::Value, JwsError> {
    let mut parts = token.split('.');
    let (Some(head), Some(body), Some(sig), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwsError::Malformed("expected three dot-separated parts"));
    };
    let header: Header =
        serde_json::from_slice(&b64(head)?).map_err(|_| JwsError::Malformed("the header is not JSON"))?;
    let kid = header.kid.clone().unwrap_or_default();
    let (want_kty, rsa_alg, ec_alg): (
        &str,
        Option<&'static signature::RsaParameters>,
        Option<(&'static signature::EcdsaVerificationAlgorithm, &str)>,
    ) = match header.alg.as_str() {
        "RS256" => ("RSA", Some(&signature::RSA_PKCS1_2048_8192_SHA256), None),
        "RS384" => ("RSA", Some(&signature::RSA_PKCS1_2048_8192_SHA384), None),
        "RS512" => ("RSA", Some(&signature::RSA_PKCS1_2048_8192_SHA512), None),
        "PS256" => ("RSA", Some(&signature::RSA_PSS_2048_8192_SHA256), None),
        "PS384" => ("RSA", Some(&signature::RSA_PSS_2048_8192_SHA384), None),
        "PS512" => ("RSA", Some(&signature::RSA_PSS_2048_8192_SHA512), None),
        "ES256" => ("EC", None, Some((&signature::ECDSA_P256_SHA256_FIXED, "P-256"))),
        "ES384" => ("EC", None, Some((&signature::ECDSA_P384_SHA384_FIXED, "P-384"))),
        other => return Err(JwsError::Algorithm(other.to_owned())),
    };
    let usable = |k: &&Jwk| k.kty == want_kty && k.use_.as_deref().is_none_or(|u| u == "sig");
    let key = match &header.kid {
        Some(kid) => keys.iter().filter(usable).find(|k| k.kid.as_deref() == Some(kid)),
        // Without a kid, only an unambiguous key set will do.
        None => {
            let mut candidates = keys.iter().filter(usable);
            match (candidates.next(), candidates.next()) {
                (Some(k), None) => Some(k),
                _ => None,
            }
        }
    };
    let Some(key) = key else {
        return Err(JwsError::UnknownKey(kid));
    };
    let message = &token.as_bytes()[..head.len() + 1 + body.len()];
    let sig = b64(sig)?;
    let bad = || JwsError::BadSignature(kid.clone());
    if let Some(params) = rsa_alg {
        let (Some(n), Some(e)) = (&key.n, &key.e) else {
            return Err(bad());
        };
        let (n, e) = (b64(n)?, b64(e)?);
        signature::RsaPublicKeyComponents { n: &n, e: &e }
            .verify(params, message, &sig)
            .map_err(|_| bad())?;
    } else if let Some((alg, crv)) = ec_alg {
        let (Some(x), Some(y)) = (&key.x, &key.y) else {
            return Err(bad());
        };
        if key.crv.as_deref() != Some(crv) {
            return Err(bad());
        }
        let mut point = vec![0x04];
        point.extend(b64(x)?);
        point.extend(b64(y)?);
        UnparsedPublicKey::new(alg, &point)
            .verify(message, &sig)
            .map_err(|_| bad())?;
    }
    serde_json::from_slice(&b64(body)?).map_err(|_| JwsError::Malformed("the payload is not JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair};

    fn es256_token(kid: &str, claims: &serde_json::Value) -> (String, Jwk) {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let enc = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let header = enc(serde_json::json!({"alg": "ES256", "kid": kid})
            .to_string()
            .as_bytes());
        let body = enc(claims.to_string().as_bytes());
        let input = format!("{header}.{body}");
        let sig = pair.sign(&rng, input.as_bytes()).unwrap();
        let public = pair.public_key().as_ref();
        let jwk = Jwk {
            kid: Some(kid.into()),
            kty: "EC".into(),
            use_: None,
            n: None,
            e: None,
            crv: Some("P-256".into()),
            x: Some(enc(&public[1..33])),
            y: Some(enc(&public[33..])),
        };
        (format!("{input}.{}", enc(sig.as_ref())), jwk)
    }

    #[test]
    fn verifies_and_refuses() {
        let claims = serde_json::json!({"sub": "alice"});
        let (token, jwk) = es256_token("k1", &claims);
        assert_eq!(verify(&token, std::slice::from_ref(&jwk)).unwrap(), claims);
        let (other, other_jwk) = es256_token("k2", &claims);
        assert!(
            matches!(verify(&other, std::slice::from_ref(&jwk)), Err(JwsError::UnknownKey(k)) if k == "k2")
        );
        // Same kid, another key: the signature fails.
        let mut wrong = other_jwk;
        wrong.kid = Some("k1".into());
        assert!(matches!(verify(&token, &[wrong]), Err(JwsError::BadSignature(_))));
        let none = format!(
            "{}.{}.",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"{}")
        );
        assert!(matches!(verify(&none, &[jwk]), Err(JwsError::Algorithm(_))));
        assert!(matches!(verify("a.b", &[]), Err(JwsError::Malformed(_))));
    }
}
