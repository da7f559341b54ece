//! The client side: what `tsh` runs — sign-in through the proxy, the session it keeps, the SSH
//! hop through the proxy, local proxies for applications, databases and desktops, and
//! kubeconfig writing.
//!
//! Where it sits in the data flow: [`sign_in`] asks the proxy's `/webapi/ping` and `/webapi/login`
//! for a user identity and returns a [`Profile`] (saved under `~/.svc/` or `$SVC_HOME`). Every
//! later command starts from the profile: [`ssh::run`] and [`ssh::pipe`] open the first hop
//! ([`connect_via_proxy`]: SSH to the proxy, the `proxy:<node>` subsystem) and run an SSH
//! session to the node over it; [`serve_local_proxy`] listens on `127.0.0.1` and carries each
//! connection to an application, database or desktop through the proxy ([`LocalProxy`] over a
//! [`ResourceClient`]); [`write_kubeconfig`] points `kubectl` at a Kubernetes cluster through the
//! proxy.
//!
//! # Example
//!
//! List the nodes the signed-in user may reach:
//!
//! ```no_run
//! # async fn run() -> Result<(), svc_net::client::Error> {
//! use svc_core::auth::ServedKind;
//! use svc_net::client::Profile;
//!
//! let mut profile = Profile::signed_in()?;
//! for route in profile.list(ServedKind::Node).await? {
//!     println!("{}", route.resource.name);
//! }
//! # Ok(())
//! # }
//! ```

mod db;
mod hop;
mod kubeconfig;
mod local_proxy;
mod login;
mod profile;
mod resource;
pub mod ssh;
mod sso;

use std::path::PathBuf;

pub use db::{DbConfig, DbLogin, db_config, db_login, load_db_login};
pub use hop::{ProxiedStream, ProxyEndpoint, SshIdentity, connect_via_proxy};
pub use kubeconfig::{kubeconfig, write_kubeconfig};
pub use local_proxy::{DbUser, LocalTarget, db_protocol, resource_client, serve_local_proxy};
pub use login::{LoginError, login_via_proxy, login_via_proxy_with, ping_via_proxy};
#[cfg(feature = "node")]
pub use profile::tctl_identity;
pub use profile::{
    KNOWN_HOSTS_FILE, OPENSSH_CERT_FILE, OPENSSH_KEY_FILE, PROFILE_FILE, Pinged, Profile, SVC_HOME_ENV,
    SignIn, SignedIn, home, known_hosts, ping, profile_path, sign_in, sign_in_sso, write_private,
};
pub use resource::{
    ConnectError, LocalProxy, LocalProxyError, Multiplexer, ResourceClient, TlsConfigs, alpn_for, bind_local,
};
pub use sso::{SsoLogin, login_via_sso};

/// Why a client-side operation failed. Messages name the file, address, host or login involved;
/// the cause, when there is one, is the error's [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Neither `$SVC_HOME` nor `$HOME` says where the profile lives.
    #[error("neither {SVC_HOME_ENV} nor HOME is set")]
    NoHome,
    /// The profile file is not JSON of a profile.
    #[error("{}: not a svc profile", path.display())]
    NotAProfile {
        /// The profile file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// Reading or removing a file failed.
    #[error("{action} {}", path.display())]
    File {
        /// `reading` or `removing`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing a private file (profile, key, kubeconfig) failed.
    #[error(transparent)]
    WritePrivate(#[from] svc_core::fs::PrivateFsError),
    /// Encoding JSON failed.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// No profile: nobody is signed in.
    #[error("not signed in: run tsh login")]
    NotSignedIn,
    /// The profile's certificates have expired.
    #[error("the session has expired: sign in again with tsh login")]
    Expired,
    /// The profile (of `user`) has expired and `tctl` would have acted with it.
    #[error("the session of {user} has expired: sign in again with tsh login")]
    SessionExpired {
        /// The signed-in user.
        user: String,
    },
    /// The certificate names no login to use by default.
    #[error("the session has no logins: pass login@node")]
    NoLogins,
    /// `tctl` found neither a profile nor the Auth Service's admin identity.
    #[error("not signed in (tsh login) and no Auth Service data here")]
    NoAdminIdentity(#[source] Box<Error>),
    /// The Auth Service's admin identity could not be read.
    #[error(
        "reading the admin identity {} (is svc start running with this data directory, and are you root?)",
        path.display()
    )]
    AdminIdentity {
        /// The identity file.
        path: PathBuf,
        /// Why.
        #[source]
        source: crate::auth::IdentityFileError,
    },
    /// The profile's identity is unusable (keys, certificates, CAs).
    #[error(transparent)]
    Identity(#[from] crate::auth::IdentityFileError),
    /// The certificate does not verify against the cluster's user CA.
    #[error(transparent)]
    Verify(#[from] svc_core::identity::VerifyError),
    /// The SSH key could not be written in OpenSSH's format.
    #[error("encoding the SSH key")]
    EncodeKey(#[source] russh::keys::ssh_key::Error),
    /// An address is not `host:port`.
    #[error("{what} {addr}")]
    Addr {
        /// Which address (`the profile's proxy`, ...).
        what: &'static str,
        /// The text.
        addr: String,
        /// Why.
        #[source]
        source: svc_core::AddrError,
    },
    /// `HTTPS_PROXY`/`NO_PROXY` are unusable.
    #[error(transparent)]
    Dial(#[from] crate::dial::Error),
    /// Signing in through the proxy failed.
    #[error(transparent)]
    Login(#[from] LoginError),
    /// The proxy's ping says this client is too old for the cluster.
    #[error(transparent)]
    ClientTooOld(#[from] Box<svc_core::version::ClientTooOld>),
    /// The proxy's ping carries a version that does not parse.
    #[error("the proxy's ping: {member}: {source}")]
    PingVersion {
        /// `server_version` or `min_client_version`.
        member: &'static str,
        /// Why it does not parse.
        #[source]
        source: svc_core::VersionError,
    },
    /// A call to the Auth Service failed.
    #[error(transparent)]
    Auth(#[from] crate::auth::ClientError),
    /// The Auth Service refused access to a resource (its text names it).
    #[error("{0}")]
    Denied(String),
    /// An SSH target is not `[login@]host[:port]`.
    #[error("{text:?}: {reason}")]
    Target {
        /// The target as given.
        text: String,
        /// What is wrong.
        reason: String,
        /// The port's parse error, if that was it.
        #[source]
        source: Option<std::num::ParseIntError>,
    },
    /// The first hop through the proxy failed.
    #[error(transparent)]
    Hop(#[from] crate::ssh::SshError),
    /// The node's host certificate was refused.
    #[error("SSH to {host}: refusing the node's host certificate: {reason}")]
    HostRefused {
        /// The node asked for.
        host: String,
        /// Why.
        reason: String,
    },
    /// The SSH handshake with the node failed.
    #[error("SSH to {host}")]
    SshConnect {
        /// The node asked for.
        host: String,
        /// Why.
        #[source]
        source: russh::Error,
    },
    /// An SSH operation on the node failed.
    #[error(transparent)]
    Ssh(#[from] russh::Error),
    /// The node refused the login.
    #[error("{host} refused login {login:?}: the certificate's logins must include it")]
    LoginRefused {
        /// The node.
        host: String,
        /// The login asked for.
        login: String,
    },
    /// The session ended without the remote command's status.
    #[error("{0} closed the session without an exit status")]
    NoExitStatus(String),
    /// The local terminal could not be read or put in raw mode.
    #[error("{0}")]
    Terminal(&'static str, #[source] std::io::Error),
    /// A local listener could not be bound.
    #[error("listening on 127.0.0.1:{port}")]
    Listen {
        /// The port asked for.
        port: u16,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Local I/O (standard input and output, the terminal) failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A port forwarding specification (`-L`, `-R`, `-D`) is malformed.
    #[error("forwarding {spec:?}: {reason}")]
    Forward {
        /// The specification as given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// The node refused a port forwarding request.
    #[error("{host} refused port forwarding {spec:?} (the role option port_forwarding may forbid it)")]
    ForwardRefused {
        /// The node.
        host: String,
        /// The specification as given.
        spec: String,
    },
    /// An sftp operation (`tsh scp`) failed.
    #[error("sftp {what} {path:?}")]
    Sftp {
        /// What was done.
        what: &'static str,
        /// The remote path.
        path: String,
        /// Why.
        #[source]
        source: russh_sftp::client::error::Error,
    },
    /// A `tsh scp` argument names neither a local nor a remote file properly.
    #[error("scp: {0}")]
    Scp(String),
}
