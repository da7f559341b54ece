//! The reverse tunnel: agents dial out to the proxy and keep one multiplexed SSH connection over
//! which the proxy reaches their resources.
//!
//! Where it sits in the data flow: on the proxy, a handler (`ssh::proxy` for SSH clients)
//! asks the [`TunnelDialer`] for a stream to `node-1:3022`; the dialer finds the agent in the
//! [`AgentRegistry`] that the [`TunnelServer`] fills as agents connect, and opens a transport
//! channel on that agent's tunnel. On the agent, [`TunnelAgent`] keeps the tunnel up (find the
//! address from `/webapi/ping`, dial through [`ProxyDialer`](crate::dial::ProxyDialer) —
//! directly or via HTTP CONNECT — then SSH on 3024 or SSH inside TLS with ALPN
//! `svc-reversetunnel`) and hands every transport channel to a caller-supplied
//! `tower::Service<DialRequest>` (the SSH Service is one) whose stream it pipes to the channel.
//!
//! # Wire protocol
//!
//! SSH via russh. The agent is the SSH client, user = its host ID, authenticated with its
//! cluster-signed OpenSSH host certificate; the proxy presents its own host certificate
//! (`<proxy-id>.<cluster>`, role `proxy`) and each side verifies the other with the host CA.
//!
//! russh supports neither custom global requests nor custom channel types opened by the
//! server, so the messages map onto standard channel types, each named by its address field:
//!
//! | message | direction | SSH form |
//! |---|---|---|
//! | heartbeat | agent → proxy | `direct-streamlocal@openssh.com` to [`HEARTBEAT_CHANNEL`]: a `ping` line right away, then one per keep-alive interval |
//! | discovery | agent → proxy | `direct-streamlocal@openssh.com` to [`DISCOVERY_CHANNEL`]: the proxy writes JSON lines, each the full list of proxies ([`Discovery`]) |
//! | ping | agent → proxy, proxies that know it | a `direct-streamlocal@openssh.com` open to [`PING_CHANNEL`], right away and then once per keep-alive interval: a heartbeat, which the proxy answers by refusing the channel with [`PING_ANSWER`]. A proxy that refuses it as an unknown channel type predates it: the agent keeps the heartbeat and discovery channels above open instead |
//! | discovery, pushed | proxy → agent, agents with [`CAP_DISCOVERY_PUSH`] | a `forwarded-tcpip` open from [`DISCOVERY_CHANNEL`], the originator address being the JSON list of proxies with its generation ([`Discovery`] and `generation`); the agent takes it and refuses the channel. Sent at registration, after each ping and when the list changes; the agent takes a list only if its generation is newer than the last it took from that proxy |
//! | version query | proxy → agent | `forwarded-streamlocal@openssh.com` from [`VERSION_REQUEST`]: the agent writes its version and closes |
//! | reconnect request | proxy → agent | `forwarded-streamlocal@openssh.com` from [`RECONNECT_REQUEST`]: the agent drains and dials again |
//! | any other request | proxy → agent | refused (the "answered false" of a global request) |
//! | capabilities | proxy → agent | `forwarded-streamlocal@openssh.com` from [`CAPABILITIES_REQUEST`]: the agent writes the words of what it supports ([`CAP_OPEN_DIAL`]) and closes; agents that predate it refuse the channel (no capabilities) |
//! | dial, in the open | proxy → agent, agents with [`CAP_OPEN_DIAL`] | `forwarded-tcpip` from [`OPEN_DIAL_CHANNEL`], the originator address being the JSON [`DialRequest`]: the agent dials the target first, then confirms the channel (which carries the connection's bytes at once) or answers an open failure ([`DialFailure`]'s code, the reason text as description) |
//! | dial, in the open, with a status | proxy → agent, agents with [`CAP_DIAL_STATUS`] | `forwarded-tcpip` from [`OPEN_DIAL_STATUS_CHANNEL`], the originator address being the JSON [`DialRequest`]: the agent dials the target first, then confirms the channel and writes one status line right behind the confirmation — `ok` (then the connection's bytes) or `error <code> <reason>` ([`DialFailure`]'s code, the agent's reason) and closes |
//! | dial, on the channel | proxy → agent, older agents | `forwarded-tcpip` from [`TRANSPORT_CHANNEL`]: one JSON [`DialRequest`] line, then the agent answers one line — `ok` or the failure text — and, on `ok`, the channel carries the connection's bytes |
//!
//! An idle tunnel of an agent that pings holds no channel open: the proxy keeps nothing per
//! tunnel for its heartbeats and discovery but the SSH session itself (an open channel costs
//! the proxy its message queue and a task; docs/performance.md, "Memory per idle tunnel").
//! Pings and pushes are channel opens that are refused, so that no channel is ever closed for
//! them: russh keeps a channel that its own side closed first in its table until the session
//! ends (docs/upstream/russh-close-first.patch), a leak per ping if pings were channels.
//!
//! A dial in the open costs one round trip on the tunnel (open → confirmation) instead of two
//! (open → confirmation, request → answer), and the agent dials its target while the proxy
//! waits for the confirmation. The proxy queries the capabilities once per tunnel, right after
//! the version, and dials an agent that does not name [`CAP_OPEN_DIAL`] the older way.
//!
//! The SSH library drops an open failure's description on the receiving side (only the reason
//! code reaches the proxy), so an agent refusing a dial in the open could name only a category
//! of failure. Agents that name [`CAP_DIAL_STATUS`] are dialed on [`OPEN_DIAL_STATUS_CHANNEL`]
//! instead: the status line travels in the same flight as the confirmation (no extra round
//! trip), and a refusal carries the agent's reason — why the target could not be reached — to
//! the user. The proxy treats that reason as untrusted text: control and invisible formatting
//! characters are escaped and it is cut to [`MAX_DIAL_REASON`] bytes
//! ([`sanitize_dial_reason`]).
//!
//! An agent whose version is incompatible with the cluster's is disconnected with a message
//! saying why (`SSH_MSG_DISCONNECT` description); the agent logs it.

mod agent;
mod backoff;
mod direct;
pub mod peer;
mod readbuf;
mod registry;
mod server;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use svc_core::auth::ServedKind;

pub use crate::ssh::{CIPHERS, DEFAULT_SSH_AUTH_TIMEOUT, SERVER_KEEPALIVE_MAX, Tunables};
pub use agent::{AgentConfig, AgentStatus, DialService, RunningAgent, TunnelAgent, tunnel_addr_from_ping};
pub use backoff::Backoff;
#[cfg(feature = "node")]
pub(crate) use direct::direct_handler;
pub use direct::{
    DIRECT_DIAL_TIMEOUT, DirectDialer, DirectLookup, DirectTarget, agent_tls, serve_direct, serve_direct_with,
};
pub use peer::{
    Peer, PeerDialer, PeerError, PeerIdentity, PeerKeys, agent_proxies, serve_peers, serve_peers_with_keys,
};
pub use registry::{AgentInfo, AgentRegistry};
pub use server::{
    DEFAULT_ATTACH_WAIT, DEFAULT_TUNNEL_DRAIN, HANDSHAKES_PER_CPU, TunnelDialer, TunnelServer,
    TunnelServerConfig, TunnelStream, default_max_handshakes,
};
pub use svc_core::config::TunnelStrategy;

/// Wraps an async function as the [`DialService`] an agent serves dial requests with.
pub fn dial_service_fn<F, Fut>(f: F) -> DialService
where
    F: Fn(DialRequest) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<crate::io::BoxIo, tower::BoxError>> + Send + 'static,
{
    tower::util::BoxCloneSyncService::new(tower::service_fn(f))
}

/// The heartbeat channel's address (agent → proxy).
pub const HEARTBEAT_CHANNEL: &str = "heartbeat@svc.dev";
/// The discovery channel's address (agent → proxy).
pub const DISCOVERY_CHANNEL: &str = "discovery@svc.dev";
/// The ping channel's address (agent → proxy): a heartbeat, answered with [`PING_ANSWER`].
pub const PING_CHANNEL: &str = "ping@svc.dev";
/// How the proxy answers a ping: it refuses the channel with this reason (proxies that predate
/// pings refuse it as an unknown channel type). Agents refuse a push the same way.
pub const PING_ANSWER: russh::ChannelOpenFailure = russh::ChannelOpenFailure::ConnectFailed;
/// The capability of taking discovery pushed by the proxy ([`DISCOVERY_CHANNEL`], proxy →
/// agent): an agent that names it and whose pings the proxy answers keeps no channel open.
pub const CAP_DISCOVERY_PUSH: &str = "discovery-push";
/// The version query (proxy → agent).
pub const VERSION_REQUEST: &str = "version@svc.dev";
/// The reconnect request (proxy → agent).
pub const RECONNECT_REQUEST: &str = "reconnect@svc.dev";
/// The transport channel's connected address (proxy → agent).
pub const TRANSPORT_CHANNEL: &str = "transport@svc.dev";
/// The connected address of a transport channel whose open message carries the dial request
/// (proxy → agent, agents with [`CAP_OPEN_DIAL`]).
pub const OPEN_DIAL_CHANNEL: &str = "dial@svc.dev";
/// The capabilities query (proxy → agent).
pub const CAPABILITIES_REQUEST: &str = "capabilities@svc.dev";
/// The capability of serving dials carried in the channel-open message ([`OPEN_DIAL_CHANNEL`]).
pub const CAP_OPEN_DIAL: &str = "open-dial";
/// The connected address of a transport channel whose open message carries the dial request
/// and whose first line is the agent's status (proxy → agent, agents with [`CAP_DIAL_STATUS`]).
pub const OPEN_DIAL_STATUS_CHANNEL: &str = "dial-status@svc.dev";
/// The capability of serving dials on [`OPEN_DIAL_STATUS_CHANNEL`]: a refusal's reason reaches
/// the proxy.
pub const CAP_DIAL_STATUS: &str = "dial-status";
/// The longest refusal reason the proxy reports from an agent, in bytes (after escaping).
pub const MAX_DIAL_REASON: usize = 512;
/// The longest status line the proxy reads from an agent: `error`, a code and an escaped
/// reason of [`MAX_DIAL_REASON`] bytes fit with room to spare.
const MAX_DIAL_STATUS_LINE: usize = 2 * MAX_DIAL_REASON;
/// What a draining agent answers to new work.
pub(crate) const DRAINING: &str = "agent connection is draining";
/// The agent's answer to a dial request that succeeded.
pub(crate) const DIAL_OK: &str = "ok";
/// Read buffer between the TCP stream and TLS on the single-port path. rustls reads at most
/// 4 KiB per `read` call, so without it an SSH packet of 32 KiB costs about eight `recv`
/// system calls; with it, one `recv` fills 64 KiB and rustls copies out of memory
/// (docs/performance.md, "Reverse tunnel"). The buffer exists only while bytes flow
/// ([`readbuf::IdleReadBuffer`]): an idle tunnel holds none (docs/performance.md, "Scale").
pub(crate) const TLS_READ_BUFFER: usize = 64 * 1024;
/// Dial requests longer than this are refused (a JSON object of a few addresses).
pub const MAX_DIAL_REQUEST: usize = 8 * 1024;

/// A dial request, as the proxy sends it down a transport channel.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DialRequest {
    /// The resource address on the agent's side (`host:port`).
    pub address: String,
    /// The agent's host ID, `<uuid>.<cluster>`.
    pub server_id: String,
    /// The kind of resource, named as everywhere else (`node`, `app`, `kube`, `db`,
    /// `windows_desktop`).
    pub conn_type: ServedKind,
    /// The client's address as the proxy saw it.
    pub client_src_addr: String,
    /// The address the client connected to on the proxy.
    pub client_dst_addr: String,
    /// For `db` dials: the database user (and database name) the proxy authorised for this
    /// connection. The agent's Database Service opens the server session as this user and
    /// refuses a client whose protocol-level user or database differs. Absent on other kinds
    /// (and omitted on the wire, so agents that predate it read the request unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_route: Option<DbRoute>,
}

/// The database identity a `db` dial is authorised for (carried in [`DialRequest::db_route`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DbRoute {
    /// The database user the session runs as (checked against the role's `db_users`).
    pub user: String,
    /// The database name, for protocols that have one (checked against the role's `db_names`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
}

impl DialRequest {
    /// Decodes a dial request line as the agent reads it from a transport channel: one JSON
    /// object (the line without its `\n`), at most [`MAX_DIAL_REQUEST`] bytes.
    ///
    /// The bytes come from the other end of the tunnel; this never panics on any input (fuzzed
    /// in `svc-net/fuzz`).
    pub fn decode(line: &str) -> Result<Self, DialRequestError> {
        if line.len() > MAX_DIAL_REQUEST {
            return Err(DialRequestError::TooLong(line.len()));
        }
        serde_json::from_str(line).map_err(|e| DialRequestError::Malformed(e.to_string()))
    }
}

/// Why an agent refused a dial carried in the channel-open message: the open failure's reason
/// code (the description carries the agent's text, which the agent also logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DialFailure {
    /// The agent's service could not reach the target (`SSH_OPEN_CONNECT_FAILED`).
    ConnectFailed,
    /// The request was malformed or refused (`SSH_OPEN_ADMINISTRATIVELY_PROHIBITED`).
    Refused,
    /// The agent's connection is draining (`SSH_OPEN_RESOURCE_SHORTAGE`).
    Draining,
}

impl DialFailure {
    /// The SSH open failure reason code.
    pub fn code(self) -> u32 {
        match self {
            DialFailure::Refused => 1,
            DialFailure::ConnectFailed => 2,
            DialFailure::Draining => 4,
        }
    }

    /// The failure an open failure's reason code names.
    pub fn from_code(code: u32) -> Self {
        match code {
            2 => DialFailure::ConnectFailed,
            4 => DialFailure::Draining,
            _ => DialFailure::Refused,
        }
    }

    /// What the proxy reports for it when the agent's own text is not at hand: an agent
    /// without [`CAP_DIAL_STATUS`] sends it as the open failure's description, which the SSH
    /// library on the proxy does not hand on; the agent logs it.
    pub fn text(self) -> &'static str {
        match self {
            DialFailure::ConnectFailed => "the agent could not open it (the agent's log names the cause)",
            DialFailure::Refused => "the agent refused the dial request (the agent's log names the cause)",
            DialFailure::Draining => DRAINING,
        }
    }
}

/// Makes an agent's refusal reason fit to show a user: control characters (line ends,
/// terminal escapes) and invisible formatting characters (bidirectional overrides, zero-width
/// characters) are escaped as `\u{..}`, and the text is cut on a character boundary so that
/// it holds at most [`MAX_DIAL_REASON`] bytes, a cut one ending in `...`.
pub fn sanitize_dial_reason(text: &str) -> String {
    const CUT: &str = "...";
    let mut out = String::with_capacity(text.len().min(MAX_DIAL_REASON));
    for c in text.chars() {
        let invisible = matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}');
        let piece = if c.is_control() || invisible {
            c.escape_unicode().to_string()
        } else {
            c.to_string()
        };
        if out.len() + piece.len() > MAX_DIAL_REASON {
            while out.len() + CUT.len() > MAX_DIAL_REASON {
                out.pop();
            }
            out.push_str(CUT);
            return out;
        }
        out.push_str(&piece);
    }
    out
}

/// The status line an agent with [`CAP_DIAL_STATUS`] writes behind its confirmation.
pub(crate) fn dial_status_line(outcome: Result<(), (DialFailure, &str)>) -> String {
    match outcome {
        Ok(()) => format!("{DIAL_OK}\n"),
        Err((failure, reason)) => format!("error {} {}\n", failure.code(), sanitize_dial_reason(reason)),
    }
}

/// Reads the status line an agent with [`CAP_DIAL_STATUS`] writes behind its confirmation:
/// `Ok` for `ok` (the stream then carries the connection), the failure and its reason
/// (sanitised) for `error <code> <reason>`, an I/O error for anything else.
pub(crate) async fn read_dial_status<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Result<(), (DialFailure, String)>> {
    let Some(line) = read_line(r, MAX_DIAL_STATUS_LINE).await? else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the agent closed the channel before its dial status",
        ));
    };
    if line == DIAL_OK {
        return Ok(Ok(()));
    }
    let malformed = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("malformed dial status {:?}", sanitize_dial_reason(&line)),
        )
    };
    let rest = line.strip_prefix("error ").ok_or_else(malformed)?;
    let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    let code: u32 = code.parse().map_err(|_| malformed())?;
    let failure = DialFailure::from_code(code);
    let reason = if reason.trim().is_empty() {
        failure.text().to_owned()
    } else {
        sanitize_dial_reason(reason)
    };
    Ok(Err((failure, reason)))
}

/// Why a dial request line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DialRequestError {
    /// The line is longer than [`MAX_DIAL_REQUEST`].
    #[error("dial request of {0} bytes is longer than the {MAX_DIAL_REQUEST}-byte limit")]
    TooLong(usize),
    /// The line is not a dial request's JSON.
    #[error("malformed dial request: {0}")]
    Malformed(String),
}

/// A proxy an agent should keep a tunnel to, as the discovery channel announces it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DiscoveredProxy {
    /// The proxy's host ID.
    pub proxy_id: String,
    /// Where to dial its tunnel (`host:port`).
    pub tunnel_addr: String,
    /// Whether that address is a TLS-routing port (SSH inside TLS with ALPN).
    pub tls_routing: bool,
}

/// The discovery channel's message: proxies of the cluster.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Discovery {
    /// The proxies.
    pub proxies: Vec<DiscoveredProxy>,
    /// Whether `proxies` is every live proxy of the cluster (the proxies' registry, announcing
    /// proxy included): the agent then drops its tunnels to proxies that no complete list
    /// names. A list that is not complete only adds proxies (older proxies send no such field).
    #[serde(default)]
    pub complete: bool,
    /// With proxy peering: the host IDs of the proxies (among `proxies`) this agent should
    /// keep a tunnel to; the others are where to turn when those are out of reach. `None`
    /// (and from older proxies): every proxy listed. Older agents ignore it and hold every
    /// proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Vec<String>>,
}

/// A list of proxies as a push carries it: the [`Discovery`] with the proxy's generation of it
/// (increasing in the proxy's life), so that an agent never applies an older list after a
/// newer one that overtook it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct GenerationalDiscovery {
    #[serde(flatten)]
    pub(crate) discovery: Discovery,
    pub(crate) generation: u64,
}

/// Why a tunnel operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TunnelError {
    /// No connected agent answers to the requested server.
    #[error("no agent tunnel for server {0:?} (is the agent connected?)")]
    NoAgent(String),
    /// The agent's connection went away.
    #[error("the tunnel to {server} is closed: {reason}")]
    Closed {
        /// The server.
        server: String,
        /// What happened.
        reason: String,
    },
    /// The agent refused or failed the dial.
    #[error("agent {server} could not dial {address}: {reason}")]
    DialRefused {
        /// The server.
        server: String,
        /// The address requested.
        address: String,
        /// The agent's text.
        reason: String,
    },
    /// The proxy's ping could not be fetched or read.
    #[error("fetching {url}: {reason}")]
    Ping {
        /// The URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// Dialing the proxy failed.
    #[error("dialing the proxy at {addr}: {source}")]
    Dial {
        /// The address.
        addr: String,
        /// The cause.
        source: crate::dial::Error,
    },
    /// TLS to the proxy failed.
    #[error("TLS to {addr}: {source}")]
    Tls {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Reaching the proxy's router over TLS failed, directly or through the connection
    /// upgrade (behind a load balancer that terminates TLS).
    #[error("{0}")]
    Upgrade(Box<crate::conn_upgrade::UpgradeError>),
    /// The SSH layer failed.
    #[error("ssh: {0}")]
    Ssh(#[from] russh::Error),
    /// The proxy closed the tunnel and said why (an incompatible version, a shutdown).
    #[error("the proxy closed the reverse tunnel: {0}")]
    ProxyClosed(String),
    /// The dial reached a proxy another of the agent's tunnels already holds (proxies behind
    /// one load balancer address); the new connection was closed.
    #[error("already holding a tunnel to proxy {0}")]
    AlreadyHeld(String),
    /// The proxy refused the agent's credentials.
    #[error("the proxy at {0} refused the agent's host certificate")]
    AuthRefused(String),
    /// The agent holds no tunnel here and no peer proxy reached it (proxy peering).
    #[error(transparent)]
    Peering(#[from] PeerError),
    /// A deadline passed.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What was being done.
        what: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// An I/O error on a channel.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// A malformed message.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// Which message.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl From<TunnelError> for std::io::Error {
    fn from(e: TunnelError) -> Self {
        std::io::Error::other(e)
    }
}

/// Reads one `\n`-terminated line of at most `max` bytes (without the newline), byte by byte
/// so that nothing after the line is consumed: the rest of the stream belongs to the caller.
pub(crate) async fn read_line<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<String>> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::with_capacity(64);
    loop {
        let mut b = [0u8; 1];
        if r.read(&mut b).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "line cut short",
                ))
            };
        }
        if b[0] == b'\n' {
            return String::from_utf8(buf)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        }
        if buf.len() >= max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line longer than {max} bytes"),
            ));
        }
        buf.push(b[0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dial_reason_is_escaped_and_cut() {
        assert_eq!(
            sanitize_dial_reason("dialing 127.0.0.1:1: Connection refused (os error 111)"),
            "dialing 127.0.0.1:1: Connection refused (os error 111)"
        );
        assert_eq!(
            sanitize_dial_reason("a\nb\x1b[31mred\u{202E}\u{7f}é"),
            "a\\u{a}b\\u{1b}[31mred\\u{202e}\\u{7f}é"
        );
        let long = sanitize_dial_reason(&"é".repeat(1000));
        assert!(long.len() <= MAX_DIAL_REASON, "{}", long.len());
        assert!(long.ends_with("..."), "{long}");
        let escapes = sanitize_dial_reason(&"\x07".repeat(1000));
        assert!(
            escapes.len() <= MAX_DIAL_REASON && escapes.ends_with("..."),
            "{escapes}"
        );
        assert_eq!(
            sanitize_dial_reason(&escapes),
            escapes,
            "sanitising twice changes nothing"
        );
    }

    #[tokio::test]
    async fn dial_status_lines_round_trip() {
        let mut ok = format!("{}rest", dial_status_line(Ok(()))).into_bytes();
        let mut r = &ok[..];
        assert_eq!(read_dial_status(&mut r).await.unwrap(), Ok(()));
        assert_eq!(r, b"rest", "nothing after the status line is consumed");
        ok.clear();

        let line = dial_status_line(Err((DialFailure::ConnectFailed, "dialing x:1: refused\r\n")));
        let got = read_dial_status(&mut line.as_bytes()).await.unwrap();
        assert_eq!(
            got,
            Err((
                DialFailure::ConnectFailed,
                "dialing x:1: refused\\u{d}\\u{a}".to_owned()
            ))
        );

        // An agent that skips sanitising is escaped and cut by the reader.
        let raw = format!("error 1 {}\x1b\n", "x".repeat(900));
        let (failure, reason) = read_dial_status(&mut raw.as_bytes()).await.unwrap().unwrap_err();
        assert_eq!(failure, DialFailure::Refused);
        assert!(
            reason.len() <= MAX_DIAL_REASON && reason.ends_with("..."),
            "{reason}"
        );
        assert!(!reason.contains('\x1b'), "{reason}");

        // An empty reason falls back to the category; garbage and a missing line are errors.
        let (_, reason) = read_dial_status(&mut &b"error 4\n"[..])
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(reason, DRAINING);
        assert!(read_dial_status(&mut &b"hello\n"[..]).await.is_err());
        assert!(read_dial_status(&mut &b""[..]).await.is_err());
        let huge = format!("error 2 {}\n", "y".repeat(4 * MAX_DIAL_REASON));
        assert!(
            read_dial_status(&mut huge.as_bytes()).await.is_err(),
            "an over-long line is refused"
        );
    }

    #[test]
    fn dial_request_json_matches_the_reference() {
        let req = DialRequest {
            address: "node-1:3022".into(),
            server_id: "6f1c.example.com".into(),
            conn_type: ServedKind::WindowsDesktop,
            client_src_addr: "10.0.0.1:5000".into(),
            client_dst_addr: "10.0.0.2:443".into(),
            db_route: None,
        };
        let json = serde_json::to_value(&req).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"address": "node-1:3022", "server_id": "6f1c.example.com",
                "conn_type": "windows_desktop", "client_src_addr": "10.0.0.1:5000",
                "client_dst_addr": "10.0.0.2:443"})
        );
        let back: DialRequest = serde_json::from_value(json).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn a_db_route_travels_in_the_dial_request_and_is_omitted_when_absent() {
        let line = r#"{"address":"db:5432","server_id":"6f1c.example.com","conn_type":"db","client_src_addr":"10.0.0.1:5000","client_dst_addr":"10.0.0.2:443","db_route":{"user":"alice","database":"orders"}}"#;
        let req = DialRequest::decode(line).unwrap();
        assert_eq!(
            req.db_route,
            Some(DbRoute {
                user: "alice".into(),
                database: Some("orders".into())
            })
        );
        let json = serde_json::to_value(DialRequest {
            db_route: None,
            ..req
        })
        .unwrap();
        assert!(json.get("db_route").is_none(), "{json}");
    }

    #[test]
    fn dial_requests_decode_and_refuse_what_is_not_one() {
        let line = r#"{"address":"node-1:3022","server_id":"6f1c.example.com","conn_type":"node","client_src_addr":"10.0.0.1:5000","client_dst_addr":"10.0.0.2:443"}"#;
        let req = DialRequest::decode(line).unwrap();
        assert_eq!(req.conn_type, ServedKind::Node);
        assert_eq!(
            DialRequest::decode(&serde_json::to_string(&req).unwrap()).unwrap(),
            req
        );
        let err = DialRequest::decode(r#"{"address":"x"}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("malformed dial request: missing field"),
            "{err}"
        );
        let long = format!("{{\"address\":\"{}\"}}", "a".repeat(MAX_DIAL_REQUEST));
        assert_eq!(
            DialRequest::decode(&long).unwrap_err(),
            DialRequestError::TooLong(long.len())
        );
    }

    #[tokio::test]
    async fn read_line_leaves_the_rest() {
        let mut data: &[u8] = b"{\"a\":1}\nrest";
        assert_eq!(
            read_line(&mut data, 100).await.unwrap().as_deref(),
            Some("{\"a\":1}")
        );
        assert_eq!(data, b"rest");
        let mut long: &[u8] = b"xxxxxxxx\n";
        assert!(read_line(&mut long, 4).await.is_err());
        let mut empty: &[u8] = b"";
        assert_eq!(read_line(&mut empty, 4).await.unwrap(), None);
    }
}
