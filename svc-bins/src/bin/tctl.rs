//! `tctl`: administers a cluster through the Auth API, as the signed-in user (the `tsh`
//! profile) or, on the Auth host, with the admin identity in the data directory.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use svc_bins::output::{self, Format};
use svc_core::Secret;
use svc_core::resource::{Kind, Lock, Resource, ResourceRef};
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
            output::print_resources(&resources, format)?;
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
            output::print_users(&auth.get_resources(Kind::User, None, false).await?, format)?;
        }
        Command::Users(Users::Rm { name }) => {
            auth.delete_resource(Kind::User, &name).await?;
            println!("User {name:?} has been deleted");
        }
        Command::Tokens(Tokens::Add {
            types,
            ttl,
            extra_names,
            format,
        }) => {
            let (token, expires) = auth.create_token_with_names(&types, ttl, &extra_names).await?;
            let status = auth.status().await?;
            match format {
                Format::Json => println!(
                    "{}",
                    serde_json::json!({
                        "token": token.expose(),
                        "roles": types,
                        "extra_names": extra_names,
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
            // Token values are secrets: listing them needs `read` on tokens as well as `list`.
            output::print_tokens(&auth.get_resources(Kind::Token, None, true).await?);
        }
        Command::Tokens(Tokens::Rm { token }) => {
            auth.delete_resource(Kind::Token, &token).await?;
            println!("Token has been deleted");
        }
        Command::Lock {
            user,
            node,
            message,
            ttl,
        } => {
            let lock = match (user, node) {
                (Some(user), _) => Lock::user(user, message),
                (None, Some(node)) => Lock::node(node, message),
                (None, None) => bail!("expected --user=NAME or --node=NAME"),
            };
            let lock = match ttl {
                Some(ttl) => lock.expiring_at(std::time::SystemTime::now() + ttl),
                None => lock,
            };
            let name = lock.metadata.name.clone();
            let target = lock.target_text();
            auth.put_resources(&Resource::Lock(lock).to_yaml()?, true).await?;
            println!("{target} has been locked (remove lock/{name} to unlock)");
        }
        Command::Inventory(Inventory::Ls { upgrader, format }) => {
            output::print_inventory(auth.inventory().await?, upgrader.as_deref(), format)?;
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
