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
use std::time::SystemTime;

use anyhow::{Context, anyhow};
use serde::{Deserialize, Serialize};
use svc_core::identity::UserIdentity;
use svc_net::auth::ClientIdentity;

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

/// A signed-in session.
#[derive(Clone, Serialize, Deserialize)]
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
pub fn home() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os(SVC_HOME_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .ok_or_else(|| anyhow!("neither {SVC_HOME_ENV} nor HOME is set"))?;
    Ok(PathBuf::from(home).join(".svc"))
}

/// The profile path.
pub fn profile_path() -> anyhow::Result<PathBuf> {
    Ok(home()?.join(PROFILE_FILE))
}

impl Profile {
    /// Reads the profile, `None` when not signed in.
    pub fn load() -> anyhow::Result<Option<Profile>> {
        let path = profile_path()?;
        match std::fs::read(&path) {
            Ok(bytes) => {
                Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
                    format!("{}: not a svc profile", path.display())
                })?))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the profile (mode 0600, also when it existed with looser permissions).
    pub fn save(&self) -> anyhow::Result<PathBuf> {
        let path = profile_path()?;
        let dir = path.parent().unwrap_or(Path::new("."));
        write_private(&path, &serde_json::to_vec_pretty(self)?)?;
        self.save_openssh_files(dir)?;
        Ok(path)
    }

    /// Writes the SSH key and certificate and a `known_hosts` trusting the cluster's host CA
    /// under `<home>/keys/`, for OpenSSH with `tsh proxy ssh` as its `ProxyCommand`.
    fn save_openssh_files(&self, home: &Path) -> anyhow::Result<()> {
        let key = self
            .identity
            .ssh_private_key()?
            .to_openssh(russh::keys::ssh_key::LineEnding::LF)
            .context("encoding the SSH key")?;
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
    pub fn remove() -> anyhow::Result<bool> {
        let path = profile_path()?;
        let home = home()?;
        for file in [OPENSSH_KEY_FILE, OPENSSH_CERT_FILE, KNOWN_HOSTS_FILE] {
            match std::fs::remove_file(home.join(file)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", home.join(file).display())),
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }

    /// The user identity the certificate states (user name, roles, logins, validity), verified
    /// against the cluster's user CA.
    pub fn user(&self) -> anyhow::Result<UserIdentity> {
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
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(svc_core::fs::write_private_file(path, bytes)?)
}

/// Which identity `tctl` acts with: on the Auth host (`--data-dir` or `--config` given) the
/// admin identity in the data directory; otherwise the signed-in `tsh` profile; otherwise the
/// admin identity of the default data directory.
pub fn tctl_identity(
    explicit_data_dir: Option<&Path>,
    default_data_dir: &Path,
) -> anyhow::Result<ClientIdentity> {
    if let Some(dir) = explicit_data_dir {
        return admin_identity(dir);
    }
    if let Some(profile) = Profile::load()? {
        if profile.identity.is_expired(SystemTime::now()) {
            return Err(anyhow!(
                "the session of {} has expired: sign in again with tsh login",
                profile.identity.name
            ));
        }
        return Ok(profile.identity);
    }
    admin_identity(default_data_dir).context("not signed in (tsh login) and no Auth Service data here")
}

fn admin_identity(data_dir: &Path) -> anyhow::Result<ClientIdentity> {
    let path = svc_net::auth::node::admin_identity_path(data_dir);
    ClientIdentity::load(&path).with_context(|| {
        format!(
            "reading the admin identity {} (is svc start running with this data directory, and are you root?)",
            path.display()
        )
    })
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
