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
        /// `[login@]node[:port]`; node is a node name, host ID or host UUID.
        target: String,
        /// The command (its words are joined with spaces, as OpenSSH does).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
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
    Db(ListCommand),
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

/// `tsh apps|db|desktops`.
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
    },
    /// A local listener for a database: its native client (`psql`) connects to
    /// `127.0.0.1:PORT` unchanged.
    Db {
        /// The database's name.
        name: String,
        /// The local port (0: any free port, printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// A local listener for a Windows desktop: a desktop client connects to `127.0.0.1:PORT`.
    Desktop {
        /// The desktop's name.
        name: String,
        /// The local port (0: any free port, printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}
