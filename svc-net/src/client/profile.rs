//! Client identities: the `tsh` profile under `~/.svc/` (or `$SVC_HOME`), and the choice of
//! identity `tctl` acts with.
//!
//! Profile format: `<home>/profile.json`, mode 0600, `{"proxy": "host:port", "identity":
//! <identity file>}` where the identity file is [`ClientIdentity`] (user certificates, private
//! keys, trusted CAs, Auth API address). The roles shown by `tsh status` are read back from the
//! certificate itself, so they are exactly what the cluster will see. Next to it, for OpenSSH:
//! `keys/key` (0600), `keys/key-cert.pub` and `keys/known_hosts` (`@cert-authority` lines for
//! the cluster's host CA, limited to the names of the cluster's nodes: [`known_hosts`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use svc_core::auth::{ResourceRoute, ServedKind};
use svc_core::identity::UserIdentity;
use svc_core::{Addr, Secret};

use super::Error;
use crate::auth::{AuthClient, ClientIdentity};
use crate::dial::ProxyDialer;

/// The environment variable that relocates the profile directory.
pub const SVC_HOME_ENV: &str = "SVC_HOME";
/// The profile file name.
pub const PROFILE_FILE: &str = "profile.json";
/// The OpenSSH key, certificate (`key-cert.pub`) and `known_hosts` written next to the profile.
pub const OPENSSH_KEY_FILE: &str = "keys/key";
/// The OpenSSH certificate for [`OPENSSH_KEY_FILE`].
pub const OPENSSH_CERT_FILE: &str = "keys/key-cert.pub";
/// `@cert-authority <node names>,*.<cluster> <host CA>`: lets OpenSSH check the nodes' host
/// certificates, and nothing else's.
pub const KNOWN_HOSTS_FILE: &str = "keys/known_hosts";

/// A signed-in session. Its `Debug` shows no key material (the identity's keys are redacted).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Profile {
    /// The proxy signed in through.
    pub proxy: String,
    /// The user's identity.
    pub identity: ClientIdentity,
    /// Signed in with `--insecure`: no trust for the proxy's TLS certificate, so `tsh ssh`
    /// uses plain SSH on the web port (the proxy is then checked by its host certificate).
    #[serde(default)]
    pub insecure: bool,
    /// The CA bundle (PEM) given to `tsh login --cacert`: trusted for the proxy's TLS
    /// certificate by every later command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// Whether the proxy routes every protocol on its web port (from `/webapi/ping` at login;
    /// `None` in profiles written before it was recorded: taken as on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_routing: Option<bool>,
    /// Without TLS routing: the proxy's SSH entry for clients (`proxy.ssh.ssh_public_addr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_proxy_addr: Option<String>,
    /// Without TLS routing: the proxy's Kubernetes listener (`proxy.kube.public_addr`, from
    /// `kube_listen_addr`), which `tsh kube login` points kubectl at; the web port otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy_addr: Option<String>,
    /// The node names the user could reach when `known_hosts` was last written (`tsh login`,
    /// `tsh ls`): the host patterns its `@cert-authority` lines are limited to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub known_nodes: Vec<String>,
}

/// The `known_hosts` text for OpenSSH: one `@cert-authority` line per host CA, trusted only for
/// `nodes` (node names) and `*.<cluster>` (host IDs) — never `*`, which would let the cluster's
/// host CA vouch for any host the user connects to. OpenSSH then also requires the host
/// certificate to name the host asked for (its principals). Names with characters that are
/// special in `known_hosts` patterns are left out.
pub fn known_hosts<'a>(
    cluster: &str,
    nodes: &[String],
    host_ca_keys: impl IntoIterator<Item = &'a str>,
) -> String {
    let safe = |n: &&String| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
    };
    let mut patterns: Vec<String> = nodes.iter().filter(safe).cloned().collect();
    patterns.push(format!("*.{cluster}"));
    let patterns = patterns.join(",");
    host_ca_keys
        .into_iter()
        .map(|key| format!("@cert-authority {patterns} {}\n", key.trim()))
        .collect()
}

/// `$SVC_HOME`, else `~/.svc`.
pub fn home() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os(SVC_HOME_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .ok_or(Error::NoHome)?;
    Ok(PathBuf::from(home).join(".svc"))
}

/// The profile path.
pub fn profile_path() -> Result<PathBuf, Error> {
    Ok(home()?.join(PROFILE_FILE))
}

impl Profile {
    /// Reads the profile, `None` when not signed in.
    pub fn load() -> Result<Option<Profile>, Error> {
        let path = profile_path()?;
        match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(profile) => Ok(Some(profile)),
                Err(source) => Err(Error::NotAProfile { path, source }),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::File {
                action: "reading",
                path,
                source,
            }),
        }
    }

    /// The saved profile, if it is still valid: [`Error::NotSignedIn`] without one,
    /// [`Error::Expired`] when its certificates have expired.
    pub fn signed_in() -> Result<Profile, Error> {
        let profile = Profile::load()?.ok_or(Error::NotSignedIn)?;
        if profile.identity.is_expired(SystemTime::now()) {
            return Err(Error::Expired);
        }
        Ok(profile)
    }

    /// The login used when none is given: the first of the certificate's logins (logins
    /// starting with `-` are placeholders and never chosen).
    pub fn default_login(&self) -> Result<String, Error> {
        self.user()?
            .logins
            .into_iter()
            .find(|l| !l.starts_with('-'))
            .ok_or(Error::NoLogins)
    }

    /// The profile's proxy web address.
    pub fn proxy_addr(&self) -> Result<Addr, Error> {
        Addr::parse(&self.proxy).map_err(|source| Error::Addr {
            what: "the profile's proxy",
            addr: self.proxy.clone(),
            source,
        })
    }

    /// The resources of `kind` the user may reach, asked of the Auth Service. Listing nodes also
    /// refreshes the names `known_hosts` trusts the cluster's host CA for (and saves the profile
    /// when they changed), as `tsh ls` does.
    pub async fn list(&mut self, kind: ServedKind) -> Result<Vec<ResourceRoute>, Error> {
        let mut auth = AuthClient::connect_with(&self.identity).await?;
        let routes = auth.list_served(kind, None).await?;
        let names: Vec<String> = routes.iter().map(|r| r.resource.name.clone()).collect();
        if kind == ServedKind::Node && names != self.known_nodes {
            self.known_nodes = names;
            self.save()?;
        }
        Ok(routes)
    }

    /// Writes the profile (mode 0600, also when it existed with looser permissions).
    pub fn save(&self) -> Result<PathBuf, Error> {
        let path = profile_path()?;
        let dir = path.parent().unwrap_or(Path::new("."));
        write_private(&path, &serde_json::to_vec_pretty(self)?)?;
        self.save_openssh_files(dir)?;
        Ok(path)
    }

    /// Writes the SSH key and certificate and a `known_hosts` trusting the cluster's host CA
    /// under `<home>/keys/`, for OpenSSH with `tsh proxy ssh` as its `ProxyCommand`.
    fn save_openssh_files(&self, home: &Path) -> Result<(), Error> {
        let key = self
            .identity
            .ssh_private_key()?
            .to_openssh(russh::keys::ssh_key::LineEnding::LF)
            .map_err(Error::EncodeKey)?;
        let host_cas = known_hosts(
            &self.identity.cluster,
            &self.known_nodes,
            self.identity
                .trusted
                .iter()
                .filter(|ca| ca.kind == "host")
                .map(|ca| ca.ssh_public_key.as_str()),
        );
        write_private(&home.join(OPENSSH_KEY_FILE), key.as_bytes())?;
        write_private(
            &home.join(OPENSSH_CERT_FILE),
            format!("{}\n", self.identity.ssh_cert.trim()).as_bytes(),
        )?;
        write_private(&home.join(KNOWN_HOSTS_FILE), host_cas.as_bytes())
    }

    /// Removes the profile (and the OpenSSH files); whether there was one.
    pub fn remove() -> Result<bool, Error> {
        let path = profile_path()?;
        let home = home()?;
        let removing = |path: PathBuf, source| Error::File {
            action: "removing",
            path,
            source,
        };
        for file in [OPENSSH_KEY_FILE, OPENSSH_CERT_FILE, KNOWN_HOSTS_FILE] {
            match std::fs::remove_file(home.join(file)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(removing(home.join(file), e)),
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(removing(path, e)),
        }
    }

    /// The user identity the certificate states (user name, roles, logins, validity), verified
    /// against the cluster's user CA.
    pub fn user(&self) -> Result<UserIdentity, Error> {
        let (chain, _) = self.identity.tls_parts()?;
        // Verify at a moment inside the validity, so an expired profile still shows who it was.
        let at = self
            .identity
            .not_after()
            .checked_sub(std::time::Duration::from_secs(1))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(self.identity.verifier()?.verify_user_x509(&chain, at)?)
    }
}

/// Writes `bytes` to `path` with mode 0600 — an existing file is replaced, so a profile, key or
/// kubeconfig left readable by others becomes private — creating a missing directory 0700.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    Ok(svc_core::fs::write_private_file(path, bytes)?)
}

/// Which identity `tctl` acts with: on the Auth host (`--data-dir` or `--config` given) the
/// admin identity in the data directory; otherwise the signed-in `tsh` profile; otherwise the
/// admin identity of the default data directory.
#[cfg(feature = "node")]
pub fn tctl_identity(
    explicit_data_dir: Option<&Path>,
    default_data_dir: &Path,
) -> Result<ClientIdentity, Error> {
    if let Some(dir) = explicit_data_dir {
        return admin_identity(dir);
    }
    if let Some(profile) = Profile::load()? {
        if profile.identity.is_expired(SystemTime::now()) {
            return Err(Error::SessionExpired {
                user: profile.identity.name,
            });
        }
        return Ok(profile.identity);
    }
    admin_identity(default_data_dir).map_err(|e| Error::NoAdminIdentity(Box::new(e)))
}

#[cfg(feature = "node")]
fn admin_identity(data_dir: &Path) -> Result<ClientIdentity, Error> {
    let path = crate::auth::node::admin_identity_path(data_dir);
    ClientIdentity::load(&path).map_err(|source| Error::AdminIdentity { path, source })
}

/// What [`sign_in`] needs besides the password.
#[derive(Debug, Clone)]
pub struct SignIn {
    /// The proxy's web address.
    pub proxy: Addr,
    /// The user name.
    pub user: String,
    /// Do not verify the proxy's certificate (self-signed test clusters only).
    pub insecure: bool,
    /// A CA bundle (PEM) trusted for the proxy's certificate, kept in the profile.
    pub ca_pem: Option<Vec<u8>>,
    /// The session length asked for (the cluster caps it).
    pub ttl: Option<Duration>,
}

/// A fresh session from [`sign_in`], not saved yet.
#[derive(Debug)]
pub struct SignedIn {
    /// The session.
    pub profile: Profile,
    /// Listing the reachable nodes for `known_hosts` failed: the profile is usable, its
    /// `known_hosts` trusts the host CA only for `*.<cluster>` until the next listing.
    pub known_nodes_error: Option<Error>,
}

/// The proxy's `/webapi/ping`, checked against this client's version ([`ping`]).
#[derive(Debug, Clone)]
pub struct Pinged {
    /// The ping document.
    pub ping: serde_json::Value,
    /// Set when the cluster runs a newer major version than this client: what to tell the user.
    pub version_warning: Option<String>,
}

/// Asks the proxy's `/webapi/ping` (`HTTPS_PROXY`/`NO_PROXY` honoured) and checks this
/// client's version against it: a client older than the ping's `min_client_version` is
/// refused ([`Error::ClientTooOld`], naming both versions); a cluster a major version ahead
/// gives [`Pinged::version_warning`].
pub async fn ping(request: &SignIn) -> Result<Pinged, Error> {
    let proxy = request.proxy.to_string();
    let dialer = ProxyDialer::from_env()?;
    let ping =
        super::login::ping_via_proxy(&proxy, request.insecure, request.ca_pem.as_deref(), Some(&dialer))
            .await?;
    let version = |member: &'static str| -> Result<Option<svc_core::Version>, Error> {
        ping[member]
            .as_str()
            .map(svc_core::Version::parse)
            .transpose()
            .map_err(|source| Error::PingVersion { member, source })
    };
    let client = svc_core::version::current();
    let server = version("server_version")?;
    let version_warning = match version("min_client_version")? {
        Some(min_client) => {
            let server = server.unwrap_or_else(|| min_client.clone());
            svc_core::version::check_client(client, &server, &min_client).map_err(Box::new)?
        }
        None => server.and_then(|server| {
            svc_core::version::check_client(client, &server, client)
                .ok()
                .flatten()
        }),
    };
    Ok(Pinged {
        ping,
        version_warning,
    })
}

/// Signs `request.user` in through the proxy (`HTTPS_PROXY`/`NO_PROXY` honoured) with the
/// routing `pinged` describes (TLS routing, its SSH and Kubernetes entries; from [`ping`]), signs in with
/// `password` and lists the nodes the user may reach for `known_hosts`.
pub async fn sign_in(request: SignIn, pinged: &Pinged, password: &Secret) -> Result<SignedIn, Error> {
    let proxy = request.proxy.to_string();
    let ca = request.ca_pem.as_deref();
    let dialer = ProxyDialer::from_env()?;
    let identity = super::login::login_via_proxy_with(
        &proxy,
        request.insecure,
        ca,
        Some(&dialer),
        &request.user,
        password,
        request.ttl,
    )
    .await?;
    finish_sign_in(request, pinged, identity).await
}

/// Signs in through the single sign-on connector `login.connector` (see
/// [`login_via_sso`](super::login_via_sso); `show_url` gets the provider's URL for the user),
/// then as [`sign_in`].
pub async fn sign_in_sso(
    request: SignIn,
    pinged: &Pinged,
    login: &super::SsoLogin,
    show_url: impl FnOnce(&str),
) -> Result<SignedIn, Error> {
    let proxy = request.proxy.to_string();
    let dialer = ProxyDialer::from_env()?;
    let identity = super::sso::login_via_sso(
        &proxy,
        request.insecure,
        request.ca_pem.as_deref(),
        Some(&dialer),
        login,
        show_url,
    )
    .await?;
    finish_sign_in(request, pinged, identity).await
}

async fn finish_sign_in(
    request: SignIn,
    pinged: &Pinged,
    identity: ClientIdentity,
) -> Result<SignedIn, Error> {
    let proxy = request.proxy.to_string();
    let ping = &pinged.ping;
    let tls_routing = ping["proxy"]["tls_routing_enabled"].as_bool().unwrap_or(true);
    let ssh_proxy_addr = (!tls_routing)
        .then(|| ping["proxy"]["ssh"]["ssh_public_addr"].as_str())
        .flatten()
        .map(|a| super::ssh::reachable(a, &proxy));
    let kube_proxy_addr = (!tls_routing && ping["proxy"]["kube"]["enabled"].as_bool() == Some(true))
        .then(|| ping["proxy"]["kube"]["public_addr"].as_str())
        .flatten()
        .map(|a| super::ssh::reachable(a, &proxy));
    let (known_nodes, known_nodes_error) = match reachable_nodes(&identity).await {
        Ok(nodes) => (nodes, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    Ok(SignedIn {
        profile: Profile {
            proxy,
            identity,
            insecure: request.insecure,
            ca_pem: request
                .ca_pem
                .map(|pem| String::from_utf8_lossy(&pem).into_owned()),
            tls_routing: Some(tls_routing),
            ssh_proxy_addr,
            kube_proxy_addr,
            known_nodes,
        },
        known_nodes_error,
    })
}

/// The node names the signed-in user may reach now: the hosts `known_hosts` trusts the
/// cluster's host CA for.
async fn reachable_nodes(identity: &ClientIdentity) -> Result<Vec<String>, Error> {
    let mut auth = AuthClient::connect_with(identity).await?;
    let routes = auth.list_served(ServedKind::Node, None).await?;
    Ok(routes.into_iter().map(|r| r.resource.name).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hosts_trusts_the_host_ca_only_for_the_clusters_nodes() {
        let nodes = [
            "dev-1".to_owned(),
            "bad name".to_owned(),
            "db.internal".to_owned(),
        ];
        assert_eq!(
            known_hosts("e2e.test", &nodes, ["ssh-ed25519 AAAA ca\n"]),
            "@cert-authority dev-1,db.internal,*.e2e.test ssh-ed25519 AAAA ca\n"
        );
        assert_eq!(
            known_hosts("e2e.test", &[], ["k1", "k2"]),
            "@cert-authority *.e2e.test k1\n@cert-authority *.e2e.test k2\n"
        );
    }
}
