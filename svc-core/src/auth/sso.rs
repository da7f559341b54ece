//! Single sign-on through the `oidc`, `github` and `saml` connectors: the sign-in requests in
//! flight, the mapping of an identity provider's answer to roles, and the certificates.
//!
//! Data flow: `tsh login --auth=<connector>` → the proxy → the Auth API, which creates an
//! [`SsoRequest`] ([`AuthService::create_sso_request`](super::AuthService::create_sso_request): stored under its random `state` for
//! [`SSO_REQUEST_TTL`], with the nonce, the PKCE verifier, the user's public keys and the
//! loopback address `tsh` listens on) → the identity provider → the proxy's callback → the Auth
//! API takes the request back exactly once ([`AuthService::take_sso_request`](super::AuthService::take_sso_request)), checks the
//! provider's answer (kind-specific, outside this crate for OIDC and GitHub), maps it to roles
//! ([`oidc_roles`], [`github_roles`]) and issues certificates for the stored keys
//! ([`AuthService::issue_sso_certs`](super::AuthService::issue_sso_certs)). A user mapped to no role gets nothing.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{AuthError, Caller, IssuedCerts, LoginRequest, USER_CERT_TTL};
use crate::Secret;
use crate::backend::Key;
use crate::identity::SystemRole;
use crate::rbac::{AccessDenied, Verb};
use crate::resource::{GithubSpec, Kind, OidcSpec, Resource, User};

/// How long a started sign-in may take before its request is forgotten.
pub const SSO_REQUEST_TTL: Duration = Duration::from_secs(10 * 60);

/// The label marking a user created by a single sign-on: `<kind>/<connector>`. Such a user lives
/// as long as its last certificates; a local user of the same name is never replaced.
pub const SSO_USER_LABEL: &str = "svc/connector";

/// A sign-in in flight, stored by the Auth Service until the identity provider sends the user
/// back (or [`SSO_REQUEST_TTL`] passes).
#[derive(Clone, Serialize, Deserialize)]
pub struct SsoRequest {
    /// The random `state` (OAuth) or `RelayState` (SAML) naming the request.
    pub state: String,
    /// `oidc`, `github` or `saml`.
    pub kind: String,
    /// The connector's name.
    pub connector: String,
    /// The OIDC nonce (or the SAML request ID).
    pub nonce: Secret,
    /// The PKCE verifier (OIDC); empty for the other kinds.
    pub pkce_verifier: Secret,
    /// The user's TLS public key, DER SubjectPublicKeyInfo.
    pub tls_public_key: Vec<u8>,
    /// The user's SSH public key (OpenSSH line).
    pub ssh_public_key: String,
    /// Requested certificate lifetime in seconds (0: the default), capped at [`USER_CERT_TTL`].
    pub ttl_seconds: u64,
    /// Where the browser goes back to `tsh` (an `http://` loopback URL, carrying the key the
    /// result is sealed with).
    pub client_redirect_url: Secret,
}

impl std::fmt::Debug for SsoRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SsoRequest")
            .field("kind", &self.kind)
            .field("connector", &self.connector)
            .finish_non_exhaustive()
    }
}

/// Who the identity provider says signed in, and the roles the connector's mapping gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsoIdentity {
    /// The user name certificates are issued for.
    pub username: String,
    /// Roles from the connector's mapping (deduplicated, in mapping order).
    pub roles: Vec<String>,
}

/// A configured connector as the ping shows it (nothing secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorInfo {
    /// `oidc`, `github` or `saml`.
    pub kind: Kind,
    /// The connector name (`tsh login --auth=<name>`).
    pub name: String,
    /// The name shown on a sign-in button.
    pub display: String,
}

fn push_unique(out: &mut Vec<String>, roles: &[String]) {
    for r in roles {
        if !out.contains(r) {
            out.push(r.clone());
        }
    }
}

/// The roles `claims_to_roles` gives for `claims` (a JSON object): an entry matches when its
/// claim is the string `value`, or an array holding it (such as `groups`). Booleans and numbers
/// match their JSON text.
pub fn oidc_roles(spec: &OidcSpec, claims: &serde_json::Value) -> Vec<String> {
    let mut roles = Vec::new();
    for m in &spec.claims_to_roles {
        let matches = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => *s == m.value,
            serde_json::Value::Bool(b) => m.value.parse::<bool>() == Ok(*b),
            serde_json::Value::Number(n) => m.value.parse::<serde_json::Number>().ok().as_ref() == Some(n),
            _ => false,
        };
        let hit = match claims.get(&m.name) {
            Some(serde_json::Value::Array(items)) => items.iter().any(matches),
            Some(v) => matches(v),
            None => false,
        };
        if hit {
            push_unique(&mut roles, &m.roles);
        }
    }
    roles
}

/// The roles `teams_to_roles` gives to a member of `teams` (`(organization, team slug)` pairs;
/// compared without regard to ASCII case, as GitHub does).
pub fn github_roles(spec: &GithubSpec, teams: &[(String, String)]) -> Vec<String> {
    let mut roles = Vec::new();
    for m in &spec.teams_to_roles {
        if teams.iter().any(|(org, team)| {
            org.eq_ignore_ascii_case(&m.organization) && team.eq_ignore_ascii_case(&m.team)
        }) {
            push_unique(&mut roles, &m.roles);
        }
    }
    roles
}

/// What a taken request is replaced with until it expires.
const SPENT: &[u8] = b"spent";

fn request_key(state: &str) -> Key {
    Key::from_segments(["sso_requests", state])
}

fn proxy_only(caller: &Caller, what: &str) -> Result<(), AuthError> {
    if caller.is_host_with(SystemRole::Proxy) {
        Ok(())
    } else {
        Err(AccessDenied {
            verb: Verb::Create,
            resource: what.into(),
        }
        .into())
    }
}

impl super::AuthService {
    /// Stores a started sign-in under its `state` for [`SSO_REQUEST_TTL`]. Proxies only.
    pub async fn create_sso_request(&self, caller: &Caller, req: &SsoRequest) -> Result<(), AuthError> {
        proxy_only(caller, "sso_request")?;
        if req.state.len() < 16 || req.state.contains('/') {
            return Err(AuthError::Invalid("sso request: state is too short".into()));
        }
        let value = serde_json::to_vec(req).map_err(|e| AuthError::Invalid(format!("sso request: {e}")))?;
        let item = crate::backend::Item::new(request_key(&req.state), value)
            .with_expiry(self.now() + SSO_REQUEST_TTL);
        self.backend.create(item).await?;
        Ok(())
    }

    /// Takes the sign-in named `state` out of storage: a second callback with the same state,
    /// an expired one or a made-up one is refused ([`AuthError::SsoRefused`]). Proxies only.
    pub async fn take_sso_request(&self, caller: &Caller, state: &str) -> Result<SsoRequest, AuthError> {
        proxy_only(caller, "sso_request")?;
        let unknown = || {
            AuthError::SsoRefused(
                "the callback's state names no sign-in in progress (unknown, already used or expired after 10 minutes); run tsh login again".into(),
            )
        };
        if state.is_empty() || state.contains('/') || state.len() > 256 {
            return Err(unknown());
        }
        let key = request_key(state);
        let Some(item) = self.backend.get(&key).await? else {
            return Err(unknown());
        };
        if item.expires.is_some_and(|e| e <= self.now()) {
            return Err(unknown());
        }
        if item.value == SPENT {
            return Err(unknown());
        }
        // Exactly once: only the caller whose swap to the spent marker succeeds gets the request.
        let mut spent = crate::backend::Item::new(key, SPENT.to_vec());
        spent.expires = item.expires;
        match self.backend.compare_and_swap(item.revision, spent).await {
            Ok(_) => {}
            Err(
                crate::backend::BackendError::NotFound { .. }
                | crate::backend::BackendError::RevisionMismatch { .. },
            ) => {
                return Err(unknown());
            }
            Err(e) => return Err(e.into()),
        }
        serde_json::from_slice(&item.value).map_err(|e| AuthError::Corrupt {
            what: "sso request",
            reason: e.to_string(),
        })
    }

    /// The connector `kind`/`name` with its secrets (client secret, signing key), for checking a
    /// provider's answer inside the Auth Service. Proxies only (they pass the answer on).
    pub async fn sso_connector(
        &self,
        caller: &Caller,
        kind: Kind,
        name: &str,
    ) -> Result<Resource, AuthError> {
        proxy_only(caller, "sso_request")?;
        if !matches!(kind, Kind::Oidc | Kind::Github | Kind::Saml) {
            return Err(AuthError::Invalid(format!(
                "{kind} is not a sign-in connector kind"
            )));
        }
        self.store()
            .get(kind, name)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("{kind} connector \"{name}\"")))
    }

    /// The configured sign-in connectors, without secrets, in kind then name order.
    pub async fn sso_connectors(&self) -> Result<Vec<ConnectorInfo>, AuthError> {
        let mut out = Vec::new();
        for kind in [Kind::Github, Kind::Oidc, Kind::Saml] {
            for r in self.store().list(kind).await? {
                let display = match &r {
                    Resource::Oidc(c) => c.spec.display.clone(),
                    Resource::Github(c) => c.spec.display.clone(),
                    Resource::Saml(c) => c.spec.display.clone(),
                    _ => None,
                };
                out.push(ConnectorInfo {
                    kind,
                    name: r.name().to_owned(),
                    display: display.unwrap_or_else(|| r.name().to_owned()),
                });
            }
        }
        Ok(out)
    }

    /// Issues certificates for the keys stored in `req` to the user `who` names, with the roles
    /// the mapping gave. The user is stored (labelled [`SSO_USER_LABEL`], expiring with the
    /// certificates) so that the certificates stay valid while it exists and a lock or a
    /// deletion revokes them; a local user of the same name is never replaced. Refused, with
    /// nothing issued, when the mapping gave no role. Proxies only.
    pub async fn issue_sso_certs(
        &self,
        caller: &Caller,
        req: &SsoRequest,
        who: &SsoIdentity,
    ) -> Result<IssuedCerts, AuthError> {
        proxy_only(caller, "user_session")?;
        let via = format!("{}/{}", req.kind, req.connector);
        if who.roles.is_empty() {
            return Err(AuthError::SsoRefused(format!(
                "user \"{}\" is mapped to no role by the {via} connector's mapping; ask an administrator to map one of their groups or teams to a role",
                who.username
            )));
        }
        let ttl = match req.ttl_seconds {
            0 => USER_CERT_TTL,
            s => Duration::from_secs(s).min(USER_CERT_TTL),
        };
        let now = self.now();
        let mut user = User::new(who.username.clone(), who.roles.clone());
        user.metadata.labels.insert(SSO_USER_LABEL.into(), via.clone());
        user.metadata.expires = Some(time::OffsetDateTime::from(now + ttl));
        let resource = Resource::User(user.clone());
        // Validate the name like any other user's.
        crate::resource::parse_resource(&resource.to_json()?)
            .map_err(|e| AuthError::SsoRefused(format!("user name \"{}\": {e}", who.username)))?;
        match self.store().get_item(Kind::User, &who.username).await? {
            None => {
                self.store().create(&resource).await?;
            }
            Some(item) => {
                let Resource::User(existing) = super::store::decode(&item)? else {
                    return Err(AuthError::Corrupt {
                        what: "user",
                        reason: "not a user".into(),
                    });
                };
                if !existing.metadata.labels.contains_key(SSO_USER_LABEL) {
                    return Err(AuthError::SsoRefused(format!(
                        "a local user named \"{}\" exists; single sign-on does not replace local users",
                        who.username
                    )));
                }
                // Keep the later expiry, so an earlier session's certificates stay valid.
                if let (Some(old), Some(new)) = (existing.metadata.expires, user.metadata.expires)
                    && old > new
                {
                    user.metadata.expires = Some(old);
                }
                self.store()
                    .swap(item.revision, &Resource::User(user.clone()))
                    .await?;
            }
        }
        if let Some(refusal) = self.user_revoked(&who.username).await? {
            return Err(AuthError::Revoked(refusal));
        }
        let ssh_public_key = ssh_key::PublicKey::from_openssh(&req.ssh_public_key)
            .map_err(|e| AuthError::Invalid(format!("ssh_public_key: {e}")))?;
        let login = LoginRequest {
            username: who.username.clone(),
            password: Secret::default(),
            tls_public_key: req.tls_public_key.clone(),
            ssh_public_key,
            ttl: Some(ttl),
            source: None,
        };
        self.issue_user_certs(user, &login).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{ClaimRolesMapping, TeamRolesMapping};

    fn oidc(maps: &[(&str, &str, &[&str])]) -> OidcSpec {
        OidcSpec {
            issuer_url: "https://idp.example".into(),
            client_id: "svc".into(),
            client_secret: None,
            redirect_url: vec!["https://proxy.example/v1/webapi/oidc/callback".into()],
            display: None,
            scope: vec![],
            prompt: None,
            claims_to_roles: maps
                .iter()
                .map(|(n, v, r)| ClaimRolesMapping {
                    name: (*n).into(),
                    value: (*v).into(),
                    roles: r.iter().map(|s| (*s).to_string()).collect(),
                })
                .collect(),
            signing_key_pair: None,
        }
    }

    #[test]
    fn claims_map_strings_and_arrays() {
        let spec = oidc(&[
            ("groups", "ops", &["access", "editor"]),
            ("groups", "dev", &["access"]),
            ("email_verified", "true", &["auditor"]),
        ]);
        let claims = serde_json::json!({"groups": ["dev", "ops"], "email_verified": true});
        assert_eq!(oidc_roles(&spec, &claims), ["access", "editor", "auditor"]);
        let claims = serde_json::json!({"groups": "dev"});
        assert_eq!(oidc_roles(&spec, &claims), ["access"]);
        assert!(oidc_roles(&spec, &serde_json::json!({"groups": ["qa"]})).is_empty());
        assert!(oidc_roles(&spec, &serde_json::json!({"groups": {"ops": 1}})).is_empty());
    }

    #[test]
    fn teams_map_org_and_team() {
        let spec = GithubSpec {
            client_id: "id".into(),
            client_secret: None,
            redirect_url: "https://proxy.example/v1/webapi/github/callback".into(),
            display: None,
            endpoint_url: None,
            api_endpoint_url: None,
            teams_to_roles: vec![TeamRolesMapping {
                organization: "acme".into(),
                team: "sre".into(),
                roles: vec!["access".into()],
            }],
            signing_key_pair: None,
        };
        assert_eq!(github_roles(&spec, &[("ACME".into(), "sre".into())]), ["access"]);
        assert!(github_roles(&spec, &[("other".into(), "sre".into())]).is_empty());
        assert!(github_roles(&spec, &[("acme".into(), "dev".into())]).is_empty());
    }
}
