//! A [`Target`] made into a `Locker` with the operator's prefix: the only door to the locks the
//! commands use ([`Locker::inspect`], [`Locker::list`], [`Locker::force_unlock`]).

use lock_core::{LockError, Locker};

use crate::failure::Failure;
use crate::target::Target;

/// The holder identity the tool's own locker records (it takes no lock; the audit log of a
/// force unlock names it as `by`).
fn operator() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    // Shown in logs and terminals: printable ASCII only.
    let user: String = user
        .chars()
        .filter(char::is_ascii_graphic)
        .take(64)
        .collect();
    format!("lock-admin/{user}/pid {}", std::process::id())
}

/// A connected locker, and the permission check a Redis backend can run before a write.
pub(crate) struct Admin {
    pub(crate) locker: Locker,
    check: Check,
}

/// The backends whose Redis user can be checked before `force_unlock` (its script writes: a
/// command refused half-way through would leave the lock deleted and its waiters unwoken).
enum Check {
    Redis(lock_core::RedisBackend),
    Cluster(lock_core::RedisClusterBackend),
    Sentinel(lock_core::RedisSentinelBackend),
    Redlock(lock_core::RedlockBackend),
    None,
}

impl Admin {
    /// Connects to `target`; the locker's keys are under `prefix` (`None`: the library's).
    pub(crate) async fn connect(target: &Target, prefix: Option<&str>) -> Result<Admin, Failure> {
        let shown = prefix.unwrap_or(lock_core::DEFAULT_PREFIX);
        Self::connect_to(target, prefix)
            .await
            .map_err(|e| Failure::lock(&e, "connect", target.kind(), shown))?
            .ok_or_else(|| {
                Failure::usage(format!(
                    "this lock-admin was built without {} (its cargo feature)",
                    target.kind()
                ))
            })
    }

    /// `None` for a backend this build leaves out.
    async fn connect_to(target: &Target, prefix: Option<&str>) -> Result<Option<Admin>, LockError> {
        let (backend, check): (std::sync::Arc<dyn lock_core::Backend>, Check) = match target {
            Target::Redis { url } => {
                let b = lock_core::RedisBackend::connect(url).await?;
                (
                    lock_core::backend::IntoBackend::into_backend(b.clone()),
                    Check::Redis(b),
                )
            }
            Target::Cluster { nodes } => {
                let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
                let b = lock_core::RedisClusterBackend::connect(&nodes).await?;
                (
                    lock_core::backend::IntoBackend::into_backend(b.clone()),
                    Check::Cluster(b),
                )
            }
            Target::Sentinel {
                sentinels,
                master,
                user,
                password,
                db,
            } => {
                let sentinels: Vec<&str> = sentinels.iter().map(String::as_str).collect();
                let mut builder = lock_core::RedisSentinelBackend::builder(&sentinels, master)
                    .master_auth(user.as_deref(), password.as_deref());
                if let Some(db) = db {
                    builder = builder.db(*db);
                }
                let b = builder.connect().await?;
                (
                    lock_core::backend::IntoBackend::into_backend(b.clone()),
                    Check::Sentinel(b),
                )
            }
            Target::Redlock { servers } => {
                let servers: Vec<&str> = servers.iter().map(String::as_str).collect();
                let b = lock_core::RedlockBackend::connect(&servers).await?;
                (
                    lock_core::backend::IntoBackend::into_backend(b.clone()),
                    Check::Redlock(b),
                )
            }
            Target::Etcd {
                endpoints,
                namespace,
                auth,
            } => match etcd(endpoints, namespace.as_deref(), auth.as_ref()).await? {
                Some(b) => (b, Check::None),
                None => return Ok(None),
            },
            Target::ZooKeeper { hosts, root, auth } => {
                match zookeeper(hosts, root.as_deref(), auth.as_ref()).await? {
                    Some(b) => (b, Check::None),
                    None => return Ok(None),
                }
            }
        };
        let mut builder = Locker::builder(backend).holder(operator());
        if let Some(prefix) = prefix {
            builder = builder.prefix(prefix);
        }
        Ok(Some(Admin {
            locker: builder.try_build()?,
            check,
        }))
    }

    /// Before a force unlock: on the Redis backends, checks that the user may run every
    /// command the lock's scripts run on the prefix's keys and channels (writes nothing).
    pub(crate) async fn check_write_permissions(&self) -> Result<(), LockError> {
        let prefix = self.locker.prefix();
        match &self.check {
            Check::Redis(b) => b.check_permissions(prefix).await,
            Check::Cluster(b) => b.check_permissions(prefix).await,
            Check::Sentinel(b) => b.check_permissions(prefix).await,
            Check::Redlock(b) => b.check_permissions(prefix).await,
            Check::None => Ok(()),
        }
    }
}

#[cfg(feature = "etcd")]
async fn etcd(
    endpoints: &[String],
    namespace: Option<&str>,
    auth: Option<&(String, String)>,
) -> Result<Option<std::sync::Arc<dyn lock_core::Backend>>, LockError> {
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let mut builder = lock_core::EtcdBackend::builder(&endpoints);
    if let Some(namespace) = namespace {
        builder = builder.namespace(namespace);
    }
    if let Some((user, password)) = auth {
        builder = builder.auth(user, password);
    }
    Ok(Some(lock_core::backend::IntoBackend::into_backend(
        builder.connect().await?,
    )))
}

#[cfg(not(feature = "etcd"))]
async fn etcd(
    _: &[String],
    _: Option<&str>,
    _: Option<&(String, String)>,
) -> Result<Option<std::sync::Arc<dyn lock_core::Backend>>, LockError> {
    Ok(None)
}

#[cfg(feature = "zookeeper")]
async fn zookeeper(
    hosts: &str,
    root: Option<&str>,
    auth: Option<&(String, String)>,
) -> Result<Option<std::sync::Arc<dyn lock_core::Backend>>, LockError> {
    let mut builder = lock_core::ZooKeeperBackend::builder(hosts);
    if let Some(root) = root {
        builder = builder.root(root);
    }
    if let Some((user, password)) = auth {
        builder = builder.auth(user, password);
    }
    Ok(Some(lock_core::backend::IntoBackend::into_backend(
        builder.connect().await?,
    )))
}

#[cfg(not(feature = "zookeeper"))]
async fn zookeeper(
    _: &str,
    _: Option<&str>,
    _: Option<&(String, String)>,
) -> Result<Option<std::sync::Arc<dyn lock_core::Backend>>, LockError> {
    Ok(None)
}
