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

/// Fills in what a singleton can do without: the documented way to configure maintenance is a
/// file with only `kind` and `spec` (specification §2.3), so a missing `version` means `v1` and a
/// missing `metadata` or `metadata.name` means the singleton's name. Anything present is still
/// checked as usual.
pub(super) fn fill_defaults(mut value: serde_yaml_ng::Value) -> serde_yaml_ng::Value {
    use serde_yaml_ng::{Mapping, Value};
    if let Some(doc) = value.as_mapping_mut() {
        if !doc.contains_key("version") {
            doc.insert("version".into(), Kind::ClusterMaintenanceConfig.version().into());
        }
        let metadata = doc
            .entry("metadata".into())
            .or_insert_with(|| Value::Mapping(Mapping::new()));
        if let Some(metadata) = metadata.as_mapping_mut()
            && !metadata.contains_key("name")
        {
            metadata.insert("name".into(), CLUSTER_MAINTENANCE_CONFIG_NAME.into());
        }
    }
    value
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
