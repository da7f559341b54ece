//! The svc domain model, shared by every service, client and updater.
//!
//! This crate has no socket or process code. Almost everything here is a plain function over data
//! (with a [`clock`] passed in where time matters), so it can be tested without a network and
//! embedded anywhere; the one exception is storage: the embedded [`backend`] writes its database
//! file in the data directory. The crates above it (`svc-net`, `svc-update`, `svc-bins`) do the
//! network I/O.
//!
//! | module | what it holds |
//! |---|---|
//! | [`version`] | [`Version`], the compatibility rule, the product's own version and limits |
//! | [`addr`] | [`Addr`], one host:port type for every address in the cluster |
//! | [`proxy_env`] | `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`: which proxy (if any) a dial uses |
//! | [`secret`] | [`Secret`], a wrapper that never prints what it holds |
//! | [`channel`] | version channel definitions (`automatic_upgrades_channels`) |
//! | [`config`] | the configuration file model (`svc.yaml`) |
//! | [`fs`] | private files and directories (`0600`/`0700`) for keys, the database and identities |
//! | [`clock`] | [`Clock`]: time as an input ([`SystemClock`], [`ManualClock`] for tests) |
//! | [`resource`] | dynamic resources (`role`, `cluster_maintenance_config`, `user`, connectors, `token`): strict parsing, serialization |
//! | [`rbac`] | [`RoleSet`]: verbs on resources, logins, label selectors, preset roles |
//! | [`maintenance`] | maintenance windows and the schedules exported to updaters |
//! | [`updater`] | what an agent and its updater tell each other: the updater's status, the agent's report |
//! | [`backend`] | storage: the [`Backend`](backend::Backend) trait, in-memory and embedded (redb) backends |
//! | [`auth`] | the Auth Service's domain logic: RBAC-checked calls over the backend and the CAs |
//! | [`identity`] | certificate authorities, X.509 and OpenSSH certificates, identity verification |
//!
//! # Features
//!
//! Both on by default. `auth`: the [`auth`] module (the Auth Service's logic, argon2 password
//! hashing). `storage`: the embedded backend (`backend::EmbeddedBackend`, redb); the
//! [`Backend`](backend::Backend) trait and the in-memory backend are always built. Without
//! them this crate is the model, the configuration, RBAC and identities alone.
//!
//! # Example
//!
//! ```
//! use svc_core::{Compatibility, Version};
//!
//! let agent: Version = "v16.4.1".parse()?;
//! let cluster: Version = "v17.2.0".parse()?;
//! assert_eq!(agent.agent_compatibility(&cluster), Compatibility::Compatible);
//! # Ok::<(), svc_core::VersionError>(())
//! ```
#![deny(missing_docs)]
#![warn(clippy::unwrap_used)]

pub mod addr;
#[cfg(feature = "auth")]
pub mod auth;
// The sign-in limits' numbers are configuration (`authentication:`), so the config model needs
// them even when the Auth Service's logic (`auth` feature) is not built.
// Only the defaults are read there; the limiter itself is the Auth Service's.
#[cfg(not(feature = "auth"))]
#[allow(dead_code, unreachable_pub)]
#[path = "auth/limit.rs"]
mod login_limit;
#[cfg(feature = "auth")]
use auth::limit as login_limit;
pub mod backend;
pub mod channel;
pub mod clock;
pub mod config;
pub mod fs;
pub mod identity;
pub mod maintenance;
pub mod proxy_env;
pub mod rbac;
pub mod resource;
pub mod secret;
pub mod updater;
pub mod version;
pub mod webapi;

pub use addr::{Addr, AddrError, Host};
pub use clock::{Clock, ManualClock, SystemClock};
pub use maintenance::{AgentUpgradeWindow, MaintenanceError, ScheduleError, Window};
pub use rbac::{AccessDenied, RoleSet, Verb};
pub use resource::{Kind, Resource, ResourceError, ResourceRef, Revision, parse_resource, parse_resources};
pub use secret::Secret;
pub use version::{Compatibility, Version, VersionError};
