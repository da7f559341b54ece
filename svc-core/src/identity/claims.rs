//! [`Claims`]: the identity a certificate states, written identically into X.509 (DER) and
//! OpenSSH (JSON) certificates, so verification reads back exactly what signing wrote.

use serde::{Deserialize, Serialize};

use super::{
    DbCertRoute, HostCertRequest, HostIdentity, IdentityError, IdentityKind, SystemRole, UserCertRequest,
    UserIdentity, Validity, VerifyError, host_id,
};

/// Version of the claims encoding; a verifier refuses versions it does not know.
const CLAIMS_VERSION: u8 = 1;

/// The identity carried by a certificate, before it is typed as a host or user identity.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Claims {
    /// `host` or `user`.
    pub kind: String,
    /// The host ID or user name.
    pub name: String,
    /// The cluster name.
    pub cluster: String,
    /// The node name (hosts; empty for users).
    pub node_name: String,
    /// System roles (hosts) or role names (users).
    pub roles: Vec<String>,
    /// Allowed OS logins (users; empty for hosts).
    pub logins: Vec<String>,
    /// Additional names (hosts; empty for users).
    pub names: Vec<String>,
    /// The database route of a database client certificate (`tsh db login`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_route: Option<DbCertRoute>,
}

/// Refuses values that cannot be written safely into a certificate: empty, overlong or with
/// control characters (a newline in a login would split an `authorized_keys` line).
fn check_text(field: &'static str, value: &str) -> Result<(), IdentityError> {
    let reason = if value.is_empty() {
        "must not be empty".to_owned()
    } else if value.len() > 255 {
        format!("at most 255 bytes, got {}", value.len())
    } else if value.chars().any(char::is_control) {
        format!("control characters are not allowed, got {value:?}")
    } else {
        return Ok(());
    };
    Err(IdentityError::InvalidRequest { field, reason })
}

impl Claims {
    pub(crate) fn for_host(req: &HostCertRequest, cluster: &str) -> Result<Self, IdentityError> {
        check_text("node_name", &req.node_name)?;
        for name in &req.additional_names {
            check_text("additional_names", name)?;
        }
        if req.roles.is_empty() {
            return Err(IdentityError::InvalidRequest {
                field: "roles",
                reason: "a host needs at least one role".to_owned(),
            });
        }
        Ok(Self {
            kind: IdentityKind::Host.as_str().to_owned(),
            name: host_id(&req.host_uuid, cluster),
            cluster: cluster.to_owned(),
            node_name: req.node_name.clone(),
            roles: req.roles.iter().map(|r| r.as_str().to_owned()).collect(),
            logins: Vec::new(),
            names: req.additional_names.clone(),
            db_route: None,
        })
    }

    pub(crate) fn for_user(req: &UserCertRequest, cluster: &str) -> Result<Self, IdentityError> {
        check_text("username", &req.username)?;
        for role in &req.roles {
            check_text("roles", role)?;
        }
        for login in &req.logins {
            check_text("logins", login)?;
        }
        if let Some(route) = &req.db_route {
            check_text("db_route.service", &route.service)?;
            check_text("db_route.protocol", &route.protocol)?;
            check_text("db_route.user", &route.user)?;
            if let Some(db) = &route.database {
                check_text("db_route.database", db)?;
            }
        }
        Ok(Self {
            kind: IdentityKind::User.as_str().to_owned(),
            name: req.username.clone(),
            cluster: cluster.to_owned(),
            node_name: String::new(),
            roles: req.roles.clone(),
            logins: req.logins.clone(),
            names: Vec::new(),
            db_route: req.db_route.clone(),
        })
    }

    /// The claims as the DER value of the X.509 identity extension.
    pub(crate) fn to_der(&self) -> Vec<u8> {
        let strings = |w: yasna::DERWriter<'_>, items: &[String]| {
            w.write_sequence_of(|w| {
                for item in items {
                    w.next().write_utf8_string(item);
                }
            })
        };
        yasna::construct_der(|w| {
            w.write_sequence(|w| {
                w.next().write_u8(CLAIMS_VERSION);
                w.next().write_utf8_string(&self.kind);
                w.next().write_utf8_string(&self.name);
                w.next().write_utf8_string(&self.cluster);
                w.next().write_utf8_string(&self.node_name);
                strings(w.next(), &self.roles);
                strings(w.next(), &self.logins);
                strings(w.next(), &self.names);
                // Optional and last, so certificates without a route encode as before.
                if let Some(route) = &self.db_route {
                    w.next().write_tagged(yasna::Tag::context(0), |w| {
                        w.write_sequence(|w| {
                            w.next().write_utf8_string(&route.service);
                            w.next().write_utf8_string(&route.protocol);
                            w.next().write_utf8_string(&route.user);
                            w.next()
                                .write_utf8_string(route.database.as_deref().unwrap_or_default());
                        })
                    });
                }
            })
        })
    }

    /// Parses the DER written by [`to_der`](Self::to_der).
    pub(crate) fn from_der(der: &[u8]) -> Result<Self, VerifyError> {
        fn strings(r: yasna::BERReader<'_, '_>) -> yasna::ASN1Result<Vec<String>> {
            let mut out = Vec::new();
            r.read_sequence_of(|r| {
                out.push(r.read_utf8string()?);
                Ok(())
            })?;
            Ok(out)
        }
        yasna::parse_der(der, |r| {
            r.read_sequence(|r| {
                let version = r.next().read_u8()?;
                if version != CLAIMS_VERSION {
                    return Err(yasna::ASN1Error::new(yasna::ASN1ErrorKind::Invalid));
                }
                Ok(Self {
                    kind: r.next().read_utf8string()?,
                    name: r.next().read_utf8string()?,
                    cluster: r.next().read_utf8string()?,
                    node_name: r.next().read_utf8string()?,
                    roles: strings(r.next())?,
                    logins: strings(r.next())?,
                    names: strings(r.next())?,
                    db_route: r.read_optional(|r| {
                        r.read_tagged(yasna::Tag::context(0), |r| {
                            r.read_sequence(|r| {
                                let service = r.next().read_utf8string()?;
                                let protocol = r.next().read_utf8string()?;
                                let user = r.next().read_utf8string()?;
                                let database = r.next().read_utf8string()?;
                                Ok(DbCertRoute {
                                    service,
                                    protocol,
                                    user,
                                    database: (!database.is_empty()).then_some(database),
                                })
                            })
                        })
                    })?,
                })
            })
        })
        .map_err(|e| VerifyError::Malformed(format!("identity extension: {e}")))
    }

    /// The kind the claims state.
    pub fn kind(&self) -> Result<IdentityKind, VerifyError> {
        self.kind
            .parse()
            .map_err(|e| VerifyError::Malformed(format!("identity kind: {e}")))
    }

    pub(crate) fn into_host(self, validity: Validity) -> Result<HostIdentity, VerifyError> {
        let roles = self
            .roles
            .iter()
            .map(|r| r.parse::<SystemRole>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| VerifyError::Malformed(format!("host roles: {e}")))?;
        Ok(HostIdentity {
            host_id: self.name,
            cluster: self.cluster,
            node_name: self.node_name,
            roles,
            additional_names: self.names,
            validity,
        })
    }

    pub(crate) fn into_user(self, validity: Validity) -> UserIdentity {
        UserIdentity {
            username: self.name,
            cluster: self.cluster,
            roles: self.roles,
            logins: self.logins,
            db_route: self.db_route,
            validity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Claims {
        Claims {
            kind: "host".into(),
            name: "id.example.com".into(),
            cluster: "example.com".into(),
            node_name: "node-1".into(),
            roles: vec!["node".into(), "app".into()],
            logins: vec![],
            names: vec!["10.0.0.1".into(), "ünïcode.example".into()],
            db_route: None,
        }
    }

    #[test]
    fn der_round_trips() {
        let claims = sample();
        assert_eq!(Claims::from_der(&claims.to_der()).unwrap(), claims);
    }

    #[test]
    fn a_db_route_round_trips_and_its_absence_encodes_as_before() {
        let mut claims = sample();
        let without = claims.to_der();
        claims.db_route = Some(DbCertRoute {
            service: "pg".into(),
            protocol: "postgres".into(),
            user: "alice".into(),
            database: Some("shop".into()),
        });
        assert_eq!(Claims::from_der(&claims.to_der()).unwrap(), claims);
        claims.db_route = None;
        assert_eq!(claims.to_der(), without);
    }

    #[test]
    fn der_refuses_garbage_and_other_versions() {
        assert!(Claims::from_der(b"\x30\x00").is_err());
        let mut der = sample().to_der();
        // SEQUENCE header (2 bytes), INTEGER tag, length, value: the version byte.
        der[4] = 2;
        assert!(Claims::from_der(&der).is_err());
    }

    #[test]
    fn requests_with_bad_text_are_refused() {
        let req = UserCertRequest {
            username: "alice\nroot".into(),
            roles: vec![],
            logins: vec![],
            ttl: std::time::Duration::from_secs(60),
            db_route: None,
            ssh_permits: Default::default(),
        };
        let err = Claims::for_user(&req, "c").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid certificate request: username: control")
        );
    }
}
