//! Node RBAC on the SSH path: who decides whether a user may open a session on a node.
//!
//! Where it sits: the proxy's SSH entry ([`ProxySsh`](crate::proxy::ssh::ProxySsh)) asks before it dials a
//! node, and the node's SSH Service ([`SshServer`](crate::agent::ssh::SshServer)) asks again before it
//! starts anything (defence in depth: a client that reaches a node's own listener, or a proxy
//! that skipped the check, meets the same rule). Both ask a [`NodeAuthorizer`]; in a cluster it
//! is the Auth Service's `AuthorizeNode` call ([`AuthNodeAuthorizer`]), which applies the one
//! rule, [`RoleSet::check_node`](svc_core::rbac::RoleSet::check_node), to the user's current
//! roles and the node's announced labels. When the question cannot be answered (the Auth
//! Service is unreachable), the answer is a refusal: fail closed. A node's authorizer for the
//! sessions that came through the cluster's proxy ([`AuthNodeAuthorizer::with_outage_grace`])
//! makes one exception: a grant the Auth Service gave for the very same certificate, node and
//! login less than [`OUTAGE_GRACE`] ago still counts while the Auth Service cannot decide
//! (unreachable, or failing on its side, as while its storage elects a leader),
//! so a short outage does not stop sessions the proxy (deciding from its own watched copy)
//! lets through. A refusal, and any answer the Auth Service gives, always wins; a client on
//! the node's own listener never gets the exception.

use std::{collections::HashMap, future::Future, pin::Pin, sync::Arc, time::Duration};

use russh::keys::Certificate;
use svc_core::auth::ResourceRoute;
use tokio::sync::Mutex;

use crate::{
    auth::{AuthClient, ClientIdentity, FailoverClient},
    dial::ProxyDialer,
};

/// The answer to an authorization question: the route to the one agent holding the node
/// name (a proxy dials its `server_id`), or the refusal text naming the node and the reason.
pub type NodeDecision = Result<ResourceRoute, String>;

/// A boxed future of a [`NodeDecision`].
pub type NodeDecisionFuture = Pin<Box<dyn Future<Output = NodeDecision> + Send>>;

/// Decides whether the holder of a user certificate may open an SSH session on a node as a
/// login. Implementations must fail closed: when they cannot decide, they refuse.
pub trait NodeAuthorizer: Send + Sync + 'static {
    /// Whether the holder of `user_cert` may log in to `node` (a node name, host ID or UUID;
    /// a node asking about itself passes its host ID) as `login`.
    fn authorize(self: Arc<Self>, user_cert: Certificate, node: String, login: String) -> NodeDecisionFuture;
}

/// How long a grant from the Auth Service still counts when the Auth Service cannot be
/// reached (see the module docs).
pub const OUTAGE_GRACE: Duration = Duration::from_secs(300);

/// Recent grants: (certificate, node, login) → the route and when it was granted.
type RecentGrants = HashMap<(String, String, String), (ResourceRoute, tokio::time::Instant)>;

/// At most this many recent grants are remembered.
const MAX_RECENT: usize = 4096;

/// Asks the Auth Service (`AuthorizeNode`) with a cluster member's identity: a proxy's (any
/// node) or a node's (itself). Connects on first use and again after a failed call.
pub struct AuthNodeAuthorizer {
    identity: ClientIdentity,
    /// The Auth Service's addresses, tried in turn when connecting.
    addrs: Vec<String>,
    dialer: Option<ProxyDialer>,
    client: Mutex<Option<AuthClient>>,
    /// Recent grants: (certificate, node, login) → the route and when it was granted.
    recent: std::sync::Mutex<RecentGrants>,
    /// How long a grant counts while the Auth Service cannot be reached (`None`: never).
    grace: Option<Duration>,
}

impl std::fmt::Debug for AuthNodeAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthNodeAuthorizer")
            .field("host", &self.identity.name)
            .field("auth_addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl AuthNodeAuthorizer {
    /// Asks the Auth Service at `identity.auth_addr`, dialing through `dialer` when given.
    pub fn new(identity: ClientIdentity, dialer: Option<ProxyDialer>) -> Arc<Self> {
        let addrs = vec![identity.auth_addr.clone()];
        Self::at(addrs, identity, dialer, false)
    }

    /// Like [`new`](Self::new), for the sessions that came through the cluster's proxy: a grant
    /// less than [`OUTAGE_GRACE`] old for the same certificate, node and login still counts
    /// while the Auth Service cannot be reached.
    pub fn with_outage_grace(identity: ClientIdentity, dialer: Option<ProxyDialer>) -> Arc<Self> {
        let addrs = vec![identity.auth_addr.clone()];
        Self::at(addrs, identity, dialer, true)
    }

    /// Asks the Auth Service at the first of `addrs` that answers (a node joined directly to one
    /// of several Auth Services), with the [`OUTAGE_GRACE`] exception when `outage_grace`.
    pub fn at(
        addrs: Vec<String>,
        identity: ClientIdentity,
        dialer: Option<ProxyDialer>,
        outage_grace: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            identity,
            addrs,
            dialer,
            client: Mutex::new(None),
            recent: std::sync::Mutex::new(HashMap::new()),
            grace: outage_grace.then_some(OUTAGE_GRACE),
        })
    }

    /// Asks with an already connected client.
    pub fn with_client(identity: ClientIdentity, client: AuthClient) -> Arc<Self> {
        Arc::new(Self {
            addrs: vec![identity.auth_addr.clone()],
            identity,
            dialer: None,
            client: Mutex::new(Some(client)),
            recent: std::sync::Mutex::new(HashMap::new()),
            grace: None,
        })
    }

    async fn ask(&self, user_cert: &Certificate, node: &str, login: &str) -> NodeDecision {
        let key = (
            user_cert.to_openssh().unwrap_or_default(),
            node.to_owned(),
            login.to_owned(),
        );
        let answer = self.ask_auth(user_cert, node, login).await;
        let Some(grace) = self.grace else {
            return answer.unwrap_or_else(|(cannot, _)| Err(cannot));
        };
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match answer {
            Ok(Ok(route)) => {
                if recent.len() >= MAX_RECENT {
                    recent.retain(|_, (_, at)| at.elapsed() < grace);
                }
                if recent.len() < MAX_RECENT {
                    recent.insert(key, (route.clone(), tokio::time::Instant::now()));
                }
                Ok(route)
            }
            Ok(Err(refusal)) => {
                recent.remove(&key);
                Err(refusal)
            }
            Err((cannot, false)) => Err(cannot),
            Err((cannot, true)) => match recent.get(&key) {
                Some((route, at)) if at.elapsed() < grace && !key.0.is_empty() => {
                    tracing::warn!(%node, %login, reason = %cannot, "the Auth Service cannot be reached: using its grant from {:?} ago", at.elapsed());
                    Ok(route.clone())
                }
                _ => Err(cannot),
            },
        }
    }

    /// The Auth Service's answer (inner), or why it could not be asked (outer error, with
    /// whether the Auth Service could not decide at all: unreachable, or reachable but failing
    /// on its side, as when its storage is unavailable — see [`could_not_decide`]).
    async fn ask_auth(
        &self,
        user_cert: &Certificate,
        node: &str,
        login: &str,
    ) -> Result<NodeDecision, (String, bool)> {
        let cannot = |e: &dyn std::fmt::Display| {
            format!("access to node \"{node}\" cannot be authorized now (refused): {e}")
        };
        let mut guard = self.client.lock().await;
        let client = match guard.as_mut() {
            Some(c) => c,
            None => {
                let (c, _) = AuthClient::connect_any(&self.addrs, &self.identity, self.dialer.as_ref())
                    .await
                    .map_err(|e| (cannot(&e), could_not_decide(&e)))?;
                guard.insert(c)
            }
        };
        match client.authorize_node(user_cert, node, login).await {
            Ok(answer) => Ok(answer),
            Err(e) => {
                // Reconnect on the next question.
                *guard = None;
                Err((cannot(&e), could_not_decide(&e)))
            }
        }
    }
}

/// Whether `e` means the Auth Service could not decide (so a recent grant may stand in for its
/// answer), rather than that it refused the question: it could not be reached, or it answered
/// that it failed on its side (its storage unavailable during an etcd election, a deadline, an
/// internal error). A denial is never an error: it comes as an answer. Errors about the question
/// itself (an invalid certificate, a caller without the right) are not outages.
pub(crate) fn could_not_decide(e: &crate::auth::ClientError) -> bool {
    use tonic::Code;
    FailoverClient::is_transport_failure(e)
        || matches!(
            e.code(),
            Some(
                Code::Unavailable
                    | Code::Internal
                    | Code::DeadlineExceeded
                    | Code::ResourceExhausted
                    | Code::Aborted
                    | Code::Cancelled
            )
        )
}

impl NodeAuthorizer for AuthNodeAuthorizer {
    fn authorize(self: Arc<Self>, user_cert: Certificate, node: String, login: String) -> NodeDecisionFuture {
        Box::pin(async move { self.ask(&user_cert, &node, &login).await })
    }
}

/// How often an open session asks its [`NodeAuthorizer`] again by default. The node ends a
/// refused session at its next check; the proxy's SSH entry gives the node one more interval
/// and then closes the pipe itself: a lock, a deleted user or a removed role ends an open
/// session within two intervals (40 seconds), well within a minute.
pub const DEFAULT_RECHECK_INTERVAL: Duration = Duration::from_secs(20);

/// Asks `authorizer` again every `every` whether the user holding `user_cert` may still be on
/// `node` as `login`; returns the refusal text when the answer becomes a refusal (a lock, a
/// deleted user, a removed role, or an Auth Service that cannot be reached: fail closed).
/// Never returns while access is granted: callers select it against the session.
pub(crate) async fn refused_later(
    authorizer: Arc<dyn NodeAuthorizer>,
    user_cert: Certificate,
    node: String,
    login: String,
    every: Duration,
) -> String {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let answer = authorizer
            .clone()
            .authorize(user_cert.clone(), node.clone(), login.clone())
            .await;
        if let Err(refusal) = answer {
            return refusal;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ClientError;

    fn status(code: tonic::Code) -> ClientError {
        ClientError::Status {
            code,
            message: "x".into(),
        }
    }

    #[test]
    fn failures_on_the_auth_services_side_are_outages_and_refusals_are_not() {
        // Its storage unavailable (an etcd election), overloaded, out of time: it could not
        // decide, so a recent grant may stand in for a session that came through the proxy.
        for code in [
            tonic::Code::Unavailable,
            tonic::Code::Internal,
            tonic::Code::DeadlineExceeded,
            tonic::Code::ResourceExhausted,
            tonic::Code::Unknown,
        ] {
            assert!(could_not_decide(&status(code)), "{code:?}");
        }
        // Answers about the question or the caller: never treated as an outage.
        for code in [
            tonic::Code::PermissionDenied,
            tonic::Code::Unauthenticated,
            tonic::Code::InvalidArgument,
            tonic::Code::NotFound,
        ] {
            assert!(!could_not_decide(&status(code)), "{code:?}");
        }
        assert!(!could_not_decide(&ClientError::Invalid("bad".into())));
    }
}
