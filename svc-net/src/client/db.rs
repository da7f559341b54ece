//! `tsh db login|config|env`: a short-lived database client certificate whose identity carries
//! the route (database, protocol, database user and name), and how a native client (`psql`,
//! `mariadb`) uses it to connect straight to the proxy.
//!
//! Files, under `<profile dir>/db/<name>/`: `cert.pem` (the certificate), `key.pem` (its
//! private key, mode 0600), `ca.pem` (what verifies the proxy: the CA given to
//! `tsh login --cacert` and the cluster's host CA) and `route.json` (what `tsh db config`
//! prints from).

use std::path::PathBuf;

use rcgen::PublicKeyData;
use serde::{Deserialize, Serialize};
use svc_core::Addr;

use super::{Error, Profile};
use crate::auth::AuthClient;

/// The route and files of one `tsh db login`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DbLogin {
    /// The database's name.
    pub name: String,
    /// Its protocol (`postgres`, `mysql`, ...).
    pub protocol: String,
    /// The database user the certificate is for.
    pub db_user: String,
    /// The database name it is for, if one was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_name: Option<String>,
    /// The client certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, mode 0600).
    pub key: PathBuf,
    /// The CAs that verify the proxy (PEM).
    pub ca: PathBuf,
    /// When the certificate ends (Unix seconds).
    pub not_after_unix: i64,
}

/// Where a native client connects and with what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DbConfig {
    /// The login it comes from.
    #[serde(flatten)]
    pub login: DbLogin,
    /// The proxy's host for this protocol.
    pub host: String,
    /// The proxy's port for this protocol.
    pub port: u16,
    /// Whether the proxy's certificate can be checked (`false` after `tsh login --insecure`).
    pub verify: bool,
}

fn dir(name: &str) -> Result<PathBuf, Error> {
    Ok(super::home()?.join("db").join(name))
}

/// Asks the Auth Service for a certificate for `name` as `db_user` (and `db_name`) with a
/// fresh key, and writes the files; the Auth Service checks the roles' `db_labels`,
/// `db_users` and `db_names` ([`Error::Denied`] with its text when they refuse).
pub async fn db_login(
    profile: &Profile,
    name: &str,
    db_user: &str,
    db_name: Option<&str>,
) -> Result<DbLogin, Error> {
    let key = rcgen::KeyPair::generate()
        .map_err(|e| crate::auth::IdentityFileError::Invalid(format!("TLS key: {e}")))?;
    let mut auth = AuthClient::connect_with(&profile.identity).await?;
    let (certs, protocol) = auth
        .issue_db_cert(name, db_user, db_name, key.subject_public_key_info())
        .await?
        .map_err(Error::Denied)?;
    let dir = dir(name)?;
    let mut ca = profile.ca_pem.clone().unwrap_or_default();
    for host_ca in profile.identity.trusted.iter().filter(|c| c.kind == "host") {
        if !ca.is_empty() && !ca.ends_with('\n') {
            ca.push('\n');
        }
        ca.push_str(&host_ca.tls_cert_pem);
    }
    let login = DbLogin {
        name: name.to_owned(),
        protocol,
        db_user: db_user.to_owned(),
        db_name: db_name.map(str::to_owned),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        ca: dir.join("ca.pem"),
        not_after_unix: certs.not_after_unix,
    };
    super::write_private(&login.key, key.serialize_pem().as_bytes())?;
    super::write_private(&login.cert, certs.tls_cert_pem.as_bytes())?;
    super::write_private(&login.ca, ca.as_bytes())?;
    super::write_private(&dir.join("route.json"), &serde_json::to_vec_pretty(&login)?)?;
    Ok(login)
}

/// The last `tsh db login` for `name`.
pub fn load_db_login(name: &str) -> Result<DbLogin, Error> {
    let path = dir(name)?.join("route.json");
    match std::fs::read(&path) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Denied(format!(
            "no database certificate for db \"{name}\": run tsh db login {name} --db-user USER"
        ))),
        Err(source) => Err(Error::File {
            action: "reading",
            path,
            source,
        }),
    }
}

/// The connection settings for `name` after `tsh db login`: the proxy's address for the
/// protocol from its `/webapi/ping` (the separate Postgres or MySQL port when it has one, else
/// the web port, where TLS routing detects Postgres' SSLRequest), and the files.
pub async fn db_config(profile: &Profile, name: &str) -> Result<DbConfig, Error> {
    let login = load_db_login(name)?;
    let dialer = crate::dial::ProxyDialer::from_env()?;
    let ping = super::ping_via_proxy(
        &profile.proxy,
        profile.insecure && profile.ca_pem.is_none(),
        profile.ca_pem.as_deref().map(str::as_bytes),
        Some(&dialer),
    )
    .await?;
    let field = match login.protocol.as_str() {
        "mysql" => "mysql_public_addr",
        "mongodb" => "mongo_public_addr",
        "redis" => "redis_public_addr",
        _ => "postgres_public_addr",
    };
    // redis-cli sends no ALPN, so it needs the proxy's own Redis port (separate mode).
    if login.protocol == "redis"
        && ping["proxy"]["db"]["redis_listen_addr"]
            .as_str()
            .is_none_or(str::is_empty)
    {
        return Err(Error::Denied(format!(
            "the proxy has no Redis port (redis_listen_addr): connect through tsh proxy db {name} --db-user {}",
            login.db_user
        )));
    }
    let proxy = profile.proxy_addr()?;
    let addr = ping["proxy"]["db"][field]
        .as_str()
        .filter(|a| !a.is_empty())
        .and_then(|a| Addr::parse(a).ok())
        .unwrap_or_else(|| proxy.clone());
    let host = addr
        .host_str()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    // A listener on every address (`0.0.0.0`) is reached at the proxy's own host.
    let host = match host.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_unspecified() => proxy
            .host_str()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        _ => host,
    };
    Ok(DbConfig {
        port: addr.port(),
        host,
        verify: !(profile.insecure && profile.ca_pem.is_none()),
        login,
    })
}

impl DbConfig {
    /// The libpq connection string (`psql "<this>"`).
    pub fn postgres_conninfo(&self) -> String {
        let l = &self.login;
        let mut parts = vec![
            format!("host={}", self.host),
            format!("port={}", self.port),
            format!("sslmode={}", if self.verify { "verify-full" } else { "require" }),
            // The proxy speaks TLS, never GSSAPI encryption: no GSSENCRequest first.
            "gssencmode=disable".to_owned(),
        ];
        if self.verify {
            parts.push(format!("sslrootcert={}", l.ca.display()));
        }
        parts.push(format!("sslcert={}", l.cert.display()));
        parts.push(format!("sslkey={}", l.key.display()));
        parts.push(format!("user={}", l.db_user));
        if let Some(db) = &l.db_name {
            parts.push(format!("dbname={db}"));
        }
        parts.join(" ")
    }

    /// The command line of a MySQL/MariaDB client (`mariadb` or `mysql`).
    pub fn mysql_args(&self) -> Vec<String> {
        let l = &self.login;
        let mut args = vec![
            format!("--host={}", self.host),
            format!("--port={}", self.port),
            format!("--user={}", l.db_user),
            format!("--ssl-cert={}", l.cert.display()),
            format!("--ssl-key={}", l.key.display()),
        ];
        if self.verify {
            args.push(format!("--ssl-ca={}", l.ca.display()));
            args.push("--ssl-verify-server-cert".to_owned());
        }
        if let Some(db) = &l.db_name {
            args.push(db.clone());
        }
        args
    }

    /// The command line of `redis-cli` (TLS with the certificate; the session runs as the
    /// certificate's database user, which the agent holds it to).
    pub fn redis_args(&self) -> Vec<String> {
        let l = &self.login;
        let mut args = vec![
            "-h".to_owned(),
            self.host.clone(),
            "-p".to_owned(),
            self.port.to_string(),
            "--tls".to_owned(),
            "--cert".to_owned(),
            l.cert.display().to_string(),
            "--key".to_owned(),
            l.key.display().to_string(),
        ];
        if self.verify {
            args.extend(["--cacert".to_owned(), l.ca.display().to_string()]);
        } else {
            args.push("--insecure".to_owned());
        }
        args
    }

    /// The environment a native client reads (`eval "$(tsh db env NAME)"`): libpq's `PG*`
    /// variables for Postgres, `MYSQL_HOST`/`MYSQL_TCP_PORT` for MySQL.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let l = &self.login;
        match l.protocol.as_str() {
            "mysql" => vec![
                ("MYSQL_HOST", self.host.clone()),
                ("MYSQL_TCP_PORT", self.port.to_string()),
            ],
            _ => {
                let mut env = vec![
                    ("PGHOST", self.host.clone()),
                    ("PGPORT", self.port.to_string()),
                    (
                        "PGSSLMODE",
                        if self.verify { "verify-full" } else { "require" }.to_owned(),
                    ),
                    ("PGGSSENCMODE", "disable".to_owned()),
                ];
                if self.verify {
                    env.push(("PGSSLROOTCERT", l.ca.display().to_string()));
                }
                env.push(("PGSSLCERT", l.cert.display().to_string()));
                env.push(("PGSSLKEY", l.key.display().to_string()));
                env.push(("PGUSER", l.db_user.clone()));
                if let Some(db) = &l.db_name {
                    env.push(("PGDATABASE", db.clone()));
                }
                env
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(protocol: &str, verify: bool) -> DbConfig {
        DbConfig {
            login: DbLogin {
                name: "pg".into(),
                protocol: protocol.into(),
                db_user: "alice".into(),
                db_name: Some("shop".into()),
                cert: "/h/db/pg/cert.pem".into(),
                key: "/h/db/pg/key.pem".into(),
                ca: "/h/db/pg/ca.pem".into(),
                not_after_unix: 0,
            },
            host: "proxy.example.com".into(),
            port: 443,
            verify,
        }
    }

    #[test]
    fn conninfo_and_env_name_the_proxy_and_the_files() {
        let c = config("postgres", true);
        assert_eq!(
            c.postgres_conninfo(),
            "host=proxy.example.com port=443 sslmode=verify-full gssencmode=disable sslrootcert=/h/db/pg/ca.pem sslcert=/h/db/pg/cert.pem sslkey=/h/db/pg/key.pem user=alice dbname=shop"
        );
        let env = c.env();
        assert!(
            env.contains(&("PGSSLCERT", "/h/db/pg/cert.pem".into())),
            "{env:?}"
        );
        assert!(env.contains(&("PGDATABASE", "shop".into())), "{env:?}");
        let insecure = config("postgres", false);
        assert!(insecure.postgres_conninfo().contains("sslmode=require"));
        assert!(!insecure.postgres_conninfo().contains("sslrootcert"));
        let my = config("mysql", true);
        assert_eq!(my.env()[1], ("MYSQL_TCP_PORT", "443".into()));
        assert!(my.mysql_args().contains(&"--ssl-cert=/h/db/pg/cert.pem".into()));
    }
}
