//! `tsh`'s command line. Doc comments on the arguments are their `--help` text; arguments
//! without help text are left undocumented here too, so `--help` reads as before.
#![allow(missing_docs)]

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// `tsh`'s command line.
#[derive(Parser)]
#[command(name = "tsh", about = "svc client", version = svc_core::version::display())]
pub struct Cli {
    #[command(subcommand)]
    /// What to do.
    pub command: Command,
}

/// `--format`.
#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    /// Human-readable text.
    Text,
    /// Pretty-printed JSON.
    Json,
}

/// `tsh`'s subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Print the version of this tsh build.
    Version,
    /// Sign in through the proxy (password from the terminal, or from standard input when it is
    /// not a terminal).
    Login {
        /// The proxy's web address, `host[:port]` (default port 3080).
        #[arg(long)]
        proxy: String,
        /// The user name (default: $USER).
        #[arg(long)]
        user: Option<String>,
        /// Do not verify the proxy's certificate (self-signed test clusters only).
        #[arg(long)]
        insecure: bool,
        /// Trust the proxy certificate signed by this CA (PEM), e.g. the self-signed
        /// `proxy-ca.pem` in the proxy's data directory.
        #[arg(long)]
        cacert: Option<std::path::PathBuf>,
        /// Requested session length (at most 12h).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// Sign in through this single sign-on connector (an `oidc`, `github` or `saml`
        /// resource's name) instead of a password: tsh prints the identity provider's URL to
        /// open in a browser; `local` is the password sign-in.
        #[arg(long = "auth")]
        auth: Option<String>,
        /// With --auth: also open the URL in the desktop's browser (xdg-open or open).
        #[arg(long)]
        browser: bool,
        /// With --auth: how long to wait for the browser to come back.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "3m")]
        sso_timeout: Duration,
    },
    /// Show the signed-in session.
    Status {
        #[arg(short = 'f', long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Sign out: delete the session's keys and certificates.
    Logout,
    /// Run a command (or, without one, a shell: interactive with a PTY when standard input is
    /// a terminal) on a node through the proxy; exits with the remote exit status.
    Ssh {
        /// The node's SSH Service port (default 3022).
        #[arg(long, short = 'p')]
        port: Option<u16>,
        /// The login on the node (default: the one in TARGET, else the first of the session's
        /// logins).
        #[arg(long, short = 'l')]
        login: Option<String>,
        /// Local port forwarding, `[bind_address:]port:host:hostport`: connections to the local
        /// port are made to host:hostport from the node. Repeatable.
        #[arg(short = 'L', value_name = "SPEC")]
        local: Vec<String>,
        /// Remote port forwarding, `[bind_address:]port:host:hostport`: the node listens on
        /// port (its loopback interface) and connections come to host:hostport from here.
        /// Repeatable.
        #[arg(short = 'R', value_name = "SPEC")]
        remote: Vec<String>,
        /// Dynamic port forwarding, `[bind_address:]port`: a local SOCKS5 proxy whose
        /// connections are made from the node. Repeatable.
        #[arg(short = 'D', value_name = "SPEC")]
        dynamic: Vec<String>,
        /// Run no command: keep the forwardings until interrupted.
        #[arg(short = 'N')]
        no_command: bool,
        /// `[login@]node[:port]`; node is a node name, host ID or host UUID.
        target: String,
        /// The command (its words are joined with spaces, as OpenSSH does).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Copy a file to or from a node over sftp: `tsh scp FILE [login@]node:PATH` or
    /// `tsh scp [login@]node:PATH FILE`.
    Scp {
        /// The node's SSH Service port (default 3022).
        #[arg(long, short = 'P')]
        port: Option<u16>,
        /// The source.
        source: String,
        /// The destination.
        destination: String,
    },
    /// List the SSH nodes your roles allow (by their labels).
    Ls {
        #[arg(short = 'f', long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Proxies for other clients.
    #[command(subcommand)]
    Proxy(ProxyCommand),
    /// Applications.
    #[command(subcommand)]
    Apps(ListCommand),
    /// Databases.
    #[command(subcommand)]
    Db(DbCommand),
    /// Kubernetes clusters.
    #[command(subcommand)]
    Kube(KubeCommand),
    /// Windows desktops.
    #[command(subcommand)]
    Desktops(ListCommand),
}

/// `tsh kube`.
#[derive(Subcommand)]
pub enum KubeCommand {
    /// List the Kubernetes clusters your roles allow (by their labels).
    Ls {
        #[arg(short = 'f', long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Write a kubeconfig for a cluster (through the proxy, with your certificate) and print
    /// the `export KUBECONFIG=...` line.
    Login {
        /// The Kubernetes cluster's name (`kubernetes_service.kube_cluster_name`).
        name: String,
        /// Where to write it (default: `<profile dir>/kube/<name>.kubeconfig`).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
}

/// `tsh db`.
#[derive(Subcommand)]
pub enum DbCommand {
    /// List the databases your roles allow (by their labels).
    Ls {
        #[arg(short = 'f', long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Get a short-lived client certificate for a database, as one database user: native
    /// clients (`psql`, `mariadb`) present it to the proxy directly (see `tsh db config`).
    Login {
        /// The database's name.
        name: String,
        /// The database user to connect as (your roles' `db_users` must allow it).
        #[arg(long)]
        db_user: String,
        /// The database name to connect to (your roles' `db_names` must allow it).
        #[arg(long)]
        db_name: Option<String>,
    },
    /// How a native client connects straight to the proxy with the `tsh db login` certificate:
    /// host, port, certificate, key and CA files, and the command line.
    Config {
        /// The database's name.
        name: String,
        #[arg(short = 'f', long, value_enum, default_value = "text")]
        format: Format,
    },
    /// The same as environment variables (`eval "$(tsh db env NAME)"`).
    Env {
        /// The database's name.
        name: String,
    },
}

/// `tsh apps|desktops`.
#[derive(Subcommand)]
pub enum ListCommand {
    /// List the ones your roles allow (by their labels).
    Ls {
        #[arg(short = 'f', long, value_enum, default_value = "text")]
        format: Format,
    },
}

/// `tsh proxy`.
#[derive(Subcommand)]
pub enum ProxyCommand {
    /// Pipe stdin/stdout to a node's SSH Service, for OpenSSH:
    /// `ssh -o ProxyCommand="tsh proxy ssh %r@%h:%p" root@node`.
    Ssh {
        /// `[login@]node[:port]`.
        target: String,
    },
    /// A local listener for an application: `curl http://127.0.0.1:PORT/` reaches it.
    App {
        /// The application's name.
        name: String,
        /// The local port (0: any free port, printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Carry each client connection on a TLS connection of its own to the proxy, instead of
        /// as a stream of one multiplexed connection (ALPN `svc-mux`).
        #[arg(long)]
        no_multiplex: bool,
    },
    /// A local listener for a database: its native client (`psql`) connects to
    /// `127.0.0.1:PORT` unchanged.
    Db {
        /// The database's name.
        name: String,
        /// The local port (0: any free port, printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// The database user (required except for Postgres, whose client names its user).
        #[arg(long)]
        db_user: Option<String>,
        /// The database name.
        #[arg(long)]
        db_name: Option<String>,
        /// Carry each client connection on a TLS connection of its own to the proxy, instead of
        /// as a stream of one multiplexed connection (ALPN `svc-mux`).
        #[arg(long)]
        no_multiplex: bool,
    },
    /// A local listener for a Windows desktop: a desktop client connects to `127.0.0.1:PORT`.
    Desktop {
        /// The desktop's name.
        name: String,
        /// The local port (0: any free port, printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Carry each client connection on a TLS connection of its own to the proxy, instead of
        /// as a stream of one multiplexed connection (ALPN `svc-mux`).
        #[arg(long)]
        no_multiplex: bool,
    },
}
