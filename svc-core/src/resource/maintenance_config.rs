//! The `cluster_maintenance_config` resource (version `v1`): the singleton that says when agents
//! may be updated. The window arithmetic lives in [`crate::maintenance`].

use serde::{Deserialize, Serialize};

use super::{Invalid, Kind, KindResource, Metadata, invalid};
use crate::maintenance::AgentUpgradeWindow;

/// The only name the singleton may have.
pub const CLUSTER_MAINTENANCE_CONFIG_NAME: &str = "cluster-maintenance-config";

/// The cluster maintenance configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMaintenanceConfig {
    /// Always named [`CLUSTER_MAINTENANCE_CONFIG_NAME`].
    pub metadata: Metadata,
    /// The schedule.
    pub spec: MaintenanceConfigSpec,
}

/// `spec` of the cluster maintenance configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceConfigSpec {
    /// When agents may be updated; absent means no maintenance window is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_upgrades: Option<AgentUpgradeWindow>,
}

impl ClusterMaintenanceConfig {
    /// The singleton with the given agent upgrade window.
    pub fn new(agent_upgrades: Option<AgentUpgradeWindow>) -> Self {
        Self {
            metadata: Metadata::new(CLUSTER_MAINTENANCE_CONFIG_NAME.to_owned()),
            spec: MaintenanceConfigSpec { agent_upgrades },
        }
    }
}

impl KindResource for ClusterMaintenanceConfig {
    const KIND: Kind = Kind::ClusterMaintenanceConfig;
    type Name = String;
    type Spec = MaintenanceConfigSpec;

    fn from_parts(metadata: Metadata, spec: MaintenanceConfigSpec) -> Result<Self, Invalid> {
        if metadata.name != CLUSTER_MAINTENANCE_CONFIG_NAME {
            return Err(invalid(
                "metadata.name",
                format!(
                    "cluster_maintenance_config is a singleton named \"{CLUSTER_MAINTENANCE_CONFIG_NAME}\", got \"{}\"",
                    metadata.name
                ),
            ));
        }
        Ok(Self { metadata, spec })
    }

    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn spec(&self) -> &MaintenanceConfigSpec {
        &self.spec
    }
}
