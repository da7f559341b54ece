//! The Kubernetes updater: a controller that keeps an agent's StatefulSet or Deployment on the
//! version its channel serves, and the agent-side export of the maintenance schedule it reads.
//!
//! Data flow (specification §1.7, §6):
//!
//! ```text
//! agent ──[schedule::export_schedule]──► shared-state Secret (agent-maintenance-schedule)
//! version server ──[target::TargetSource]──┐
//! Secret + pods + workload ────────────────┼─► [decision::decide] ─► patch image / nothing
//! watch events, 30 min resync ─────────────┘   ([controller::run], one leader: [leader])
//!     patch image ─► wait for the new pods to be ready (bounded) ─► or restore the previous
//!     image and mark the version bad ─► shared-state Secret (agent-update-status,
//!     agent-bad-versions: [status]) ─► read back by the agent for its heartbeat
//! agent ──[identity::SecretIdentityStore]──► its own Secret per replica (host identity)
//! ```
//!
//! [`decision::decide`] is a pure function; everything that talks to the API server lives in
//! [`controller`], [`leader`] and [`schedule`]; [`health`] serves `/healthz`, `/readyz` and
//! `/metrics`.

pub mod agent;
pub mod controller;
pub mod decision;
pub mod health;
pub mod identity;
pub mod leader;
pub mod schedule;
pub mod status;
pub mod target;
pub mod updater;

pub use controller::{UpdaterConfig, WorkloadKind};
pub use decision::{Decision, SkipReason, UpdateReason, decide};
pub use target::{Target, TargetError, TargetSource, VersionClient};

/// Annotation that suspends automatic updates of the workload when set to `"true"` (§6.3).
pub(crate) const SKIP_RECONCILE_ANNOTATION: &str = "svc.dev/skipreconcile";

/// Annotation that clears the versions marked bad when set to `"true"`; the updater removes
/// it (and the list) at its next reconcile.
pub const CLEAR_BAD_VERSIONS_ANNOTATION: &str = "svc.dev/clear-bad-versions";

/// Annotation whose change is just a watch event, and so an immediate reconcile (§6.2).
pub const TRIGGER_EVENT_ANNOTATION: &str = "debug.svc.dev/trigger-event";

/// Key of the agent's shared-state Secret that holds the maintenance schedule JSON.
pub(crate) const SCHEDULE_SECRET_KEY: &str = "agent-maintenance-schedule";

/// The default name of the agent's shared-state Secret: `<agent-name>-shared-state`.
pub fn default_shared_state_secret(agent_name: &str) -> String {
    format!("{agent_name}-shared-state")
}
