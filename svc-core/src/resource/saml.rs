//! The `saml` authentication connector (version `v2`): SAML 2.0 single sign-on, mapping
//! assertion attributes to roles.

use serde::{Deserialize, Serialize};

use super::{
    Invalid, Kind, KindResource, Metadata, SigningKeyPair, check_non_empty, check_roles, check_url, invalid,
};

/// A SAML connector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamlConnector {
    /// The connector name.
    pub metadata: Metadata,
    /// Identity provider settings and role mapping.
    pub spec: SamlSpec,
}

/// `spec` of a SAML connector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamlSpec {
    /// Assertion consumer service URL (`https://<proxy>/v1/webapi/saml/acs/<name>`).
    pub acs: String,
    /// Name shown on the login button.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<String>,
    /// The identity provider's metadata XML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_descriptor: Option<String>,
    /// Where to fetch the identity provider's metadata XML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_descriptor_url: Option<String>,
    /// Identity provider issuer, when no entity descriptor is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Identity provider single sign-on URL, when no entity descriptor is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sso: Option<String>,
    /// Identity provider signing certificate (PEM), when no entity descriptor is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// Audience restriction; the ACS URL when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// The service provider's issuer; the ACS URL when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_provider_issuer: Option<String>,
    /// Assertion attributes → roles.
    pub attributes_to_roles: Vec<AttributeRolesMapping>,
    /// The key the connector signs requests with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_key_pair: Option<SigningKeyPair>,
}

/// One `attributes_to_roles` entry: users whose attribute `name` has `value` get `roles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttributeRolesMapping {
    /// Attribute name (for example `groups`).
    pub name: String,
    /// Attribute value (for example `admins`).
    pub value: String,
    /// Roles granted.
    pub roles: Vec<String>,
}

impl SamlConnector {
    pub(super) fn strip_secrets(&mut self) {
        if let Some(pair) = &mut self.spec.signing_key_pair {
            pair.private_key = None;
        }
    }
}

impl KindResource for SamlConnector {
    const KIND: Kind = Kind::Saml;
    type Name = String;
    type Spec = SamlSpec;

    fn from_parts(metadata: Metadata, spec: SamlSpec) -> Result<Self, Invalid> {
        check_url("spec.acs", &spec.acs)?;
        if let Some(url) = &spec.entity_descriptor_url {
            check_url("spec.entity_descriptor_url", url)?;
        }
        if let Some(url) = &spec.sso {
            check_url("spec.sso", url)?;
        }
        if spec.entity_descriptor.is_none() && spec.entity_descriptor_url.is_none() && spec.sso.is_none() {
            return Err(invalid(
                "spec",
                "expected one of entity_descriptor, entity_descriptor_url or sso (with issuer and cert) to locate the identity provider",
            ));
        }
        if spec.attributes_to_roles.is_empty() {
            return Err(invalid(
                "spec.attributes_to_roles",
                "expected at least one mapping",
            ));
        }
        for (i, m) in spec.attributes_to_roles.iter().enumerate() {
            check_non_empty(&format!("spec.attributes_to_roles[{i}].name"), &m.name)?;
            check_non_empty(&format!("spec.attributes_to_roles[{i}].value"), &m.value)?;
            check_roles(&format!("spec.attributes_to_roles[{i}].roles"), &m.roles)?;
        }
        Ok(Self { metadata, spec })
    }

    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn spec(&self) -> &SamlSpec {
        &self.spec
    }
}
