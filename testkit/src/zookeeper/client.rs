//! A small client for assertions on ZooKeeper: one session (with the `zookeeper-client` crate
//! the backend uses) and the few reads and writes tests need, each bounded in time.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::future::Future;
use std::time::Duration;

use zookeeper_client::{Acls, Client, CreateMode, Error, Stat};

/// The session timeout it asks for (the ensemble grants it: 60 s at most by default).
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long without an answer before the client drops a connection and tries another member.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one call may take (reconnections to another member included).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A ZooKeeper session for assertions: reads nodes (stat, czxid, children) and creates and
/// deletes them. From [`ZooKeeperEnsemble::client`](super::ZooKeeperEnsemble::client) (every
/// member), [`member_client`](super::ZooKeeperEnsemble::member_client) (one), or
/// [`connect`](Self::connect) (any connect string, a proxy's).
///
/// The session asks for a 10 s timeout and moves to another member of its connect string by
/// itself when its connection drops or stays silent for 2 s. Its reads first bring its member
/// up to date with the leader (a sync), so they see every write acknowledged before them, by
/// any session. Every helper panics when the call
/// fails or takes more than 10 s, as assertions do; [`inner`](Self::inner) is the crate's
/// client for anything else (watches, multi, ACLs).
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start().await;
/// let zk = ensemble.client().await;
/// let stat = zk.create("/locks/order:42", b"token").await; // the parent too
/// assert_eq!(zk.czxid("/locks/order:42").await, Some(stat.czxid));
/// assert_eq!(zk.children("/locks").await, Some(vec!["order:42".to_owned()]));
/// assert!(zk.delete("/locks/order:42").await);
/// assert_eq!(zk.stat("/locks/order:42").await, None);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ZkClient {
    client: Client,
    connect_string: String,
}

impl ZkClient {
    /// Opens a session on `connect_string` (`host:port,...`, optionally followed by a chroot
    /// path).
    ///
    /// # Panics
    /// When no session is established within 10 s.
    ///
    /// See [`ZkClient`].
    pub async fn connect(connect_string: &str) -> Self {
        match Self::try_connect(connect_string).await {
            Ok(client) => client,
            Err(e) => panic!("no ZooKeeper session on {connect_string}: {e}"),
        }
    }

    /// Opens a session on `connect_string`, or says why it could not within 10 s.
    ///
    /// # Errors
    /// The crate's error, or [`Error::Timeout`].
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// assert!(lock_testkit::zookeeper::ZkClient::try_connect(&ensemble.connect_string()).await.is_ok());
    /// # }
    /// ```
    pub async fn try_connect(connect_string: &str) -> Result<Self, Error> {
        let connect = Client::connector()
            .with_session_timeout(SESSION_TIMEOUT)
            .with_connection_timeout(CONNECTION_TIMEOUT)
            .connect(connect_string);
        let client = tokio::time::timeout(CALL_TIMEOUT, connect)
            .await
            .unwrap_or(Err(Error::Timeout))?;
        Ok(Self {
            client,
            connect_string: connect_string.to_owned(),
        })
    }

    /// The crate's client: watches, multi, ACLs, ephemeral nodes (they live as long as this
    /// session).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use zookeeper_client::{Acls, CreateMode};
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// let zk = ensemble.client().await;
    /// let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
    /// zk.inner().create("/e", b"", &ephemeral).await.unwrap();
    /// # }
    /// ```
    pub fn inner(&self) -> &Client {
        &self.client
    }

    /// The session's id (an ephemeral node's `ephemeral_owner`).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// assert_ne!(ensemble.client().await.session_id(), 0);
    /// # }
    /// ```
    pub fn session_id(&self) -> i64 {
        self.client.session_id().0
    }

    /// Creates a persistent node open to anyone, and its missing parents (empty,
    /// persistent); returns its stat.
    ///
    /// # Panics
    /// When it exists already, or the call fails.
    ///
    /// See [`ZkClient`].
    pub async fn create(&self, path: &str, data: &[u8]) -> Stat {
        let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
        if let Some((parent, _)) = path.rsplit_once('/')
            && !parent.is_empty()
        {
            self.call("mkdir", parent, self.client.mkdir(parent, &options))
                .await;
        }
        self.call("create", path, self.client.create(path, data, &options))
            .await
            .0
    }

    /// The node's stat, or `None` when there is none.
    ///
    /// # Panics
    /// When the call fails.
    ///
    /// See [`ZkClient`].
    pub async fn stat(&self, path: &str) -> Option<Stat> {
        self.catch_up(path).await;
        self.call("stat", path, self.client.check_stat(path)).await
    }

    /// The zxid of the transaction that created the node (the fence of a ZooKeeper lock), or
    /// `None` when there is none.
    ///
    /// # Panics
    /// When the call fails.
    ///
    /// See [`ZkClient`].
    pub async fn czxid(&self, path: &str) -> Option<i64> {
        self.stat(path).await.map(|stat| stat.czxid)
    }

    /// The node's data and stat, or `None` when there is none.
    ///
    /// # Panics
    /// When the call fails.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let ensemble = lock_testkit::zookeeper::ZooKeeperEnsemble::start_single().await;
    /// let zk = ensemble.client().await;
    /// zk.create("/k", b"v").await;
    /// assert_eq!(zk.get("/k").await.unwrap().0, b"v");
    /// # }
    /// ```
    pub async fn get(&self, path: &str) -> Option<(Vec<u8>, Stat)> {
        self.catch_up(path).await;
        none_if_no_node(self.try_call("get", path, self.client.get_data(path)).await)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The node's children, sorted (a lock's contenders in sequence order), or `None` when
    /// there is no node.
    ///
    /// # Panics
    /// When the call fails.
    ///
    /// See [`ZkClient`].
    pub async fn children(&self, path: &str) -> Option<Vec<String>> {
        self.catch_up(path).await;
        let children = none_if_no_node(
            self.try_call("children", path, self.client.list_children(path))
                .await,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        children.map(|mut children| {
            children.sort();
            children
        })
    }

    /// Deletes the node whatever its version; `false` when there was none.
    ///
    /// # Panics
    /// When it has children, or the call fails.
    ///
    /// See [`ZkClient`].
    pub async fn delete(&self, path: &str) -> bool {
        none_if_no_node(
            self.try_call("delete", path, self.client.delete(path, None))
                .await,
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .is_some()
    }

    /// Awaits one call of the crate, panicking with what failed.
    async fn call<T>(
        &self,
        what: &str,
        path: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> T {
        self.try_call(what, path, call)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Awaits one call of the crate within [`CALL_TIMEOUT`]; the error says what failed.
    /// Brings this session's member up to date with the leader before a read: ZooKeeper serves
    /// a read from the member a session is on, which may not have applied another session's
    /// latest writes yet (reads here say what the ensemble holds now).
    async fn catch_up(&self, path: &str) {
        self.call("sync", path, self.client.sync("/")).await;
    }

    async fn try_call<T>(
        &self,
        what: &str,
        path: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, CallError> {
        let answer = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .unwrap_or(Err(Error::Timeout));
        answer.map_err(|error| CallError {
            error,
            message: format!(
                "ZooKeeper {what} {path} (session {:#x} on {}) failed",
                self.session_id(),
                self.connect_string
            ),
        })
    }
}

/// A failed call: the crate's error, and which call.
#[derive(Debug)]
struct CallError {
    error: Error,
    message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.message, self.error)
    }
}

fn none_if_no_node<T>(answer: Result<T, CallError>) -> Result<Option<T>, CallError> {
    match answer {
        Ok(value) => Ok(Some(value)),
        Err(CallError {
            error: Error::NoNode,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}
