//! `tctl`: administers a cluster through the Auth API, as the signed-in user (the `tsh`
//! profile) or, on the Auth host, with the admin identity in the data directory. Argument
//! parsing and printing; the work is `svc_net::auth::AuthClient`'s.

use anyhow::bail;
use clap::Parser;
use svc_bins::output;
use svc_bins::tctl::cli::{Cli, Command, Inventory, Tokens, Users};
use svc_core::Secret;
use svc_core::resource::{Kind, ResourceRef};

fn main() {
    let cli = Cli::parse();
    svc_bins::exit_on_error(
        tokio::runtime::Runtime::new()
            .map_err(Into::into)
            .and_then(|rt| rt.block_on(run(cli))),
    );
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Version = cli.command {
        // The client's own version; `tctl status` gives the cluster's.
        println!("tctl {}", svc_core::version::current());
        return Ok(());
    }
    let mut auth = svc_bins::tctl::connect(&cli).await?;
    match cli.command {
        Command::Status => {
            let s = auth.status().await?;
            println!("Cluster:  {}", s.cluster_name);
            println!("Version:  {}", s.version);
            println!("CA pin:   {}", s.ca_pin);
        }
        Command::Create { force, file } => {
            let text = svc_bins::tctl::read_input(&file)?;
            for w in auth.put_resources(&text, force).await? {
                if w.kind == Kind::ClusterMaintenanceConfig.as_str() {
                    println!("maintenance window has been updated");
                } else {
                    let done = if w.updated { "updated" } else { "created" };
                    println!("{} has been {done}", w.display);
                }
            }
        }
        Command::Get {
            reference,
            format,
            with_secrets,
        } => {
            let r: ResourceRef = reference.parse()?;
            output::print_resources(&auth.get_by_ref(&r, with_secrets).await?, format)?;
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
                let s = svc_bins::tctl::read_input("-".as_ref())?;
                (Secret::new(s.trim_end_matches(['\r', '\n']).to_owned()), false)
            } else {
                (svc_net::auth::generate_password(), true)
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
            let invite = auth.invite(&types, ttl, &extra_names).await?;
            output::print_invite(&invite, &types, format);
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
            let lock = auth.lock(user, node, message, ttl).await?;
            let (target, name) = (lock.target_text(), &lock.metadata.name);
            println!("{target} has been locked (remove lock/{name} to unlock)");
        }
        Command::Inventory(Inventory::Ls {
            upgrader,
            older_than,
            newer_than,
            exact_version,
            services,
            format,
        }) => {
            let filter = output::InventoryFilter {
                upgrader: upgrader.map(|u| u.as_str()),
                older_than,
                newer_than,
                exact_version,
                services,
            };
            output::print_inventory(auth.inventory().await?, &filter, format)?;
        }
        // Answered above, before connecting.
        Command::Version => {}
    }
    Ok(())
}
