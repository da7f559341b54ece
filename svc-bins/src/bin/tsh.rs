//! `tsh`: signs users in through the Proxy and keeps the session (a profile under `~/.svc/`,
//! or `$SVC_HOME`). Argument parsing and printing; the work is `svc_net::client`'s.

use anyhow::Context;
use clap::Parser;
use svc_bins::tsh::cli::{Cli, Command, DbCommand, KubeCommand, ListCommand, ProxyCommand};
use svc_bins::tsh::{Format, print_routes, print_status, read_password};
use svc_core::auth::ServedKind;
use svc_net::client::{self, Profile, SignIn, ssh::Target};

fn main() {
    let cli = Cli::parse();
    svc_bins::exit_on_error(run(cli));
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let rt = || tokio::runtime::Runtime::new().context("starting the runtime");
    match cli.command {
        Command::Version => {
            println!("tsh {}", svc_core::version::current());
            Ok(())
        }
        Command::Login {
            proxy,
            user,
            insecure,
            cacert,
            ttl,
            auth,
            browser,
            sso_timeout,
        } => {
            if let Some(connector) = auth.filter(|a| a != "local") {
                let proxy = svc_core::Addr::parse_with_default_port(&proxy, 3080)
                    .with_context(|| format!("--proxy {proxy}"))?;
                let ca_pem = cacert
                    .map(|f| std::fs::read(&f).with_context(|| format!("reading --cacert {}", f.display())))
                    .transpose()?;
                let request = SignIn {
                    proxy,
                    user: String::new(),
                    insecure,
                    ca_pem,
                    ttl,
                };
                let rt = rt()?;
                let pinged = rt.block_on(client::ping(&request))?;
                if let Some(warning) = &pinged.version_warning {
                    eprintln!("warning: {warning}");
                }
                let login = client::SsoLogin {
                    connector,
                    ttl,
                    timeout: sso_timeout,
                };
                let signed_in = rt.block_on(client::sign_in_sso(request, &pinged, &login, |url| {
                    eprintln!("To sign in, open this URL in a browser:\n\n  {url}\n");
                    if browser {
                        svc_bins::tsh::open_browser(url);
                    }
                }))?;
                if let Some(e) = signed_in.known_nodes_error {
                    let e = anyhow::Error::from(e);
                    eprintln!("warning: listing nodes for known_hosts failed ({e:#}); run tsh ls to retry");
                }
                signed_in.profile.save().context("saving the profile")?;
                return print_status(&signed_in.profile, Format::Text);
            }
            let user = match user.or_else(|| std::env::var("USER").ok()) {
                Some(u) if !u.is_empty() => u,
                _ => anyhow::bail!("no user name: pass --user"),
            };
            // `host` alone means the default web port.
            let proxy = svc_core::Addr::parse_with_default_port(&proxy, 3080)
                .with_context(|| format!("--proxy {proxy}"))?;
            let ca_pem = cacert
                .map(|f| std::fs::read(&f).with_context(|| format!("reading --cacert {}", f.display())))
                .transpose()?;
            let request = SignIn {
                proxy,
                user,
                insecure,
                ca_pem,
                ttl,
            };
            let rt = rt()?;
            // The versions are checked before the password is asked for.
            let pinged = rt.block_on(client::ping(&request))?;
            if let Some(warning) = &pinged.version_warning {
                eprintln!("warning: {warning}");
            }
            let password = read_password(&request.user)?;
            let signed_in = rt.block_on(client::sign_in(request, &pinged, &password))?;
            if let Some(e) = signed_in.known_nodes_error {
                let e = anyhow::Error::from(e);
                eprintln!("warning: listing nodes for known_hosts failed ({e:#}); run tsh ls to retry");
            }
            signed_in.profile.save().context("saving the profile")?;
            print_status(&signed_in.profile, Format::Text)
        }
        Command::Status { format } => match Profile::load()? {
            Some(profile) => print_status(&profile, format),
            None => anyhow::bail!("not signed in: run tsh login"),
        },
        Command::Ssh {
            port,
            login,
            local,
            remote,
            dynamic,
            no_command,
            target,
            command,
        } => {
            let profile = Profile::signed_in()?;
            let mut target = Target::parse(&target)?;
            if let Some(p) = port {
                target.port = p;
            }
            let login = target.resolve_login(login, &profile)?;
            let mut options = client::ssh::SshOptions {
                no_command,
                ..Default::default()
            };
            for (kind, specs) in [('L', &local), ('R', &remote), ('D', &dynamic)] {
                for spec in specs {
                    options.forwards.push(client::ssh::Forward::parse(kind, spec)?);
                }
            }
            let rt = rt()?;
            let command = (!command.is_empty()).then(|| command.join(" "));
            let status = rt.block_on(client::ssh::run_with(
                &profile,
                &target,
                &login,
                command.as_deref(),
                &options,
            ))?;
            // Not a plain drop: that would wait for the blocking read of standard input.
            rt.shutdown_background();
            // The remote command's status is ours, as with OpenSSH (statuses above 255 wrap).
            std::process::exit(i32::try_from(status & 0xff).unwrap_or(255));
        }
        Command::Scp {
            port,
            source,
            destination,
        } => {
            use client::ssh::ScpPath;
            let profile = Profile::signed_in()?;
            let (local, mut target, path, upload) =
                match (ScpPath::parse(&source)?, ScpPath::parse(&destination)?) {
                    (ScpPath::Local(local), ScpPath::Remote { target, path }) => (local, target, path, true),
                    (ScpPath::Remote { target, path }, ScpPath::Local(local)) => (local, target, path, false),
                    _ => anyhow::bail!(
                        "tsh scp: exactly one of SOURCE and DESTINATION must be [login@]node:path"
                    ),
                };
            if let Some(p) = port {
                target.port = p;
            }
            let login = target.resolve_login(None, &profile)?;
            let bytes = rt()?.block_on(client::ssh::copy(
                &profile, &target, &login, &local, &path, upload,
            ))?;
            eprintln!("tsh scp: {bytes} bytes copied");
            Ok(())
        }
        Command::Proxy(ProxyCommand::Ssh { target }) => {
            let profile = Profile::signed_in()?;
            let target = Target::parse(&target)?;
            let login = target.resolve_login(None, &profile)?;
            Ok(rt()?.block_on(client::ssh::pipe(&profile, &target, &login))?)
        }
        Command::Proxy(ProxyCommand::App {
            name,
            port,
            no_multiplex,
        }) => local_proxy(
            ServedKind::App,
            name,
            port,
            client::DbUser::default(),
            !no_multiplex,
        ),
        Command::Proxy(ProxyCommand::Desktop {
            name,
            port,
            no_multiplex,
        }) => local_proxy(
            ServedKind::WindowsDesktop,
            name,
            port,
            client::DbUser::default(),
            !no_multiplex,
        ),
        Command::Proxy(ProxyCommand::Db {
            name,
            port,
            db_user,
            db_name,
            no_multiplex,
        }) => local_proxy(
            ServedKind::Db,
            name,
            port,
            client::DbUser {
                user: db_user,
                name: db_name,
            },
            !no_multiplex,
        ),
        Command::Ls { format } => list(ServedKind::Node, format),
        Command::Apps(ListCommand::Ls { format }) => list(ServedKind::App, format),
        Command::Db(DbCommand::Ls { format }) => list(ServedKind::Db, format),
        Command::Db(DbCommand::Login {
            name,
            db_user,
            db_name,
        }) => {
            let profile = Profile::signed_in()?;
            let login = rt()?.block_on(client::db_login(&profile, &name, &db_user, db_name.as_deref()))?;
            let until = std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(u64::try_from(login.not_after_unix).unwrap_or(0));
            println!(
                "Logged into db \"{name}\" ({}) as database user \"{db_user}\"{}, valid until {}.",
                login.protocol,
                login
                    .db_name
                    .as_ref()
                    .map(|d| format!(", database \"{d}\""))
                    .unwrap_or_default(),
                humantime::format_rfc3339_seconds(until)
            );
            println!("Connect with a native client: tsh db config {name}");
            Ok(())
        }
        Command::Db(DbCommand::Config { name, format }) => {
            let profile = Profile::signed_in()?;
            let config = rt()?.block_on(client::db_config(&profile, &name))?;
            svc_bins::tsh::print_db_config(&config, format)
        }
        Command::Db(DbCommand::Env { name }) => {
            let profile = Profile::signed_in()?;
            let config = rt()?.block_on(client::db_config(&profile, &name))?;
            for (key, value) in config.env() {
                println!("export {key}={}", svc_bins::tsh::shell_quote(&value));
            }
            Ok(())
        }
        Command::Kube(KubeCommand::Ls { format }) => list(ServedKind::Kube, format),
        Command::Kube(KubeCommand::Login { name, out }) => {
            let path = client::write_kubeconfig(&Profile::signed_in()?, &name, out)?;
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

fn list(kind: ServedKind, format: Format) -> anyhow::Result<()> {
    let mut profile = Profile::signed_in()?;
    let routes = tokio::runtime::Runtime::new()?.block_on(profile.list(kind))?;
    print_routes(kind, &routes, format)
}

fn local_proxy(
    kind: ServedKind,
    name: String,
    port: u16,
    db: client::DbUser,
    multiplex: bool,
) -> anyhow::Result<()> {
    let profile = Profile::signed_in()?;
    let on_listening = |local| {
        println!("Proxying connections to {kind} \"{name}\" on {local}");
        std::io::Write::flush(&mut std::io::stdout()).map_err(client::Error::Io)
    };
    let (k, n) = (kind, name.clone());
    let on_error = move |peer, e: client::LocalProxyError| {
        eprintln!("tsh: connection from {peer} to {k} \"{n}\": {e}");
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let target = client::LocalTarget {
        kind,
        name: name.clone(),
        port,
        db,
        multiplex,
    };
    let serve = client::serve_local_proxy(&profile, target, shutdown, on_listening, on_error);
    Ok(tokio::runtime::Runtime::new()?.block_on(serve)?)
}
