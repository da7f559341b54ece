//! `tctl`: its command line ([`cli`]) and the identity it acts with. The work is the Auth API's
//! ([`svc_net::auth::AuthClient`]); printing is [`crate::output`]'s.

pub mod cli;

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use svc_net::auth::AuthClient;

/// Connects to the Auth API as `tctl` acts: with the admin identity of `--data-dir` (or
/// `--config`'s data directory) on the Auth host, else as the signed-in `tsh` user, else with
/// the admin identity of the default data directory. With `--config` naming several Auth
/// Services (`svc.auth_server`), the first that answers.
pub async fn connect(cli: &cli::Cli) -> anyhow::Result<AuthClient> {
    let config = match &cli.config {
        Some(file) => Some(svc_core::config::Config::load(file)?),
        None => None,
    };
    let explicit = match (&cli.data_dir, &config) {
        (Some(dir), _) => Some(dir.clone()),
        (None, Some(config)) => Some(config.svc.data_dir.clone()),
        (None, None) => None,
    };
    let default_dir = svc_core::config::Config::all_in_one_default().svc.data_dir;
    let identity = svc_net::client::tctl_identity(explicit.as_deref(), &default_dir)?;
    // `svc.auth_server` in `--config` lists the Auth Services: the first that answers is used.
    let addrs: Vec<String> = config
        .map(|c| c.svc.auth_servers.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    if addrs.is_empty() {
        return Ok(AuthClient::connect_with(&identity).await?);
    }
    Ok(AuthClient::connect_any(&addrs, &identity, None).await?.0)
}

/// Reads `file`, or standard input for `-`.
pub fn read_input(file: &Path) -> anyhow::Result<String> {
    if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
    }
}
