//! The `oidc` authentication connector (version `v3`): OpenID Connect, mapping ID-token claims
//! to roles.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    Invalid, Kind, KindResource, Metadata, SigningKeyPair, check_non_empty, check_roles, check_url, invalid,
};
use crate::Secret;

/// An OIDC connector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcConnector {
    /// The connector name.
    pub metadata: Metadata,
    /// Provider settings and role mapping.
    pub spec: OidcSpec,
}

/// `spec` of an OIDC connector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSpec {
    /// The provider's issuer URL (its discovery document lives under it).
    pub issuer_url: String,
    /// OAuth client ID.
    pub client_id: String,
    /// OAuth client secret; absent in copies without secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<Secret>,
    /// Callback URLs (`https://<proxy>/v1/webapi/oidc/callback`): one string or a list.
    #[serde(serialize_with = "one_or_many_ser", deserialize_with = "one_or_many_de")]
    pub redirect_url: Vec<String>,
    /// Name shown on the login button.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<String>,
    /// Extra scopes requested besides `openid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scope: Vec<String>,
    /// The `prompt` parameter sent to the provider (for example `select_account`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Claims → roles.
    pub claims_to_roles: Vec<ClaimRolesMapping>,
    /// The key the connector signs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_key_pair: Option<SigningKeyPair>,
}

/// One `claims_to_roles` entry: users whose claim `name` has `value` get `roles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRolesMapping {
    /// Claim name (for example `groups`).
    pub name: String,
    /// Claim value.
    pub value: String,
    /// Roles granted.
    pub roles: Vec<String>,
}

fn one_or_many_ser<S: Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    match v {
        [one] => s.serialize_str(one),
        many => many.serialize(s),
    }
}

fn one_or_many_de<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a URL or a list of URLs")]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(v) => vec![v],
        OneOrMany::Many(v) => v,
    })
}

impl OidcConnector {
    pub(super) fn strip_secrets(&mut self) {
        self.spec.client_secret = None;
        if let Some(pair) = &mut self.spec.signing_key_pair {
            pair.private_key = None;
        }
    }
}

impl KindResource for OidcConnector {
    const KIND: Kind = Kind::Oidc;
    type Name = String;
    type Spec = OidcSpec;

    fn from_parts(metadata: Metadata, spec: OidcSpec) -> Result<Self, Invalid> {
        check_url("spec.issuer_url", &spec.issuer_url)?;
        check_non_empty("spec.client_id", &spec.client_id)?;
        if spec.redirect_url.is_empty() {
            return Err(invalid("spec.redirect_url", "expected at least one URL"));
        }
        for (i, url) in spec.redirect_url.iter().enumerate() {
            check_url(&format!("spec.redirect_url[{i}]"), url)?;
        }
        if spec.claims_to_roles.is_empty() {
            return Err(invalid("spec.claims_to_roles", "expected at least one mapping"));
        }
        for (i, m) in spec.claims_to_roles.iter().enumerate() {
            check_non_empty(&format!("spec.claims_to_roles[{i}].name"), &m.name)?;
            check_non_empty(&format!("spec.claims_to_roles[{i}].value"), &m.value)?;
            check_roles(&format!("spec.claims_to_roles[{i}].roles"), &m.roles)?;
        }
        Ok(Self { metadata, spec })
    }

    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn spec(&self) -> &OidcSpec {
        &self.spec
    }
}
