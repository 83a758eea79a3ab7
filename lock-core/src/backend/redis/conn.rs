//! The command connection of a Redis backend: one server's connection (our own over plain
//! TCP or a Unix socket, see wire.rs; redis-rs's auto-reconnecting `ConnectionManager` over
//! TLS or RESP3), a cluster connection (the cluster backend), or the connection of the
//! primary a Sentinel set names (the Sentinel backend). Each is a redis-rs
//! `ConnectionLike`, so every script call, pipeline and reply parser of the backend is shared.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::wire::Wire;

#[cfg(feature = "cluster")]
use crate::backend::cluster::ClusterConn;
#[cfg(feature = "sentinel")]
use crate::backend::sentinel::SentinelConn;

#[derive(Clone)]
pub(crate) enum Conn {
    /// One server over plain TCP or a Unix socket, RESP2.
    Wire(Wire),
    /// One server over TLS or RESP3.
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(ClusterConn),
    /// The primary a Sentinel set names, followed across failovers.
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelConn),
}

impl Conn {
    /// The backend's kind (the metrics' `backend` label).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Conn::Wire(_) | Conn::Single(_) => "redis",
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => "cluster",
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(_) => "sentinel",
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Wire(c) => Box::pin(c.command(cmd)),
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Wire(c) => Box::pin(c.pipeline(pipeline, offset, count)),
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Wire(c) => c.db(),
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}
