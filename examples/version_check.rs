//! Decide whether an agent may join a cluster, the way the proxy does when a tunnel arrives.
//!
//! ```text
//! cargo run -p svc-examples --example version_check -- v16.4.1 v17.2.0
//! ```

use svc_core::{Compatibility, Version};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let agent: Version = args.next().unwrap_or_else(|| "v16.4.1".into()).parse()?;
    let cluster: Version = match args.next() {
        Some(v) => v.parse()?,
        None => svc_core::version::current().clone(),
    };
    match agent.agent_compatibility(&cluster) {
        Compatibility::Compatible => println!("agent {agent} may join cluster {cluster}"),
        Compatibility::AgentAhead => println!("agent {agent} is ahead of cluster {cluster}: refused"),
        Compatibility::AgentTooOld => {
            println!("agent {agent} is more than one major behind cluster {cluster}: refused")
        }
        other => println!("agent {agent}: {other:?}"),
    }
    println!(
        "automatic updates {}supported for {agent}",
        if agent.supports_automatic_updates() {
            ""
        } else {
            "not "
        }
    );
    Ok(())
}
