//! `tsh`: signs users in through the Proxy and keeps the session (a profile under `~/.svc/`,
//! or `$SVC_HOME`).

use std::io::{BufRead, IsTerminal};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use svc_bins::profile::Profile;
use svc_core::Secret;
use svc_core::auth::ServedKind;

#[derive(Parser)]
#[command(name = "tsh", about = "svc client", disable_version_flag = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
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

#[derive(Subcommand)]
enum KubeCommand {
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

#[derive(Subcommand)]
enum ListCommand {
    /// List the ones your roles allow (by their labels).
    Ls {
        #[arg(short = 'f', long, value_enum, default_value = "text")]
        format: Format,
    },
}

#[derive(Subcommand)]
enum ProxyCommand {
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

fn main() {
    let cli = Cli::parse();
    svc_bins::exit_on_error(run(cli));
}

fn read_password(user: &str) -> anyhow::Result<Secret> {
    if std::io::stdin().is_terminal() {
        return Ok(Secret::new(rpassword::prompt_password(format!(
            "Enter password for svc user {user}: "
        ))?));
    }
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(Secret::new(line.trim_end_matches(['\r', '\n']).to_owned()))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Login {
            proxy,
            user,
            insecure,
            cacert,
            ttl,
        } => {
            let user = match user.or_else(|| std::env::var("USER").ok()) {
                Some(u) if !u.is_empty() => u,
                _ => anyhow::bail!("no user name: pass --user"),
            };
            // `host` alone means the default web port.
            let proxy = svc_core::Addr::parse_with_default_port(&proxy, 3080)
                .with_context(|| format!("--proxy {proxy}"))?
                .to_string();
            let ca = cacert
                .map(|f| std::fs::read(&f).with_context(|| format!("reading --cacert {}", f.display())))
                .transpose()?;
            let password = read_password(&user)?;
            let rt = tokio::runtime::Runtime::new()?;
            let dialer = svc_net::dial::ProxyDialer::from_env()?;
            let ping = rt.block_on(svc_net::proxy::web::login::ping_via_proxy(
                &proxy,
                insecure,
                ca.as_deref(),
                Some(&dialer),
            ))?;
            let identity = rt.block_on(svc_net::proxy::web::login::login_via_proxy_with(
                &proxy,
                insecure,
                ca.as_deref(),
                Some(&dialer),
                &user,
                &password,
                ttl,
            ))?;
            let tls_routing = ping["proxy"]["tls_routing_enabled"].as_bool().unwrap_or(true);
            let ssh_proxy_addr = (!tls_routing)
                .then(|| ping["proxy"]["ssh"]["ssh_public_addr"].as_str())
                .flatten()
                .map(|a| svc_bins::ssh::reachable(a, &proxy));
            let known_nodes = rt.block_on(reachable_nodes(&identity)).unwrap_or_else(|e| {
                eprintln!("warning: listing nodes for known_hosts failed ({e:#}); run tsh ls to retry");
                Vec::new()
            });
            let profile = Profile {
                proxy,
                identity,
                insecure,
                ca_pem: ca.map(|pem| String::from_utf8_lossy(&pem).into_owned()),
                tls_routing: Some(tls_routing),
                ssh_proxy_addr,
                known_nodes,
            };
            profile.save().context("saving the profile")?;
            print_status(&profile, Format::Text)
        }
        Command::Status { format } => match Profile::load()? {
            Some(profile) => print_status(&profile, format),
            None => anyhow::bail!("not signed in: run tsh login"),
        },
        Command::Ssh {
            port,
            login,
            target,
            command,
        } => {
            let profile = signed_in()?;
            let mut target = svc_bins::ssh::Target::parse(&target)?;
            if let Some(p) = port {
                target.port = p;
            }
            let login = match login.or_else(|| target.login.clone()) {
                Some(l) => l,
                None => default_login(&profile)?,
            };
            let rt = tokio::runtime::Runtime::new()?;
            let command = (!command.is_empty()).then(|| command.join(" "));
            let status = rt.block_on(svc_bins::ssh::run(&profile, &target, &login, command.as_deref()))?;
            // Not a plain drop: that would wait for the blocking read of standard input.
            rt.shutdown_background();
            // The remote command's status is ours, as with OpenSSH (statuses above 255 wrap).
            std::process::exit(i32::try_from(status & 0xff).unwrap_or(255));
        }
        Command::Proxy(ProxyCommand::Ssh { target }) => {
            let profile = signed_in()?;
            let target = svc_bins::ssh::Target::parse(&target)?;
            let login = match target.login.clone() {
                Some(l) => l,
                None => default_login(&profile)?,
            };
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(svc_bins::ssh::pipe(&profile, &target, &login))
        }
        Command::Proxy(ProxyCommand::App { name, port }) => local_proxy(ServedKind::App, name, port),
        Command::Proxy(ProxyCommand::Desktop { name, port }) => {
            local_proxy(ServedKind::WindowsDesktop, name, port)
        }
        Command::Proxy(ProxyCommand::Db { name, port }) => local_proxy(ServedKind::Db, name, port),
        Command::Ls { format } => list(ServedKind::Node, format),
        Command::Apps(ListCommand::Ls { format }) => list(ServedKind::App, format),
        Command::Db(ListCommand::Ls { format }) => list(ServedKind::Db, format),
        Command::Kube(KubeCommand::Ls { format }) => list(ServedKind::Kube, format),
        Command::Kube(KubeCommand::Login { name, out }) => {
            let profile = signed_in()?;
            let text = svc_bins::kubeconfig::kubeconfig(&profile, &name)?;
            let path = match out {
                Some(p) => p,
                None => svc_bins::profile::home()?
                    .join("kube")
                    .join(format!("{name}.kubeconfig")),
            };
            // Creates a missing directory 0700; the file is 0600 even if it existed.
            svc_bins::profile::write_private(&path, text.as_bytes())?;
            println!("export KUBECONFIG={}", path.display());
            Ok(())
        }
        Command::Desktops(ListCommand::Ls { format }) => list(ServedKind::WindowsDesktop, format),
        Command::Logout => {
            if Profile::remove()? {
                println!("Logged out.");
            } else {
                println!("Not signed in.");
            }
            Ok(())
        }
    }
}

/// The node names the signed-in user may reach now: the hosts `known_hosts` trusts the
/// cluster's host CA for.
async fn reachable_nodes(identity: &svc_net::auth::ClientIdentity) -> anyhow::Result<Vec<String>> {
    let mut auth = svc_net::auth::AuthClient::connect_with(identity).await?;
    let routes = auth.list_served(ServedKind::Node, None).await?;
    Ok(routes.into_iter().map(|r| r.resource.name).collect())
}

fn list(kind: ServedKind, format: Format) -> anyhow::Result<()> {
    let mut profile = signed_in()?;
    let rt = tokio::runtime::Runtime::new()?;
    let routes = rt.block_on(async {
        let mut auth = svc_net::auth::AuthClient::connect_with(&profile.identity).await?;
        anyhow::Ok(auth.list_served(kind, None).await?)
    })?;
    // `tsh ls` refreshes the nodes `known_hosts` trusts the host CA for.
    let names: Vec<String> = routes.iter().map(|r| r.resource.name.clone()).collect();
    if kind == ServedKind::Node && names != profile.known_nodes {
        profile.known_nodes = names;
        profile.save().context("saving the profile")?;
    }
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
            svc_bins::output::print_table(&["Name", "Protocol", "Target", "Labels", "Agent"], &rows);
        }
    }
    Ok(())
}

fn local_proxy(kind: ServedKind, name: String, port: u16) -> anyhow::Result<()> {
    let profile = signed_in()?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let protocol = match kind {
            ServedKind::Db => Some(svc_bins::local_proxy::db_protocol(&profile, &name).await?),
            _ => None,
        };
        let what = svc_bins::local_proxy::LocalProxy { kind, name, protocol };
        svc_bins::local_proxy::run(&profile, what, port).await
    })
}

fn signed_in() -> anyhow::Result<Profile> {
    let profile = Profile::load()?.context("not signed in: run tsh login")?;
    if profile.identity.is_expired(SystemTime::now()) {
        anyhow::bail!("the session has expired: sign in again with tsh login");
    }
    Ok(profile)
}

fn default_login(profile: &Profile) -> anyhow::Result<String> {
    profile
        .user()?
        .logins
        .into_iter()
        .find(|l| !l.starts_with('-'))
        .context("the session has no logins: pass login@node")
}

fn print_status(profile: &Profile, format: Format) -> anyhow::Result<()> {
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
