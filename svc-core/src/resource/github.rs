//! The `github` authentication connector (version `v3`): GitHub OAuth, mapping team membership
//! to roles.

use serde::{Deserialize, Serialize};

use super::{
    Invalid, Kind, KindResource, Metadata, SigningKeyPair, check_non_empty, check_roles, check_url, invalid,
};
use crate::Secret;

/// A GitHub connector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GithubConnector {
    /// The connector name (`tsh login --auth=<name>`).
    pub metadata: Metadata,
    /// OAuth settings and role mapping.
    pub spec: GithubSpec,
}

/// `spec` of a GitHub connector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GithubSpec {
    /// OAuth application client ID.
    pub client_id: String,
    /// OAuth application client secret; absent in copies without secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<Secret>,
    /// Where GitHub sends the user back (`https://<proxy>/v1/webapi/github/callback`).
    pub redirect_url: String,
    /// Name shown on the login button.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<String>,
    /// GitHub Enterprise web address; github.com when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
    /// GitHub Enterprise API address; api.github.com when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_endpoint_url: Option<String>,
    /// Team membership → roles.
    pub teams_to_roles: Vec<TeamRolesMapping>,
    /// The key the connector signs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_key_pair: Option<SigningKeyPair>,
}

/// One `teams_to_roles` entry: members of `organization`/`team` get `roles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamRolesMapping {
    /// GitHub organization.
    pub organization: String,
    /// Team within the organization.
    pub team: String,
    /// Roles granted.
    pub roles: Vec<String>,
}

impl GithubConnector {
    pub(super) fn strip_secrets(&mut self) {
        self.spec.client_secret = None;
        if let Some(pair) = &mut self.spec.signing_key_pair {
            pair.private_key = None;
        }
    }
}

impl KindResource for GithubConnector {
    const KIND: Kind = Kind::Github;
    type Name = String;
    type Spec = GithubSpec;

    fn from_parts(metadata: Metadata, spec: GithubSpec) -> Result<Self, Invalid> {
        check_non_empty("spec.client_id", &spec.client_id)?;
        check_url("spec.redirect_url", &spec.redirect_url)?;
        if let Some(url) = &spec.endpoint_url {
            check_url("spec.endpoint_url", url)?;
        }
        if let Some(url) = &spec.api_endpoint_url {
            check_url("spec.api_endpoint_url", url)?;
        }
        if spec.teams_to_roles.is_empty() {
            return Err(invalid("spec.teams_to_roles", "expected at least one mapping"));
        }
        for (i, m) in spec.teams_to_roles.iter().enumerate() {
            check_non_empty(&format!("spec.teams_to_roles[{i}].organization"), &m.organization)?;
            check_non_empty(&format!("spec.teams_to_roles[{i}].team"), &m.team)?;
            check_roles(&format!("spec.teams_to_roles[{i}].roles"), &m.roles)?;
        }
        Ok(Self { metadata, spec })
    }

    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn spec(&self) -> &GithubSpec {
        &self.spec
    }
}
