//! `tsh`: its command line ([`cli`]) and how it prints sessions and resources. The work is
//! [`svc_net::client`]'s.

pub mod cli;

use std::io::{BufRead, IsTerminal};
use std::time::{Duration, SystemTime};

use svc_core::Secret;
use svc_core::auth::{ResourceRoute, ServedKind};
use svc_net::client::{DbConfig, Profile};

pub use cli::Format;

/// Opens `url` in the desktop's browser (`open` on macOS, `xdg-open` elsewhere); a failure is
/// only reported: the URL is printed anyway.
pub fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    match std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        Ok(_) => {}
        Err(e) => eprintln!("warning: cannot start {opener} ({e}); open the URL by hand"),
    }
}

/// The password for `user`: prompted on the terminal, or one line of standard input when it is
/// not a terminal.
pub fn read_password(user: &str) -> anyhow::Result<Secret> {
    if std::io::stdin().is_terminal() {
        return Ok(Secret::new(rpassword::prompt_password(format!(
            "Enter password for svc user {user}: "
        ))?));
    }
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(Secret::new(line.trim_end_matches(['\r', '\n']).to_owned()))
}

/// Prints resources of `kind` (`tsh ls`, `tsh apps ls`, ...).
pub fn print_routes(kind: ServedKind, routes: &[ResourceRoute], format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let rows: Vec<_> = routes
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "name": r.resource.name, "kind": kind.as_str(), "protocol": r.resource.protocol,
                        "target": r.resource.target, "public_addr": r.resource.public_addr,
                        "labels": r.resource.labels, "agent": r.hostname, "server_id": r.server_id,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        Format::Text => {
            let rows: Vec<Vec<String>> = routes
                .iter()
                .map(|r| {
                    let labels: Vec<String> = r
                        .resource
                        .labels
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    vec![
                        r.resource.name.clone(),
                        r.resource.protocol.clone(),
                        r.resource.target.clone(),
                        labels.join(","),
                        r.hostname.clone(),
                    ]
                })
                .collect();
            crate::output::print_table(&["Name", "Protocol", "Target", "Labels", "Agent"], &rows);
        }
    }
    Ok(())
}

/// Prints the session (`tsh status`, and after `tsh login`).
pub fn print_status(profile: &Profile, format: Format) -> anyhow::Result<()> {
    let user = profile.user()?;
    let not_after = profile.identity.not_after();
    let valid_until = humantime::format_rfc3339_seconds(not_after).to_string();
    let left = not_after.duration_since(SystemTime::now()).ok();
    match format {
        Format::Json => {
            let json = serde_json::json!({
                "active": {
                    "profile_url": format!("https://{}", profile.proxy),
                    "username": user.username,
                    "cluster": user.cluster,
                    "roles": user.roles,
                    "logins": user.logins.iter().filter(|l| !l.starts_with('-')).collect::<Vec<_>>(),
                    "valid_until": valid_until,
                    "expired": left.is_none(),
                }
            });
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
        Format::Text => {
            println!("> Profile URL:  https://{}", profile.proxy);
            println!("  Logged in as: {}", user.username);
            println!("  Cluster:      {}", user.cluster);
            println!("  Roles:        {}", user.roles.join(", "));
            let logins: Vec<&str> = user
                .logins
                .iter()
                .map(String::as_str)
                .filter(|l| !l.starts_with('-'))
                .collect();
            println!("  Logins:       {}", logins.join(", "));
            match left {
                Some(d) => println!(
                    "  Valid until:  {valid_until} [valid for {}]",
                    humantime::format_duration(Duration::from_secs(d.as_secs() / 60 * 60))
                ),
                None => println!("  Valid until:  {valid_until} [EXPIRED]"),
            }
        }
    }
    Ok(())
}

/// `value` quoted for a POSIX shell (`'...'`, with `'` written `'\''`).
pub fn shell_quote(value: &str) -> String {
    if !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '-' | '_' | ':' | '='))
    {
        return value.to_owned();
    }
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// Prints `tsh db config`.
pub fn print_db_config(config: &DbConfig, format: Format) -> anyhow::Result<()> {
    let l = &config.login;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(config)?),
        Format::Text => {
            println!("Name:      {}", l.name);
            println!("Protocol:  {}", l.protocol);
            println!("Host:      {}", config.host);
            println!("Port:      {}", config.port);
            println!("User:      {}", l.db_user);
            println!("Database:  {}", l.db_name.as_deref().unwrap_or(""));
            println!("CA:        {}", l.ca.display());
            println!("Cert:      {}", l.cert.display());
            println!("Key:       {}", l.key.display());
            println!();
            match l.protocol.as_str() {
                "postgres" => println!("psql {}", shell_quote(&config.postgres_conninfo())),
                "mysql" => {
                    let args: Vec<String> = config.mysql_args().iter().map(|a| shell_quote(a)).collect();
                    println!("mariadb {}", args.join(" "));
                }
                "redis" => {
                    let args: Vec<String> = config.redis_args().iter().map(|a| shell_quote(a)).collect();
                    println!("redis-cli {}", args.join(" "));
                }
                other => println!("({other}: connect through tsh proxy db {})", l.name),
            }
        }
    }
    Ok(())
}
