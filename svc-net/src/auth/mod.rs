//! The Auth Service on the wire: its gRPC API on port 3025 over mutual TLS, and the client
//! every other part of the cluster (proxy, agents, `tctl`, tests) calls it with.
//!
//! Data flow: [`server::serve`] accepts TCP, runs the TLS handshake (the client certificate, if
//! any, must chain to one of the cluster's CAs; only [`Join`](proto::auth_client::AuthClient)
//! is served without one), hands the verified chain to tonic with each connection, and every
//! call turns it into a [`Caller`](svc_core::auth::Caller) before the domain logic in
//! [`svc_core::auth::AuthService`] runs (RBAC, storage, signing).
//!
//! Clients: [`AuthClient::connect`] with a [`ClientIdentity`] (an identity file: the admin
//! identity the Auth Service writes, a `tsh` profile, or an agent's joined identity); an agent
//! without one calls [`join`] with a token and the CA pin, then [`AuthClient::heartbeat`].
//! Clients offer the ALPN [`alpn`]`(cluster)` before `h2`, so the same client reaches the Auth
//! API directly (port 3025) or through a proxy's web port in TLS routing mode ([`auth_route`]).

mod admin;
mod client;
mod identity;
mod inventory;
#[cfg(feature = "node")]
pub mod node;
#[cfg(feature = "node")]
mod node_error;
mod proxies;
mod resources;
mod route;
mod server;
mod sso;
mod tls;
mod watch;

/// The generated protobuf messages and gRPC stubs (`proto/auth.proto`).
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod proto {
    tonic::include_proto!("svc.auth.v1");

    /// The certificates of a web API sign-in answer (`/webapi/login`, single sign-on), as the
    /// Auth API carries them.
    impl From<svc_core::webapi::LoginAnswer> for Certs {
        fn from(answer: svc_core::webapi::LoginAnswer) -> Self {
            Certs {
                name: answer.name,
                tls_cert_pem: answer.tls_cert_pem,
                ssh_cert: answer.ssh_cert,
                tls_ca_pems: answer.tls_ca_pems,
                ssh_ca_keys: answer.ssh_ca_keys,
                cluster_name: answer.cluster_name,
                not_after_unix: answer.not_after_unix,
            }
        }
    }

    use std::fmt;

    // The messages holding secrets print everything but the secret.

    impl fmt::Debug for JoinRequest {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("JoinRequest")
                .field("token", &"***")
                .field("node_name", &self.node_name)
                .field("roles", &self.roles)
                .field("additional_names", &self.additional_names)
                .finish_non_exhaustive()
        }
    }

    impl fmt::Debug for LoginRequest {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("LoginRequest")
                .field("username", &self.username)
                .field("password", &"***")
                .field("ttl_seconds", &self.ttl_seconds)
                .field("client_addr", &self.client_addr)
                .finish_non_exhaustive()
        }
    }

    impl fmt::Debug for CreateUserRequest {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("CreateUserRequest")
                .field("name", &self.name)
                .field("roles", &self.roles)
                .field("logins", &self.logins)
                .field("password", &"***")
                .finish()
        }
    }

    impl fmt::Debug for CreateTokenResponse {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("CreateTokenResponse")
                .field("token", &"***")
                .field("expires_unix", &self.expires_unix)
                .finish()
        }
    }

    impl fmt::Debug for SsoBeginRequest {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            // The loopback URL carries the key the result is sealed with.
            f.debug_struct("SsoBeginRequest")
                .field("kind", &self.kind)
                .field("connector", &self.connector)
                .field("client_redirect_url", &"***")
                .field("ttl_seconds", &self.ttl_seconds)
                .finish_non_exhaustive()
        }
    }

    impl fmt::Debug for SsoCallbackRequest {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            // The query carries the authorization code.
            f.debug_struct("SsoCallbackRequest")
                .field("kind", &self.kind)
                .field("query", &"***")
                .field("form", &"***")
                .finish()
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn secret_messages_redact_in_debug() {
            let login = super::LoginRequest {
                username: "alice".into(),
                password: "hunter2hunter2".into(),
                ..Default::default()
            };
            let join = super::JoinRequest {
                token: "abcdef0123456789".into(),
                ..Default::default()
            };
            let user = super::CreateUserRequest {
                password: "hunter2hunter2".into(),
                ..Default::default()
            };
            let token = super::CreateTokenResponse {
                token: "abcdef0123456789".into(),
                expires_unix: 1,
            };
            let all = format!("{login:?} {join:?} {user:?} {token:?}");
            assert!(all.contains("alice"));
            assert!(!all.contains("hunter2") && !all.contains("abcdef"), "{all}");
        }
    }
}

pub use admin::{AdminError, Invite, generate_password};
pub use client::{
    AuthClient, ClientError, FAILOVER_CONNECT_TIMEOUT, FailoverClient, JoinParams, join, join_any, join_via,
};
pub use identity::{ClientIdentity, IdentityFileError, KeyMaterial, TrustedCaPem};
#[cfg(feature = "node")]
pub use node_error::NodeError;
#[cfg(feature = "node")]
pub(crate) use node_error::bind;
pub use resources::Resolved;
pub use route::{alpn, auth_route, auth_route_any};
pub use server::{
    AuthGrpc, GRPC_KEEPALIVE, HANDSHAKE_TIMEOUT, ServeError, serve, serve_with, serve_with_idle,
    server_identity,
};
