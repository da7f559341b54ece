//! The SSH transport every SSH end of svc shares: the [`Tunables`] (window, packet size,
//! keepalives, deadlines, cipher preference) and the russh client and server configurations
//! built from them.

use std::{borrow::Cow, time::Duration};

use russh::keys::{Certificate, PrivateKey};

/// Tunnel tunables, shared by both ends.
///
/// The channel window is raised from russh's 2 MiB to 8 MiB: a tunnel carries bulk streams
/// across high bandwidth-delay paths, where the window caps a stream at window / RTT (2 MiB
/// over 50 ms is 335 Mbit/s; 8 MiB is 1.3 Gbit/s), and on loopback the larger window costs
/// nothing measurable. The packet size stays at 32 KiB: 64 KiB packets, reported to help SFTP,
/// were 10–15 % slower through the tunnel with ChaCha20-Poly1305 and equal
/// with AES-GCM here (docs/performance.md, "Reverse tunnel").
///
/// The cipher preference puts AES-GCM first ([`CIPHERS`]): with AES-NI and carry-less
/// multiply, ring's AES-GCM costs a fraction of its ChaCha20-Poly1305, whose Poly1305 is
/// portable C and took about 40 % of the bulk-transfer CPU profile (docs/performance.md).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Tunables {
    /// Per-channel receive window, bytes.
    pub window_size: u32,
    /// Largest SSH packet payload per channel message, bytes.
    pub max_packet_size: u32,
    /// Messages buffered per channel before backpressure reaches the connection.
    pub channel_buffer_size: usize,
    /// Heartbeat interval (agent) and the unit of the offline timeout (proxy).
    pub keepalive_interval: Duration,
    /// Missed heartbeats before the proxy marks an agent offline.
    pub keepalive_count: u32,
    /// Deadline for dialing and the TLS + SSH handshakes.
    pub handshake_timeout: Duration,
    /// SSH servers: how long a client has, from the first byte, to finish the SSH version and
    /// key exchange and authenticate; then it is disconnected.
    pub auth_timeout: Duration,
    /// SSH servers: how often a silent client is sent a keepalive request; after
    /// [`Tunables::server_keepalive_max`] unanswered ones the connection is closed (a dead peer).
    pub server_keepalive: Duration,
    /// SSH servers: unanswered keepalive requests after which the connection is closed
    /// (default [`SERVER_KEEPALIVE_MAX`]).
    pub server_keepalive_max: usize,
    /// SSH servers: close a session with no traffic at all for this long (`None`: never, the
    /// default, so idle shells stay open while their client is alive).
    pub idle_timeout: Option<Duration>,
    /// Ciphers offered, most preferred first (both ends; the client's order decides).
    pub ciphers: Cow<'static, [russh::cipher::Name]>,
    /// Reverse tunnels inside TLS (the proxy's single port): encrypt the SSH layer too.
    /// Off by default: the tunnel's SSH session then runs the `none` cipher inside the TLS
    /// connection, which already encrypts and authenticates every byte, so each byte is
    /// encrypted once instead of twice ([`client_config_inside_tls`]; the tunnel server's
    /// configuration inside TLS likewise). SSH's key exchange and the agent's and the proxy's
    /// certificates are checked as before. The agent decides (the client's order wins) and
    /// offers `none` only when it verified the proxy's TLS certificate; the proxy accepts it
    /// only inside TLS, never on the plain tunnel port.
    pub encrypt_inside_tls: bool,
}

/// The cipher preference of svc's SSH ends: AES-GCM (hardware AES) ahead of
/// ChaCha20-Poly1305, then russh's CTR modes. russh's own default leaves `aes128-gcm` out.
pub const CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_128_GCM,
    russh::cipher::AES_256_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_192_CTR,
    russh::cipher::AES_128_CTR,
];

/// The default of [`Tunables::auth_timeout`].
pub const DEFAULT_SSH_AUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// Unanswered keepalives after which an SSH server closes a connection (the default of
/// [`Tunables::server_keepalive_max`]).
pub const SERVER_KEEPALIVE_MAX: usize = 3;

/// The default of [`Tunables::server_keepalive`], and the longest interval an SSH session's
/// keepalives get from the configuration ([`Tunables::with_keep_alive_config`]).
pub const DEFAULT_SERVER_KEEPALIVE: Duration = Duration::from_secs(30);

impl Default for Tunables {
    fn default() -> Self {
        Self {
            window_size: 8 * 1024 * 1024,
            max_packet_size: 32 * 1024,
            channel_buffer_size: 100,
            keepalive_interval: svc_core::config::DEFAULT_KEEP_ALIVE_INTERVAL,
            keepalive_count: svc_core::config::DEFAULT_KEEP_ALIVE_COUNT_MAX,
            handshake_timeout: Duration::from_secs(30),
            auth_timeout: DEFAULT_SSH_AUTH_TIMEOUT,
            server_keepalive: DEFAULT_SERVER_KEEPALIVE,
            server_keepalive_max: SERVER_KEEPALIVE_MAX,
            idle_timeout: None,
            ciphers: Cow::Borrowed(CIPHERS),
            encrypt_inside_tls: false,
        }
    }
}

impl Tunables {
    /// Sets the heartbeat interval (tests shorten it).
    pub fn with_keepalive(mut self, interval: Duration, count: u32) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_count = count.max(1);
        self
    }

    /// Applies `auth_service.keep_alive_interval` and `keep_alive_count_max`: the reverse
    /// tunnel's heartbeats (agent) and offline timeout (proxy) are `interval` and
    /// `interval × count`, and its SSH server sends keepalives every `interval`, closing the
    /// tunnel after `count` unanswered; SSH sessions (the node, the proxy's SSH entry) send
    /// theirs every `interval` or [`DEFAULT_SERVER_KEEPALIVE`], whichever is shorter, and close
    /// after `count` unanswered. `session` says which of the two this end is.
    pub fn with_keep_alive_config(mut self, interval: Duration, count: u32, session: bool) -> Self {
        let count = count.max(1);
        self.keepalive_interval = interval;
        self.keepalive_count = count;
        self.server_keepalive = if session {
            interval.min(DEFAULT_SERVER_KEEPALIVE)
        } else {
            interval
        };
        self.server_keepalive_max = usize::try_from(count).unwrap_or(usize::MAX);
        self
    }

    /// Sets [`Tunables::auth_timeout`] (tests shorten it).
    pub fn with_auth_timeout(mut self, timeout: Duration) -> Self {
        self.auth_timeout = timeout;
        self
    }

    /// Sets [`Tunables::idle_timeout`].
    pub fn with_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Replaces the cipher preference (most preferred first).
    pub fn with_ciphers(mut self, ciphers: impl Into<Cow<'static, [russh::cipher::Name]>>) -> Self {
        self.ciphers = ciphers.into();
        self
    }

    /// Sets [`Tunables::encrypt_inside_tls`].
    pub fn with_encrypt_inside_tls(mut self, on: bool) -> Self {
        self.encrypt_inside_tls = on;
        self
    }

    /// How long an agent may stay silent before it is marked offline.
    pub fn offline_after(&self) -> Duration {
        self.keepalive_interval * self.keepalive_count
    }
}

/// The russh client configuration svc's SSH clients use: host certificates asked for (ed25519,
/// the cluster CAs' key type, ahead of plain keys), `TCP_NODELAY`, and the tunnel's window,
/// packet sizes and cipher preference (AES-GCM first). Use it for the SSH session to the node
/// over `client::connect_via_proxy`'s stream too.
pub fn client_config(tunables: &Tunables) -> russh::client::Config {
    let preferred = russh::Preferred {
        host_key_certificates: std::borrow::Cow::Borrowed(&[russh::keys::Algorithm::Ed25519]),
        cipher: without_none(tunables),
        ..Default::default()
    };
    russh::client::Config {
        preferred,
        nodelay: true,
        window_size: tunables.window_size,
        maximum_packet_size: tunables.max_packet_size,
        channel_buffer_size: tunables.channel_buffer_size,
        ..Default::default()
    }
}

/// [`client_config`] for an SSH session carried inside a TLS connection whose server
/// certificate this end verified: the `none` cipher first (the TLS layer encrypts and
/// authenticates), then [`Tunables::ciphers`] for servers that do not take it. With
/// [`Tunables::encrypt_inside_tls`] set it is [`client_config`] unchanged.
///
/// Only for a verified TLS connection: over one that accepts any certificate, a machine in the
/// middle would read and change the session.
pub fn client_config_inside_tls(tunables: &Tunables) -> russh::client::Config {
    let mut config = client_config(tunables);
    if !tunables.encrypt_inside_tls {
        config.preferred.cipher = with_none(true, &tunables.ciphers);
    }
    config
}

/// [`Tunables::ciphers`] without `none`: outside TLS an SSH session is always encrypted,
/// whatever the list says.
fn without_none(tunables: &Tunables) -> Cow<'static, [russh::cipher::Name]> {
    let ciphers = &tunables.ciphers;
    if ciphers.contains(&russh::cipher::NONE) {
        Cow::Owned(
            ciphers
                .iter()
                .copied()
                .filter(|c| *c != russh::cipher::NONE)
                .collect(),
        )
    } else {
        ciphers.clone()
    }
}

/// `ciphers` with `none` added first (`first`) or last.
fn with_none(first: bool, ciphers: &[russh::cipher::Name]) -> Cow<'static, [russh::cipher::Name]> {
    let rest = ciphers.iter().copied().filter(|c| *c != russh::cipher::NONE);
    let none = std::iter::once(russh::cipher::NONE);
    Cow::Owned(if first {
        none.chain(rest).collect()
    } else {
        rest.chain(none).collect()
    })
}

/// The russh server configuration every SSH server of this crate starts from (the tunnel server, the proxy's SSH entry, the SSH Service).
pub(crate) fn server_config(
    tunables: &Tunables,
    key: PrivateKey,
    cert: Option<Certificate>,
) -> russh::server::Config {
    let mut methods = russh::MethodSet::empty();
    methods.push(russh::MethodKind::PublicKey);
    russh::server::Config {
        server_id: russh::SshId::Standard(format!("SSH-2.0-svc_{}", svc_core::version::current()).into()),
        methods,
        auth_rejection_time: Duration::from_millis(200),
        auth_rejection_time_initial: Some(Duration::ZERO),
        keys: vec![key],
        certificates: cert.into_iter().collect(),
        window_size: tunables.window_size,
        maximum_packet_size: tunables.max_packet_size,
        channel_buffer_size: tunables.channel_buffer_size,
        inactivity_timeout: tunables.idle_timeout,
        keepalive_interval: Some(tunables.server_keepalive),
        keepalive_max: tunables.server_keepalive_max,
        nodelay: true,
        preferred: russh::Preferred {
            cipher: without_none(tunables),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// [`server_config`] for SSH sessions that arrive inside TLS (the tunnel's ALPN route): the
/// `none` cipher is accepted as well, last in the list, so only a client that asks for it gets
/// it ([`client_config_inside_tls`]). With [`Tunables::encrypt_inside_tls`] set it is
/// [`server_config`] unchanged. Never for a listener that takes plain TCP.
pub(crate) fn server_config_inside_tls(
    tunables: &Tunables,
    key: PrivateKey,
    cert: Option<Certificate>,
) -> russh::server::Config {
    let mut config = server_config(tunables, key, cert);
    if !tunables.encrypt_inside_tls {
        config.preferred.cipher = with_none(false, &tunables.ciphers);
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_prefer_aes_gcm() {
        let t = Tunables::default();
        let client = client_config(&t);
        let key = ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&[7; 32]));
        let server = server_config(&t, key, None);
        for (end, ciphers) in [
            ("client", &client.preferred.cipher),
            ("server", &server.preferred.cipher),
        ] {
            assert_eq!(
                ciphers.first(),
                Some(&russh::cipher::AES_128_GCM),
                "{end} preference: {ciphers:?}"
            );
            assert!(
                ciphers.contains(&russh::cipher::CHACHA20_POLY1305),
                "{end} still offers chacha20-poly1305 to peers without AES-GCM"
            );
        }
        let chacha_first = t.with_ciphers(vec![russh::cipher::CHACHA20_POLY1305]);
        assert_eq!(
            client_config(&chacha_first).preferred.cipher.as_ref(),
            [russh::cipher::CHACHA20_POLY1305]
        );
    }

    #[test]
    fn the_none_cipher_is_offered_only_inside_tls() {
        use russh::cipher::{AES_128_GCM, NONE};
        let key = ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&[7; 32]));
        // Even when the tunables list it, plain configurations never offer `none`.
        let listed = Tunables::default().with_ciphers(vec![NONE, AES_128_GCM]);
        assert_eq!(client_config(&listed).preferred.cipher.as_ref(), [AES_128_GCM]);
        assert_eq!(
            server_config(&listed, key.clone(), None)
                .preferred
                .cipher
                .as_ref(),
            [AES_128_GCM]
        );
        // Inside TLS the client asks for it first; the server takes it, last, so only a client
        // that asks gets it.
        let t = Tunables::default();
        let client = client_config_inside_tls(&t).preferred.cipher;
        assert_eq!(client.first(), Some(&NONE));
        assert_eq!(&client[1..], CIPHERS);
        let server = server_config_inside_tls(&t, key.clone(), None).preferred.cipher;
        assert_eq!(server.last(), Some(&NONE));
        assert_eq!(&server[..server.len() - 1], CIPHERS);
        assert_eq!(
            client_config_inside_tls(&listed).preferred.cipher.as_ref(),
            [NONE, AES_128_GCM]
        );
        // `encrypt_inside_tls`: no `none` at either end.
        let encrypt = t.with_encrypt_inside_tls(true);
        assert_eq!(
            client_config_inside_tls(&encrypt).preferred.cipher.as_ref(),
            CIPHERS
        );
        assert_eq!(
            server_config_inside_tls(&encrypt, key, None)
                .preferred
                .cipher
                .as_ref(),
            CIPHERS
        );
    }

    #[test]
    fn the_keep_alive_configuration_reaches_the_tunnel_and_the_sessions() {
        let key = ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&[7; 32]));
        let tunnel = Tunables::default().with_keep_alive_config(Duration::from_secs(90), 5, false);
        assert_eq!(tunnel.offline_after(), Duration::from_secs(450));
        let server = server_config(&tunnel, key.clone(), None);
        assert_eq!(server.keepalive_interval, Some(Duration::from_secs(90)));
        assert_eq!(server.keepalive_max, 5);
        let session = Tunables::default().with_keep_alive_config(Duration::from_secs(90), 5, true);
        let server = server_config(&session, key.clone(), None);
        assert_eq!(server.keepalive_interval, Some(DEFAULT_SERVER_KEEPALIVE));
        assert_eq!(server.keepalive_max, 5);
        let short = Tunables::default().with_keep_alive_config(Duration::from_secs(2), 2, true);
        let server = server_config(&short, key, None);
        assert_eq!(server.keepalive_interval, Some(Duration::from_secs(2)));
        assert_eq!(server.keepalive_max, 2);
    }

    #[test]
    fn offline_after_is_count_times_interval() {
        let t = Tunables::default();
        assert_eq!(t.offline_after(), Duration::from_secs(15 * 60));
        assert_eq!(
            t.with_keepalive(Duration::from_secs(2), 0).offline_after(),
            Duration::from_secs(2)
        );
    }
}
