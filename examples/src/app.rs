//! [`Shop`]: the service's locker, state and configuration, and how to serve it (its routes
//! are in [`routes`](crate::routes)).

use std::net::SocketAddr;
use std::time::Duration;

use lock_core::{LockError, Locker, RedisBackend};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::checkout::Payments;
use crate::inventory::Inventory;
use crate::lottery::Lottery;
use crate::store::{Store, StoreError};

/// How the service behaves.
///
/// ```
/// let config = lock_examples::ShopConfig::default();
/// assert!(config.locking);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ShopConfig {
    /// How long each read-modify-write works between its read and its write (default 10 ms).
    pub work: Duration,
    /// Whether the locks are taken at all (default `true`; `false` is the `--no-lock` lesson).
    pub locking: bool,
    /// How long a reservation waits for the SKU's lock unless the client sent `Prefer: wait=0`
    /// (default 5 s).
    pub inventory_wait: Duration,
}

impl Default for ShopConfig {
    fn default() -> Self {
        ShopConfig {
            work: Duration::from_millis(10),
            locking: true,
            inventory_wait: Duration::from_secs(5),
        }
    }
}

impl ShopConfig {
    /// Sets [`work`](Self::work).
    ///
    /// ```
    /// let c = lock_examples::ShopConfig::default().work(std::time::Duration::ZERO);
    /// assert!(c.work.is_zero());
    /// ```
    #[must_use]
    pub fn work(mut self, work: Duration) -> Self {
        self.work = work;
        self
    }

    /// Sets [`locking`](Self::locking).
    ///
    /// ```
    /// assert!(!lock_examples::ShopConfig::default().locking(false).locking);
    /// ```
    #[must_use]
    pub fn locking(mut self, on: bool) -> Self {
        self.locking = on;
        self
    }
}

/// A failure to set the service up (bad `REDIS_URL`, Redis unreachable).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The lock backend could not be set up.
    #[error("cannot set up the locks: {0}")]
    Lock(#[from] LockError),
    /// The state store could not be set up.
    #[error("cannot set up the state store: {0}")]
    Store(#[from] StoreError),
    /// The listener could not be bound or served.
    #[error("cannot serve: {0}")]
    Io(#[from] std::io::Error),
}

/// The flash-sale service: its locker, its state and its routes.
///
/// ```
/// # async fn demo() {
/// use lock_examples::{Shop, ShopConfig};
/// let shop = Shop::memory(ShopConfig::default());
/// shop.inventory().seed("sku-1", 10).await.unwrap();
/// let router: axum::Router = shop.router();
/// # drop(router);
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Clone)]
pub struct Shop {
    locker: Locker,
    store: Store,
    inventory: Inventory,
    lottery: Lottery,
    payments: Payments,
    config: ShopConfig,
}

impl Shop {
    /// A shop with `locker` for its locks and `store` for its state.
    ///
    /// ```
    /// use lock_examples::{Shop, ShopConfig, Store};
    /// let shop = Shop::new(lock_core::Locker::memory(), Store::memory("shop:"), ShopConfig::default());
    /// # drop(shop);
    /// ```
    pub fn new(locker: Locker, store: Store, config: ShopConfig) -> Shop {
        // The locks' metrics are recorded from the first one on (served at `/metrics`).
        let _ = crate::metrics::handle();
        Shop {
            inventory: Inventory::new(store.clone(), config.work),
            lottery: Lottery::new(store.clone(), locker.clone(), config.work)
                .locking(config.locking),
            payments: Payments::new(store.clone(), config.work),
            locker,
            store,
            config,
        }
    }

    /// Everything in this process: the embedded lock backend and an in-memory store.
    ///
    /// ```
    /// let shop = lock_examples::Shop::memory(lock_examples::ShopConfig::default());
    /// assert_eq!(shop.store().backend_name(), "memory");
    /// ```
    pub fn memory(config: ShopConfig) -> Shop {
        Shop::new(Locker::memory(), Store::memory("flash-sale:"), config)
    }

    /// Locks and state in the Redis at `url`, every key under `namespace` (locks under
    /// `{namespace}lock:`). Every copy of the service given the same URL and namespace shares
    /// the same stock, draws and locks.
    ///
    /// # Errors
    /// [`SetupError`] when Redis cannot be reached or the URL is bad.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_examples::SetupError> {
    /// use lock_examples::{Shop, ShopConfig};
    /// let shop = Shop::redis("redis://127.0.0.1:6379/", "shop:", ShopConfig::default()).await?;
    /// # drop(shop); Ok(()) }
    /// ```
    pub async fn redis(url: &str, namespace: &str, config: ShopConfig) -> Result<Shop, SetupError> {
        let backend = RedisBackend::connect(url).await?;
        let locker = Locker::builder(backend)
            .prefix(format!("{namespace}lock:"))
            .try_build()?;
        let store = Store::redis(url, namespace).await?;
        Ok(Shop::new(locker, store, config))
    }

    /// Locks in the etcd cluster at `urls` (under `{namespace}lock:`), state in `store`:
    /// locks no failover can lose (an acquire is committed by a majority), with state shared
    /// through Redis when `store` is a Redis store.
    ///
    /// # Errors
    /// [`SetupError`] when etcd cannot be reached or a URL is bad.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_examples::SetupError> {
    /// use lock_examples::{Shop, ShopConfig, Store};
    /// let urls = ["http://127.0.0.1:2379"];
    /// let shop = Shop::etcd(&urls, Store::memory("shop:"), "shop:", ShopConfig::default()).await?;
    /// # drop(shop); Ok(()) }
    /// ```
    #[cfg(feature = "etcd")]
    pub async fn etcd(
        urls: &[&str],
        store: Store,
        namespace: &str,
        config: ShopConfig,
    ) -> Result<Shop, SetupError> {
        let backend = lock_core::EtcdBackend::connect(urls).await?;
        let locker = Locker::builder(backend)
            .prefix(format!("{namespace}lock:"))
            .try_build()?;
        Ok(Shop::new(locker, store, config))
    }

    /// A shop with its locks on the ZooKeeper ensemble of `hosts` (a connect string, feature
    /// `zookeeper`), with state shared through Redis when `store` is a Redis store.
    ///
    /// # Errors
    /// [`SetupError`] when no server grants a session or the connect string is bad.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_examples::SetupError> {
    /// use lock_examples::{Shop, ShopConfig, Store};
    /// let shop = Shop::zookeeper("127.0.0.1:2181", Store::memory("shop:"), "shop:", ShopConfig::default()).await?;
    /// # drop(shop); Ok(()) }
    /// ```
    #[cfg(feature = "zookeeper")]
    pub async fn zookeeper(
        hosts: &str,
        store: Store,
        namespace: &str,
        config: ShopConfig,
    ) -> Result<Shop, SetupError> {
        let backend = lock_core::ZooKeeperBackend::connect(hosts).await?;
        let locker = Locker::builder(backend)
            .prefix(format!("{namespace}lock:"))
            .try_build()?;
        Ok(Shop::new(locker, store, config))
    }

    /// The locker.
    ///
    /// ```
    /// let shop = lock_examples::Shop::memory(Default::default());
    /// assert_eq!(shop.locker().prefix(), "lock:");
    /// ```
    pub fn locker(&self) -> &Locker {
        &self.locker
    }

    /// The state store.
    ///
    /// ```
    /// let shop = lock_examples::Shop::memory(Default::default());
    /// assert_eq!(shop.store().namespace(), "flash-sale:");
    /// ```
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The inventory service.
    ///
    /// ```
    /// # async fn demo() {
    /// let shop = lock_examples::Shop::memory(Default::default());
    /// shop.inventory().seed("sku-1", 10).await.unwrap();
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The lottery service.
    ///
    /// ```
    /// # async fn demo() {
    /// let shop = lock_examples::Shop::memory(Default::default());
    /// shop.lottery().seed("spring", 3).await.unwrap();
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn lottery(&self) -> &Lottery {
        &self.lottery
    }

    /// The simulated payment store behind `POST /checkout`.
    ///
    /// ```
    /// # async fn demo() {
    /// let shop = lock_examples::Shop::memory(Default::default());
    /// assert!(shop.payments().charges("o-1").await.unwrap().is_empty());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub fn payments(&self) -> &Payments {
        &self.payments
    }

    /// The configuration.
    ///
    /// ```
    /// let shop = lock_examples::Shop::memory(Default::default());
    /// assert!(shop.config().locking);
    /// ```
    pub fn config(&self) -> &ShopConfig {
        &self.config
    }

    /// Serves the app on `listener` in a background task; [`RunningServer::stop`] ends it.
    ///
    /// ```
    /// # async fn demo() {
    /// let shop = lock_examples::Shop::memory(Default::default());
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    /// let server = shop.spawn(listener).unwrap();
    /// assert!(server.addr().port() > 0);
    /// server.stop().await;
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    ///
    /// # Errors
    /// The listener's address cannot be read.
    pub fn spawn(&self, listener: TcpListener) -> Result<RunningServer, SetupError> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let app = self.router();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        });
        Ok(RunningServer { addr, stop, task })
    }
}

/// A server started by [`Shop::spawn`].
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningServer {
    /// Where it listens.
    ///
    /// ```no_run
    /// # fn f(s: lock_examples::RunningServer) { println!("{}", s.addr()); }
    /// ```
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{addr}`.
    ///
    /// ```no_run
    /// # fn f(s: lock_examples::RunningServer) { assert!(s.base_url().starts_with("http://")); }
    /// ```
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets requests in flight finish (up to 5 s), then ends the task.
    ///
    /// ```no_run
    /// # async fn f(s: lock_examples::RunningServer) { s.stop().await; }
    /// ```
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}
