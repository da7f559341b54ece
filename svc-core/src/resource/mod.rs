//! Dynamic resources: what `tctl create` reads, the Auth Service stores and `tctl get` prints.
//!
//! Data flow: text (YAML, possibly several `---` documents, or JSON) → [`parse_resources`] →
//! typed [`Resource`] values (validated; every error names the document and the field path) →
//! the Auth Service (RBAC by [`Kind`], compare-and-swap on [`Revision`]) → storage and back out
//! through [`Resource::to_yaml`] / [`Resource::to_json`], with [`Resource::without_secrets`] unless
//! the caller asked for secrets.
//!
//! Every resource has the same envelope: `kind`, `version`, `metadata` ([`Metadata`]) and `spec`.
//! Parsing is strict: unknown fields, unknown kinds, other versions and invalid values are errors.
//! Each kind lives in its own file.

mod github;
mod lock;
mod maintenance_config;
mod oidc;
mod role;
mod saml;
mod token;
mod user;

use std::{collections::BTreeMap, fmt, str::FromStr, time::SystemTime};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de::DeserializeOwned};
use time::OffsetDateTime;

pub use github::{GithubConnector, GithubSpec, TeamRolesMapping};
pub use lock::{Lock, LockSpec, LockTarget};
pub use maintenance_config::{
    CLUSTER_MAINTENANCE_CONFIG_NAME, ClusterMaintenanceConfig, MaintenanceConfigSpec,
};
pub use oidc::{ClaimRolesMapping, OidcConnector, OidcSpec};
pub use role::{LabelSelector, LabelValues, Role, RoleConditions, RoleSpec, Rule};
pub use saml::{AttributeRolesMapping, SamlConnector, SamlSpec};
pub use token::{JoinMethod, JoinRole, Token, TokenSpec};
pub use user::{LOGINS_TRAIT, User, UserSpec};

use crate::Secret;

/// What a join token's name (its secret value) reads as in a copy without secrets.
pub const REDACTED_TOKEN_NAME: &str = "***";

/// The kind of a resource, as written in its `kind` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Kind {
    /// `role`
    Role,
    /// `cluster_maintenance_config`
    ClusterMaintenanceConfig,
    /// `user`
    User,
    /// `github` (authentication connector)
    Github,
    /// `saml` (authentication connector)
    Saml,
    /// `oidc` (authentication connector)
    Oidc,
    /// `token` (join token)
    Token,
    /// `lock` (a locked user or node)
    Lock,
}

impl Kind {
    /// Every kind, in the order error messages list them.
    pub const ALL: [Kind; 8] = [
        Kind::Role,
        Kind::ClusterMaintenanceConfig,
        Kind::User,
        Kind::Github,
        Kind::Saml,
        Kind::Oidc,
        Kind::Token,
        Kind::Lock,
    ];

    /// The name written in `kind` and used in RBAC rules.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Role => "role",
            Kind::ClusterMaintenanceConfig => "cluster_maintenance_config",
            Kind::User => "user",
            Kind::Github => "github",
            Kind::Saml => "saml",
            Kind::Oidc => "oidc",
            Kind::Token => "token",
            Kind::Lock => "lock",
        }
    }

    /// The only `version` this kind accepts.
    pub const fn version(self) -> &'static str {
        match self {
            Kind::Role => "v7",
            Kind::ClusterMaintenanceConfig => "v1",
            Kind::User | Kind::Saml | Kind::Token | Kind::Lock => "v2",
            Kind::Github | Kind::Oidc => "v3",
        }
    }

    fn list() -> String {
        Kind::ALL
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for Kind {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl FromStr for Kind {
    type Err = ResourceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| ResourceError::Field {
                document: None,
                path: "kind".into(),
                message: format!("unknown resource kind \"{s}\", expected one of: {}", Kind::list()),
            })
    }
}

/// A reference to resources as `tctl get` takes it: `<kind>` (all of that kind) or
/// `<kind>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceRef {
    /// The kind.
    pub kind: Kind,
    /// The name; `None` means every resource of the kind.
    pub name: Option<String>,
}

impl FromStr for ResourceRef {
    type Err = ResourceError;

    /// Parses `role`, `role/editor` or `cluster_maintenance_config/cluster-maintenance-config`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, name) = match s.split_once('/') {
            Some((kind, name)) => (kind, Some(name)),
            None => (s, None),
        };
        let kind: Kind = kind.parse()?;
        match name {
            Some(name) if name.is_empty() || name.contains(|c: char| c == '/' || c.is_whitespace()) => {
                Err(ResourceError::Field {
                    document: None,
                    path: "name".into(),
                    message: format!("expected <kind> or <kind>/<name> with a non-empty name, got \"{s}\""),
                })
            }
            name => Ok(Self {
                kind,
                name: name.map(str::to_owned),
            }),
        }
    }
}

/// `<kind>` or `<kind>/<name>`. A join token's name is its secret value and is redacted.
impl fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.name, self.kind) {
            (None, kind) => write!(f, "{kind}"),
            (Some(_), Kind::Token) => write!(f, "token/***"),
            (Some(name), kind) => write!(f, "{kind}/{name}"),
        }
    }
}

/// An opaque revision for compare-and-swap: the Auth Service sets it on every write, and an
/// update that carries a stale revision is refused. Written as a string or a non-negative integer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Revision(String);

impl Revision {
    /// Wraps a revision string.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The revision as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<u64> for Revision {
    fn from(value: u64) -> Self {
        Self(value.to_string())
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Revision {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Revision {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Revision;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a revision string or a non-negative integer")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Revision, E> {
                Ok(Revision::new(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Revision, E> {
                Ok(Revision::from(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Revision, E> {
                u64::try_from(v)
                    .map(Revision::from)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// The common `metadata` of every resource.
///
/// `N` is the name's type: a plain `String`, except for join tokens whose name is the secret
/// token value and is held in a [`Secret`].
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata<N = String> {
    /// The resource's name, unique per kind.
    pub name: N,
    /// Free-form description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Labels, used by RBAC label selectors.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// When the resource expires (RFC 3339).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub expires: Option<OffsetDateTime>,
    /// The stored revision, for compare-and-swap; set by the Auth Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<Revision>,
}

impl<N> Metadata<N> {
    /// Metadata with only a name.
    pub fn new(name: impl Into<N>) -> Self {
        Self {
            name: name.into(),
            description: None,
            labels: BTreeMap::new(),
            expires: None,
            revision: None,
        }
    }

    /// Whether the resource has expired at `now` (expiry at or before `now`).
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires.is_some_and(|e| e <= OffsetDateTime::from(now))
    }
}

/// `spec.signing_key_pair` of an authentication connector: the key the connector signs with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKeyPair {
    /// PEM private key; absent in copies made by [`Resource::without_secrets`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<Secret>,
    /// PEM certificate (public).
    pub cert: String,
}

/// Why resource text could not be turned into resources (or back). Messages name the document
/// (when the input has several) and the field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// A field is missing, unknown or invalid.
    #[error("{}{}{message}", DocPrefix(*.document), PathPrefix(path))]
    Field {
        /// 1-based document number, when the input holds several documents.
        document: Option<usize>,
        /// The field path, such as `spec.agent_upgrades.weekdays[0]`; empty for the document root.
        path: String,
        /// What was expected and what was found.
        message: String,
    },
    /// The text is not valid YAML or JSON.
    #[error("{}invalid {format}: {message}", DocPrefix(*.document))]
    Syntax {
        /// 1-based document number, when known and the input holds several documents.
        document: Option<usize>,
        /// `YAML` or `JSON`.
        format: &'static str,
        /// The parser's message, with its line and column.
        message: String,
    },
    /// The input holds no resource at all.
    #[error("no resource found: the input is empty")]
    Empty,
    /// Exactly one resource was expected.
    #[error("expected exactly one resource, found {0}")]
    NotOne(usize),
    /// A resource could not be serialized.
    #[error("serializing resource: {0}")]
    Serialize(String),
}

struct DocPrefix(Option<usize>);

impl fmt::Display for DocPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => write!(f, "document {n}: "),
            None => Ok(()),
        }
    }
}

struct PathPrefix<'a>(&'a str);

impl fmt::Display for PathPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, "{}: ", self.0)
        }
    }
}

/// An error found while validating a decoded resource: (field path, message).
pub(crate) type Invalid = (String, String);

pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Invalid {
    (path.into(), message.into())
}

/// Checks that a URL field is an absolute http(s) URL.
pub(crate) fn check_url(path: &str, value: &str) -> Result<(), Invalid> {
    let rest = value
        .strip_prefix("https://")
        .or_else(|| value.strip_prefix("http://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') && !value.contains(char::is_whitespace) => {
            Ok(())
        }
        _ => Err(invalid(
            path,
            format!("expected an http:// or https:// URL, got \"{value}\""),
        )),
    }
}

/// Checks that a list of role names is non-empty and has no empty names.
pub(crate) fn check_roles(path: &str, roles: &[String]) -> Result<(), Invalid> {
    if roles.is_empty() {
        return Err(invalid(path, "expected at least one role"));
    }
    match roles.iter().position(|r| r.trim().is_empty()) {
        Some(i) => Err(invalid(
            format!("{path}[{i}]"),
            "expected a role name, got an empty string",
        )),
        None => Ok(()),
    }
}

/// Checks that a string field is not empty.
pub(crate) fn check_non_empty(path: &str, value: &str) -> Result<(), Invalid> {
    if value.trim().is_empty() {
        Err(invalid(path, "expected a non-empty value"))
    } else {
        Ok(())
    }
}

/// The name of a resource as a string, whatever type holds it.
pub(crate) trait ResourceName {
    fn as_name(&self) -> &str;
}

impl ResourceName for String {
    fn as_name(&self) -> &str {
        self
    }
}

impl ResourceName for Secret {
    fn as_name(&self) -> &str {
        self.expose()
    }
}

/// What each kind's file provides to the shared envelope code.
pub(crate) trait KindResource: Sized {
    const KIND: Kind;
    type Name: ResourceName + Serialize + DeserializeOwned;
    type Spec: Serialize + DeserializeOwned;

    /// Builds the resource from a decoded envelope, checking what serde alone cannot.
    fn from_parts(metadata: Metadata<Self::Name>, spec: Self::Spec) -> Result<Self, Invalid>;
    fn metadata(&self) -> &Metadata<Self::Name>;
    fn spec(&self) -> &Self::Spec;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireIn<N, S> {
    #[allow(dead_code)] // Read before decoding to pick the type; kept so it is not an unknown field.
    kind: String,
    version: String,
    metadata: Metadata<N>,
    spec: S,
}

#[derive(Serialize)]
struct WireOut<'a, N, S> {
    kind: &'static str,
    version: &'static str,
    metadata: &'a Metadata<N>,
    spec: &'a S,
}

fn serialize_kind<T: KindResource, S: Serializer>(r: &T, serializer: S) -> Result<S::Ok, S::Error> {
    WireOut {
        kind: T::KIND.as_str(),
        version: T::KIND.version(),
        metadata: r.metadata(),
        spec: r.spec(),
    }
    .serialize(serializer)
}

fn decode_kind<T: KindResource>(value: serde_yaml_ng::Value) -> Result<T, Invalid> {
    let wire: WireIn<T::Name, T::Spec> = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        (path, e.inner().to_string())
    })?;
    if wire.version != T::KIND.version() {
        return Err(invalid(
            "version",
            format!(
                "unsupported {} version \"{}\", expected one of: {}",
                T::KIND,
                wire.version,
                T::KIND.version()
            ),
        ));
    }
    let name = wire.metadata.name.as_name();
    if name.is_empty() || name.contains(|c: char| c == '/' || c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            "metadata.name",
            "expected a non-empty name without '/', white space or control characters",
        ));
    }
    T::from_parts(wire.metadata, wire.spec)
}

/// Any resource.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resource {
    /// A role (`role`).
    Role(Role),
    /// The cluster maintenance configuration singleton (`cluster_maintenance_config`).
    ClusterMaintenanceConfig(ClusterMaintenanceConfig),
    /// A local user (`user`).
    User(User),
    /// A GitHub connector (`github`).
    Github(GithubConnector),
    /// A SAML connector (`saml`).
    Saml(SamlConnector),
    /// An OIDC connector (`oidc`).
    Oidc(OidcConnector),
    /// A join token (`token`).
    Token(Token),
    /// A lock on a user or a node (`lock`).
    Lock(Lock),
}

macro_rules! each_kind {
    ($value:expr, $r:ident => $body:expr) => {
        match $value {
            Resource::Role($r) => $body,
            Resource::ClusterMaintenanceConfig($r) => $body,
            Resource::User($r) => $body,
            Resource::Github($r) => $body,
            Resource::Saml($r) => $body,
            Resource::Oidc($r) => $body,
            Resource::Token($r) => $body,
            Resource::Lock($r) => $body,
        }
    };
}

/// A view of the metadata fields that do not depend on the name's type.
macro_rules! meta_field {
    ($value:expr, $field:ident) => {
        match $value {
            Resource::Token(t) => &t.metadata.$field,
            Resource::Role(r) => &r.metadata.$field,
            Resource::ClusterMaintenanceConfig(r) => &r.metadata.$field,
            Resource::User(r) => &r.metadata.$field,
            Resource::Github(r) => &r.metadata.$field,
            Resource::Saml(r) => &r.metadata.$field,
            Resource::Oidc(r) => &r.metadata.$field,
            Resource::Lock(r) => &r.metadata.$field,
        }
    };
}

impl Resource {
    /// The resource's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Resource::Role(_) => Kind::Role,
            Resource::ClusterMaintenanceConfig(_) => Kind::ClusterMaintenanceConfig,
            Resource::User(_) => Kind::User,
            Resource::Github(_) => Kind::Github,
            Resource::Saml(_) => Kind::Saml,
            Resource::Oidc(_) => Kind::Oidc,
            Resource::Token(_) => Kind::Token,
            Resource::Lock(_) => Kind::Lock,
        }
    }

    /// The resource's name: the storage key within its kind.
    ///
    /// For a join token this is the secret token value: use it as a key, never print it (the
    /// [`Display`](fmt::Display) of a [`Resource`] redacts it).
    pub fn name(&self) -> &str {
        each_kind!(self, r => r.metadata.name.as_name())
    }

    /// The stored revision, if any.
    pub fn revision(&self) -> Option<&Revision> {
        meta_field!(self, revision).as_ref()
    }

    /// Sets the revision (the Auth Service does on every write).
    pub fn set_revision(&mut self, revision: Option<Revision>) {
        each_kind!(self, r => r.metadata.revision = revision)
    }

    /// The resource's labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        meta_field!(self, labels)
    }

    /// The resource's expiry, if any.
    pub fn expires(&self) -> Option<OffsetDateTime> {
        *meta_field!(self, expires)
    }

    /// Whether the resource has expired at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires().is_some_and(|e| e <= OffsetDateTime::from(now))
    }

    /// A copy with every secret removed: connector client secrets and signing private keys,
    /// and a join token's name (its secret value), replaced by [`REDACTED_TOKEN_NAME`]. This is
    /// what `tctl get` prints without `--with-secrets`, and all a caller who may only `list`
    /// tokens ever gets.
    pub fn without_secrets(&self) -> Resource {
        let mut copy = self.clone();
        match &mut copy {
            Resource::Github(c) => c.strip_secrets(),
            Resource::Saml(c) => c.strip_secrets(),
            Resource::Oidc(c) => c.strip_secrets(),
            Resource::Token(t) => t.metadata.name = Secret::new(REDACTED_TOKEN_NAME.to_owned()),
            Resource::Role(_)
            | Resource::ClusterMaintenanceConfig(_)
            | Resource::User(_)
            | Resource::Lock(_) => {}
        }
        copy
    }

    /// The resource as one YAML document (without a leading `---`).
    pub fn to_yaml(&self) -> Result<String, ResourceError> {
        serde_yaml_ng::to_string(self).map_err(|e| ResourceError::Serialize(e.to_string()))
    }

    /// The resource as pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, ResourceError> {
        serde_json::to_string_pretty(self).map_err(|e| ResourceError::Serialize(e.to_string()))
    }

    fn decode(kind: Kind, value: serde_yaml_ng::Value) -> Result<Resource, Invalid> {
        Ok(match kind {
            Kind::Role => Resource::Role(decode_kind(value)?),
            Kind::ClusterMaintenanceConfig => {
                Resource::ClusterMaintenanceConfig(decode_kind(maintenance_config::fill_defaults(value))?)
            }
            Kind::User => Resource::User(decode_kind(value)?),
            Kind::Github => Resource::Github(decode_kind(value)?),
            Kind::Saml => Resource::Saml(decode_kind(value)?),
            Kind::Oidc => Resource::Oidc(decode_kind(value)?),
            Kind::Token => Resource::Token(decode_kind(value)?),
            Kind::Lock => Resource::Lock(decode_kind(value)?),
        })
    }
}

/// `kind/name`, with a join token's name redacted.
impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Token(_) => write!(f, "{}/***", self.kind()),
            _ => write!(f, "{}/{}", self.kind(), self.name()),
        }
    }
}

impl Serialize for Resource {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        each_kind!(self, r => serialize_kind(r, serializer))
    }
}

/// Several resources as a multi-document YAML stream (`---` between documents).
pub fn resources_to_yaml(resources: &[Resource]) -> Result<String, ResourceError> {
    let mut out = String::new();
    for (i, r) in resources.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&r.to_yaml()?);
    }
    Ok(out)
}

/// Several resources as a pretty-printed JSON array.
pub fn resources_to_json(resources: &[Resource]) -> Result<String, ResourceError> {
    serde_json::to_string_pretty(resources).map_err(|e| ResourceError::Serialize(e.to_string()))
}

/// Parses one or more resources.
///
/// The format is detected: text whose first non-blank character is `{` or `[` is JSON (one
/// object, or an array of objects); anything else is YAML, possibly several documents separated
/// by `---` (empty documents are skipped). When the input holds several documents, errors say
/// which one (1-based).
pub fn parse_resources(text: &str) -> Result<Vec<Resource>, ResourceError> {
    let documents = split_documents(text)?;
    let numbered = documents.len() > 1;
    let mut out = Vec::with_capacity(documents.len());
    for (index, value) in documents {
        let document = numbered.then_some(index);
        let resource = decode_document(value).map_err(|(path, message)| ResourceError::Field {
            document,
            path,
            message,
        })?;
        out.push(resource);
    }
    if out.is_empty() {
        return Err(ResourceError::Empty);
    }
    Ok(out)
}

/// Parses exactly one resource (as stored by the Auth Service, or given to an API call).
pub fn parse_resource(text: &str) -> Result<Resource, ResourceError> {
    let mut all = parse_resources(text)?;
    match all.len() {
        1 => Ok(all.remove(0)),
        n => Err(ResourceError::NotOne(n)),
    }
}

/// Splits the input into (1-based document number, value) pairs, skipping empty documents.
fn split_documents(text: &str) -> Result<Vec<(usize, serde_yaml_ng::Value)>, ResourceError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| ResourceError::Syntax {
            document: None,
            format: "JSON",
            message: e.to_string(),
        })?;
        let items = match json {
            serde_json::Value::Array(items) => items,
            other => vec![other],
        };
        return items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                // JSON is a subset of the YAML data model (string keys, plain scalars): this
                // conversion cannot lose anything, and one decoder then serves both formats.
                serde_yaml_ng::to_value(item)
                    .map(|v| (i + 1, v))
                    .map_err(|e| ResourceError::Serialize(e.to_string()))
            })
            .collect();
    }
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        // The parser's line number is absolute; the document number only helps past the first.
        let value = serde_yaml_ng::Value::deserialize(doc).map_err(|e| ResourceError::Syntax {
            document: (i > 0).then_some(i + 1),
            format: "YAML",
            message: e.to_string(),
        })?;
        if !value.is_null() {
            out.push((i + 1, value));
        }
    }
    Ok(out)
}

fn decode_document(value: serde_yaml_ng::Value) -> Result<Resource, Invalid> {
    if !value.is_mapping() {
        return Err(invalid(
            "",
            "expected a resource (a mapping with kind, version, metadata and spec)",
        ));
    }
    let kind = match value.get("kind") {
        None => {
            return Err(invalid(
                "kind",
                format!("missing field, expected one of: {}", Kind::list()),
            ));
        }
        Some(k) => match k.as_str() {
            Some(k) => k,
            None => {
                return Err(invalid(
                    "kind",
                    format!("expected a string, one of: {}", Kind::list()),
                ));
            }
        },
    };
    let kind = Kind::from_str(kind).map_err(|e| match e {
        ResourceError::Field { path, message, .. } => (path, message),
        other => invalid("kind", other.to_string()),
    })?;
    Resource::decode(kind, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str = "kind: role\nversion: v7\nmetadata:\n  name: maint\nspec:\n  allow:\n    rules:\n    - resources: [cluster_maintenance_config]\n      verbs: [create, read, update, delete]\n";

    #[test]
    fn single_document_errors_have_no_document_number() {
        let err = parse_resources(&ROLE.replace("v7", "v6")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "version: unsupported role version \"v6\", expected one of: v7"
        );
    }

    #[test]
    fn multi_document_errors_name_the_document() {
        let text = format!("{ROLE}---\n{}", ROLE.replace("create", "frobnicate"));
        let err = parse_resources(&text).unwrap_err().to_string();
        assert!(
            err.starts_with("document 2: spec.allow.rules[0].verbs[0]: unknown verb \"frobnicate\""),
            "{err}"
        );
    }

    #[test]
    fn empty_documents_are_skipped_but_empty_input_is_an_error() {
        let text = format!("---\n{ROLE}---\n");
        assert_eq!(parse_resources(&text).unwrap().len(), 1);
        assert_eq!(parse_resources("").unwrap_err(), ResourceError::Empty);
        assert_eq!(parse_resources("# nothing\n").unwrap_err(), ResourceError::Empty);
    }

    #[test]
    fn json_object_and_array() {
        let r = parse_resource(ROLE).unwrap();
        let json = r.to_json().unwrap();
        assert_eq!(parse_resource(&json).unwrap(), r);
        let list = resources_to_json(&[r.clone(), r.clone()]).unwrap();
        assert_eq!(parse_resources(&list).unwrap(), vec![r.clone(), r]);
        let err = parse_resources("{\"kind\": ").unwrap_err().to_string();
        assert!(err.starts_with("invalid JSON: "), "{err}");
    }

    #[test]
    fn kind_errors() {
        let err = parse_resources("version: v7\nmetadata: {name: a}\nspec: {}\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "kind: missing field, expected one of: role, cluster_maintenance_config, user, github, saml, oidc, token, lock"
        );
        let err = parse_resources("kind: node\n").unwrap_err().to_string();
        assert!(
            err.starts_with("kind: unknown resource kind \"node\", expected one of: role,"),
            "{err}"
        );
        let err = parse_resources("- a\n- b\n").unwrap_err().to_string();
        assert_eq!(
            err,
            "expected a resource (a mapping with kind, version, metadata and spec)"
        );
    }

    #[test]
    fn revision_accepts_string_or_integer() {
        let r = parse_resource(&ROLE.replace("name: maint", "name: maint\n  revision: 42")).unwrap();
        assert_eq!(r.revision(), Some(&Revision::from(42)));
        let r = parse_resource(&ROLE.replace("name: maint", "name: maint\n  revision: \"abc\"")).unwrap();
        assert_eq!(r.revision().map(Revision::as_str), Some("abc"));
        let err = parse_resources(&ROLE.replace("name: maint", "name: maint\n  revision: -1")).unwrap_err();
        assert!(
            err.to_string().starts_with("metadata.revision: invalid value"),
            "{err}"
        );
        let mut r = r;
        r.set_revision(None);
        assert_eq!(r.revision(), None);
    }

    #[test]
    fn expiry() {
        let r = parse_resource(&ROLE.replace("name: maint", "name: maint\n  expires: 2030-01-01T00:00:00Z"))
            .unwrap();
        let at = |s: i64| SystemTime::from(OffsetDateTime::from_unix_timestamp(s).unwrap());
        assert!(!r.is_expired(at(1_893_455_999)));
        assert!(r.is_expired(at(1_893_456_000)));
        let err =
            parse_resources(&ROLE.replace("name: maint", "name: maint\n  expires: tomorrow")).unwrap_err();
        assert!(err.to_string().starts_with("metadata.expires: "), "{err}");
    }

    #[test]
    fn resource_refs() {
        let r: ResourceRef = "cluster_maintenance_config/cluster-maintenance-config"
            .parse()
            .unwrap();
        assert_eq!(r.kind, Kind::ClusterMaintenanceConfig);
        assert_eq!(r.name.as_deref(), Some("cluster-maintenance-config"));
        assert_eq!(
            r.to_string(),
            "cluster_maintenance_config/cluster-maintenance-config"
        );
        let all: ResourceRef = "github".parse().unwrap();
        assert_eq!((all.kind, all.name), (Kind::Github, None));
        let token: ResourceRef = "token/s3cret".parse().unwrap();
        assert_eq!(token.to_string(), "token/***");
        assert!(
            "roles/editor"
                .parse::<ResourceRef>()
                .unwrap_err()
                .to_string()
                .starts_with("kind: unknown")
        );
        assert_eq!(
            "role/".parse::<ResourceRef>().unwrap_err().to_string(),
            "name: expected <kind> or <kind>/<name> with a non-empty name, got \"role/\""
        );
    }

    proptest::proptest! {
        #[test]
        fn maintenance_config_round_trips(hour in 0u8..24, days in proptest::collection::vec(0u8..7, 0..9)) {
            let window = crate::maintenance::AgentUpgradeWindow::new(
                hour,
                days.into_iter().map(|d| time::Weekday::Sunday.nth_next(d)),
            ).unwrap();
            let r = Resource::ClusterMaintenanceConfig(ClusterMaintenanceConfig::new(Some(window)));
            proptest::prop_assert_eq!(&parse_resource(&r.to_yaml().unwrap()).unwrap(), &r);
            proptest::prop_assert_eq!(&parse_resource(&r.to_json().unwrap()).unwrap(), &r);
        }

        #[test]
        fn parser_never_panics(text in "[ -~\n]{0,200}") {
            let _ = parse_resources(&text);
        }
    }

    #[test]
    fn names_are_checked() {
        let err = parse_resources(&ROLE.replace("name: maint", "name: a/b")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata.name: expected a non-empty name without '/', white space or control characters"
        );
    }
}
