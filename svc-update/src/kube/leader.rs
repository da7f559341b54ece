//! Leader election over a `coordination.k8s.io/v1` Lease, so that of several updater replicas
//! exactly one reconciles.
//!
//! Sits in front of [`super::controller`]: [`LeaderElector::run`] waits until this replica holds
//! the Lease, runs the controller while it keeps renewing it, and stops the controller the
//! moment the Lease is lost. Every write is an update guarded by the `resourceVersion` read just
//! before (or a create that fails on conflict), so two replicas can never both win the same
//! round. Expiry is judged the way client-go judges it: by how long *this* replica has seen the
//! holder's record unchanged, on its own monotonic clock, never by comparing wall clocks.

use std::{future::Future, sync::Arc, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::time::Instant;

use super::health::Metrics;

/// Timing of the election. Defaults follow client-go's: 15 s lease, renew every 5 s.
#[derive(Debug, Clone, Copy)]
pub struct LeaseTiming {
    /// How long a holder's record must stay unchanged before another replica takes over.
    pub lease_duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
    /// How often a standby replica checks the Lease.
    pub retry_every: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            retry_every: Duration::from_secs(2),
        }
    }
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaderError {
    /// Another replica took the Lease, or renewing failed for a whole lease duration.
    #[error("lost the leader lease {namespace}/{name}: {reason}")]
    Lost {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// What happened.
        reason: String,
    },
}

/// What one round of the election saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    Leader,
    Standby,
}

/// One replica's view of the election.
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timing: LeaseTiming,
    metrics: Arc<Metrics>,
    /// The holder's record last seen (resourceVersion) and when this replica first saw it.
    observed: Option<(String, Instant)>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish()
    }
}

impl LeaderElector {
    /// An elector for the Lease `namespace/name`, competing as `identity` (the pod name).
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: LeaseTiming,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timing,
            metrics,
            observed: None,
        }
    }

    /// Waits for the Lease, then runs `work` while holding it. Returns `work`'s output, or
    /// [`LeaderError::Lost`] as soon as the Lease is lost (dropping `work` mid-flight, so a
    /// replica that is no longer leader stops acting at once).
    pub async fn run<F: Future>(mut self, work: F) -> Result<F::Output, LeaderError> {
        loop {
            if self.round().await == Round::Leader {
                break;
            }
            tokio::time::sleep(self.timing.retry_every).await;
        }
        tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
        self.metrics.leader.set(1);
        let result = tokio::select! {
            output = work => Ok(output),
            lost = self.keep() => Err(lost),
        };
        self.metrics.leader.set(0);
        result
    }

    /// Renews until it cannot; returns why leadership ended.
    async fn keep(&mut self) -> LeaderError {
        let mut last_renewal = Instant::now();
        loop {
            tokio::time::sleep(self.timing.renew_every).await;
            match self.round().await {
                Round::Leader => last_renewal = Instant::now(),
                Round::Standby if self.observed.is_some() => {
                    return self.lost("another replica holds the lease");
                }
                Round::Standby => {
                    if last_renewal.elapsed() >= self.timing.lease_duration {
                        return self.lost("could not renew within the lease duration");
                    }
                }
            }
        }
    }

    fn lost(&self, reason: &str) -> LeaderError {
        LeaderError::Lost {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            reason: reason.to_owned(),
        }
    }

    /// One attempt to acquire or renew. Errors count as standby (and clear nothing), so a
    /// flaky API server never makes two leaders; `observed` is set only when another holder
    /// is seen.
    async fn round(&mut self) -> Round {
        self.metrics.lease_attempts.inc();
        match self.try_round().await {
            Ok(round) => round,
            Err(error) => {
                tracing::warn!(%error, lease = %self.name, "leader election round failed");
                self.observed = None;
                Round::Standby
            }
        }
    }

    async fn try_round(&mut self) -> Result<Round, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now.clone(), now, 0)),
            };
            return self.write(self.api.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let transitions = spec.lease_transitions.unwrap_or(0);
        if holder == self.identity {
            self.observed = None;
            lease.spec = Some(LeaseSpec {
                renew_time: Some(now),
                lease_duration_seconds: Some(self.duration_seconds()),
                ..spec
            });
        } else {
            if !holder.is_empty() && !self.expired(&lease) {
                return Ok(Round::Standby);
            }
            tracing::info!(previous = %holder, identity = %self.identity, "taking over the leader lease");
            lease.spec = Some(self.spec(now.clone(), now, transitions.saturating_add(1)));
        }
        // `replace` sends the resourceVersion we read: a concurrent writer makes it fail with
        // 409 Conflict, and this round is lost rather than shared.
        self.write(self.api.replace(&self.name, &PostParams::default(), &lease).await)
    }

    fn write(&mut self, result: Result<Lease, kube::Error>) -> Result<Round, kube::Error> {
        match result {
            Ok(_) => {
                self.observed = None;
                Ok(Round::Leader)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Someone else wrote first; start timing their record afresh.
                self.observed = Some((String::new(), Instant::now()));
                Ok(Round::Standby)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the other holder's record has stayed unchanged for a whole lease duration.
    fn expired(&mut self, lease: &Lease) -> bool {
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let duration = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.timing.lease_duration, Duration::from_secs);
        match &self.observed {
            Some((seen, since)) if *seen == version => since.elapsed() >= duration,
            _ => {
                self.observed = Some((version, Instant::now()));
                false
            }
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.timing.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    fn spec(&self, acquire: MicroTime, renew: MicroTime, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration_seconds()),
            acquire_time: Some(acquire),
            renew_time: Some(renew),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }
}
