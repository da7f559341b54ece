//! `tctl`'s command line. Doc comments on the arguments are their `--help` text; arguments
//! without help text are left undocumented here too, so `--help` reads as before.
#![allow(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use svc_core::Version;
use svc_core::identity::SystemRole;

use crate::output::Format;

#[derive(Parser)]
#[command(
    name = "tctl",
    about = "svc cluster administration",
    version = svc_core::version::display()
)]
pub struct Cli {
    /// On the Auth host: act with the admin identity of this data directory.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// On the Auth host: act with the admin identity of this configuration's data directory.
    #[arg(long, short = 'c', global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Print the version of this tctl build (`tctl status` gives the cluster's).
    Version,
    /// Cluster name, version and CA pin.
    Status,
    /// Create resources from a YAML/JSON file (several documents allowed).
    Create {
        /// Overwrite resources that exist.
        #[arg(short = 'f', long = "force")]
        force: bool,
        /// The file (`-` for standard input).
        file: PathBuf,
    },
    /// Print KIND/NAME, or every resource of KIND.
    Get {
        reference: String,
        #[arg(long, value_enum, default_value = "yaml")]
        format: Format,
        /// Include secrets (connector signing keys, client secrets).
        #[arg(long)]
        with_secrets: bool,
    },
    /// Delete KIND/NAME.
    Rm { reference: String },
    /// Manage local users.
    #[command(subcommand)]
    Users(Users),
    /// Manage join tokens.
    #[command(subcommand)]
    Tokens(Tokens),
    /// Connected agents.
    #[command(subcommand)]
    Inventory(Inventory),
    /// Lock a user or a node: new sessions and API calls are refused at once, open sessions
    /// end within a minute. `tctl rm lock/user-NAME` (or `lock/node-NAME`) unlocks.
    Lock {
        /// The user to lock.
        #[arg(long, conflicts_with = "node", required_unless_present = "node")]
        user: Option<String>,
        /// The node to lock (node name, host ID or UUID).
        #[arg(long)]
        node: Option<String>,
        /// Shown to the locked user.
        #[arg(long)]
        message: Option<String>,
        /// Lifetime of the lock (e.g. 30m, 12h); without it the lock stays until removed.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
    },
}

#[derive(Subcommand)]
pub enum Users {
    /// Create a user; prints a generated password unless --password-stdin.
    Add {
        name: String,
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<String>,
        #[arg(long, value_delimiter = ',')]
        logins: Vec<String>,
        /// Read the password from standard input.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Change a user.
    Update {
        name: String,
        /// Replace the user's roles.
        #[arg(long, value_delimiter = ',', required = true)]
        set_roles: Vec<String>,
    },
    /// List users.
    Ls {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Delete a user.
    Rm { name: String },
}

#[derive(Subcommand)]
pub enum Tokens {
    /// Create a join token.
    Add {
        /// Services the token admits: node, app, db, kube, windows_desktop, proxy.
        #[arg(long = "type", value_delimiter = ',', required = true)]
        types: Vec<String>,
        /// Lifetime (e.g. 30m, 1h).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// Extra certificate names an agent joining with the token may ask for (exact host
        /// names, comma-separated; no wildcards, never the Proxy's or Auth Service's names).
        #[arg(long = "extra-names", value_delimiter = ',')]
        extra_names: Vec<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// List join tokens with their values (needs read and list on tokens).
    Ls,
    /// Delete a join token.
    Rm { token: String },
}

#[derive(Subcommand)]
pub enum Inventory {
    /// List live agents, with their updater's last decision and next maintenance window.
    Ls {
        /// Only agents with this upgrader (none: not enrolled in automatic updates).
        #[arg(long, value_enum)]
        upgrader: Option<UpgraderFilter>,
        /// Only agents running a version older than this one (e.g. 17.1.0).
        #[arg(long, value_parser = parse_version)]
        older_than: Option<Version>,
        /// Only agents running a version newer than this one.
        #[arg(long, value_parser = parse_version)]
        newer_than: Option<Version>,
        /// Only agents running exactly this version.
        #[arg(long, value_parser = parse_version)]
        exact_version: Option<Version>,
        /// Only agents running any of these services (comma-separated: node, app, db, kube,
        /// windows_desktop, proxy, auth).
        #[arg(long, value_delimiter = ',', value_parser = parse_service)]
        services: Vec<SystemRole>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

/// `tctl inventory ls --upgrader`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UpgraderFilter {
    /// The Kubernetes updater.
    Kube,
    /// The Linux updater (systemd unit).
    Unit,
    /// Not enrolled in automatic updates.
    None,
}

impl UpgraderFilter {
    /// The name the inventory prints.
    pub fn as_str(self) -> &'static str {
        match self {
            UpgraderFilter::Kube => "kube",
            UpgraderFilter::Unit => "unit",
            UpgraderFilter::None => "none",
        }
    }
}

fn parse_version(text: &str) -> Result<Version, String> {
    Version::parse(text).map_err(|e| e.to_string())
}

fn parse_service(text: &str) -> Result<SystemRole, String> {
    text.trim().parse::<SystemRole>().map_err(|e| e.to_string())
}
