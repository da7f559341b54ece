//! `tctl`: administers a cluster through the Auth API, as the signed-in user (the `tsh`
//! profile) or, on the Auth host, with the admin identity in the data directory.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use svc_core::Secret;
use svc_core::resource::{Kind, Resource, ResourceRef, resources_to_json, resources_to_yaml};
use svc_net::auth::AuthClient;

#[derive(Parser)]
#[command(
    name = "tctl",
    about = "svc cluster administration",
    disable_version_flag = true
)]
struct Cli {
    /// On the Auth host: act with the admin identity of this data directory.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// On the Auth host: act with the admin identity of this configuration's data directory.
    #[arg(long, short = 'c', global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Yaml,
    Json,
    Text,
}

#[derive(Subcommand)]
enum Command {
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
}

#[derive(Subcommand)]
enum Users {
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
enum Tokens {
    /// Create a join token.
    Add {
        /// Services the token admits: node, app, db, kube, windows_desktop, proxy.
        #[arg(long = "type", value_delimiter = ',', required = true)]
        types: Vec<String>,
        /// Lifetime (e.g. 30m, 1h).
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// List join tokens.
    Ls,
    /// Delete a join token.
    Rm { token: String },
}

#[derive(Subcommand)]
enum Inventory {
    /// List live agents.
    Ls {
        /// Only agents with this upgrader (none, unit, kube).
        #[arg(long)]
        upgrader: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
}

fn main() {
    let cli = Cli::parse();
    svc_bins::exit_on_error(
        tokio::runtime::Runtime::new()
            .map_err(Into::into)
            .and_then(|rt| rt.block_on(run(cli))),
    );
}

async fn client(cli: &Cli) -> anyhow::Result<AuthClient> {
    let explicit = match (&cli.data_dir, &cli.config) {
        (Some(dir), _) => Some(dir.clone()),
        (None, Some(file)) => Some(svc_core::config::Config::load(file)?.svc.data_dir),
        (None, None) => None,
    };
    let default_dir = svc_core::config::Config::all_in_one_default().svc.data_dir;
    let identity = svc_bins::profile::tctl_identity(explicit.as_deref(), &default_dir)?;
    Ok(AuthClient::connect_with(&identity).await?)
}

fn print_resources(resources: &[Resource], format: Format) -> anyhow::Result<()> {
    match format {
        Format::Yaml => print!("{}", resources_to_yaml(resources)?),
        Format::Json => println!("{}", resources_to_json(resources)?),
        Format::Text => {
            let rows: Vec<Vec<String>> = resources
                .iter()
                .map(|r| {
                    vec![
                        r.kind().to_string(),
                        if r.kind() == Kind::Token {
                            "***".into()
                        } else {
                            r.name().to_owned()
                        },
                    ]
                })
                .collect();
            svc_bins::print_table(&["Kind", "Name"], &rows);
        }
    }
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut auth = client(&cli).await?;
    match cli.command {
        Command::Status => {
            let s = auth.status().await?;
            println!("Cluster:  {}", s.cluster_name);
            println!("Version:  {}", s.version);
            println!("CA pin:   {}", s.ca_pin);
        }
        Command::Create { force, file } => {
            let text = if file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s
            } else {
                std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?
            };
            for w in auth.put_resources(&text, force).await? {
                if w.kind == Kind::ClusterMaintenanceConfig.as_str() {
                    println!("maintenance window has been updated");
                } else {
                    println!(
                        "{} has been {}",
                        w.display,
                        if w.updated { "updated" } else { "created" }
                    );
                }
            }
        }
        Command::Get {
            reference,
            format,
            with_secrets,
        } => {
            let mut r: ResourceRef = reference.parse()?;
            // The maintenance configuration is a singleton: `get KIND` reads it (verb read).
            if r.kind == Kind::ClusterMaintenanceConfig && r.name.is_none() {
                r.name = Some(svc_core::resource::CLUSTER_MAINTENANCE_CONFIG_NAME.to_owned());
            }
            let resources = auth
                .get_resources(r.kind, r.name.as_deref(), with_secrets)
                .await?;
            print_resources(&resources, format)?;
        }
        Command::Rm { reference } => {
            let r: ResourceRef = reference.parse()?;
            let Some(name) = &r.name else {
                bail!("expected KIND/NAME, got {reference:?}")
            };
            auth.delete_resource(r.kind, name).await?;
            println!("{r} has been deleted");
        }
        Command::Users(Users::Add {
            name,
            roles,
            logins,
            password_stdin,
        }) => {
            let (password, generated) = if password_stdin {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                (Secret::new(s.trim_end_matches(['\r', '\n']).to_owned()), false)
            } else {
                (generate_password(), true)
            };
            auth.create_user(&name, &roles, &logins, &password).await?;
            println!("User {name:?} has been created with roles {}.", roles.join(","));
            if generated {
                println!("Password (shown once, keep it safe): {}", password.expose());
            }
        }
        Command::Users(Users::Update { name, set_roles }) => {
            auth.set_user_roles(&name, &set_roles).await?;
            println!("User {name:?} has been updated: roles {}.", set_roles.join(","));
            println!("The new roles take effect when {name} signs in again (tsh login).");
        }
        Command::Users(Users::Ls { format }) => {
            let users = auth.get_resources(Kind::User, None, false).await?;
            match format {
                Format::Text => {
                    let rows: Vec<Vec<String>> = users
                        .iter()
                        .filter_map(|r| match r {
                            Resource::User(u) => Some(vec![u.metadata.name.clone(), u.spec.roles.join(",")]),
                            _ => None,
                        })
                        .collect();
                    svc_bins::print_table(&["User", "Roles"], &rows);
                }
                other => print_resources(&users, other)?,
            }
        }
        Command::Users(Users::Rm { name }) => {
            auth.delete_resource(Kind::User, &name).await?;
            println!("User {name:?} has been deleted");
        }
        Command::Tokens(Tokens::Add { types, ttl, format }) => {
            let (token, expires) = auth.create_token(&types, ttl).await?;
            let status = auth.status().await?;
            match format {
                Format::Json => println!(
                    "{}",
                    serde_json::json!({
                        "token": token.expose(),
                        "roles": types,
                        "expires_unix": expires,
                        "ca_pin": status.ca_pin,
                    })
                ),
                _ => {
                    println!("The invite token: {}", token.expose());
                    println!(
                        "It admits: {}. It expires at Unix time {expires} and works once.",
                        types.join(",")
                    );
                    println!(
                        "The agent joins with this token and checks the CA pin {}.",
                        status.ca_pin
                    );
                }
            }
        }
        Command::Tokens(Tokens::Ls) => {
            let tokens = auth.get_resources(Kind::Token, None, false).await?;
            let rows: Vec<Vec<String>> = tokens
                .iter()
                .filter_map(|r| match r {
                    Resource::Token(t) => Some(vec![
                        t.value().expose().clone(),
                        t.spec
                            .roles
                            .iter()
                            .map(|r| r.as_str())
                            .collect::<Vec<_>>()
                            .join(","),
                        t.metadata
                            .expires
                            .map(|e| e.to_string())
                            .unwrap_or_else(|| "never".into()),
                    ]),
                    _ => None,
                })
                .collect();
            svc_bins::print_table(&["Token", "Type", "Expiry Time (UTC)"], &rows);
        }
        Command::Tokens(Tokens::Rm { token }) => {
            auth.delete_resource(Kind::Token, &token).await?;
            println!("Token has been deleted");
        }
        Command::Inventory(Inventory::Ls { upgrader, format }) => {
            let none = |s: &str| {
                if s.is_empty() {
                    "none".to_owned()
                } else {
                    s.to_owned()
                }
            };
            let rows: Vec<_> = auth
                .inventory()
                .await?
                .into_iter()
                .filter(|r| upgrader.as_deref().is_none_or(|u| none(&r.upgrader) == u))
                .collect();
            match format {
                Format::Json | Format::Yaml => {
                    let json: Vec<_> = rows
                        .iter()
                        .map(|r| {
                            serde_json::json!({
                                "server_id": r.server_id, "hostname": r.hostname, "services": r.services,
                                "version": r.version, "upgrader": none(&r.upgrader),
                                "upgrader_version": none(&r.upgrader_version),
                            })
                        })
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&json)?);
                }
                Format::Text => {
                    let table: Vec<Vec<String>> = rows
                        .iter()
                        .map(|r| {
                            vec![
                                r.server_id.clone(),
                                none(&r.hostname),
                                none(&r.services.join(",")),
                                none(&r.version),
                                none(&r.upgrader),
                                none(&r.upgrader_version),
                            ]
                        })
                        .collect();
                    svc_bins::print_table(
                        &[
                            "Server ID",
                            "Hostname",
                            "Services",
                            "Version",
                            "Upgrader",
                            "Upgrader Version",
                        ],
                        &table,
                    );
                }
            }
        }
    }
    Ok(())
}

fn generate_password() -> Secret {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::rng();
    Secret::new(
        (0..20)
            .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
            .collect(),
    )
}
