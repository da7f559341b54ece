//! `svc`'s command line. Doc comments on the arguments are their `--help` text.
#![allow(missing_docs)]

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "svc",
    about = "svc cluster access service",
    version = svc_core::version::display()
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Print the version of this svc build.
    Version,
    /// Print a commented default svc.yaml.
    Configure,
    /// Run the services svc.yaml enables (without one: Auth + Proxy on loopback) until SIGTERM
    /// or SIGINT.
    Start {
        /// The configuration file (default: /etc/svc.yaml when it exists, else the all-in-one
        /// defaults).
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Overrides svc.data_dir.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Overrides proxy_service.web_listen_addr.
        #[arg(long)]
        web_listen_addr: Option<String>,
        /// Overrides proxy_service.public_addr.
        #[arg(long)]
        public_addr: Option<String>,
        /// An agent accepts any TLS certificate from the proxy (a self-signed test proxy), and
        /// joins without svc.ca_pin by trusting the first CA seen. The SSH inside the reverse
        /// tunnel still checks the proxy against the cluster's host CA.
        #[arg(long)]
        insecure: bool,
    },
    /// The SSH Service's sftp subsystem on stdin/stdout (started by the agent for one session).
    /// Becomes `--uid`/`--gid`/`--groups` first when given.
    #[command(hide = true)]
    SftpServer {
        /// The login's uid.
        #[arg(long, requires = "gid")]
        uid: Option<u32>,
        /// The login's primary gid.
        #[arg(long, requires = "uid")]
        gid: Option<u32>,
        /// The login's groups, comma-separated.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
    },
}
