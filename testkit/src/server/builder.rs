//! The options a [`RedisServer`] starts with.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::fs;
use std::path::PathBuf;

use super::binary::{find_redis_server, missing_message};
use super::{Launch, PORT_ATTEMPTS, RedisServer, ServerTls, requirepass};
use crate::acl::AclUser;
use crate::ports::free_port;
use crate::supervised::Supervised;
use crate::tempdir::TempDir;
use crate::tls::TlsCerts;

/// Options for starting a [`RedisServer`]; from [`RedisServer::builder`].
///
/// ```
/// let server = lock_testkit::RedisServer::builder()
///     .args(["--maxclients", "100"])
///     .unixsocket()
///     .start();
/// assert!(server.unix_url().is_some());
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct RedisServerBuilder {
    binary: Option<PathBuf>,
    args: Vec<String>,
    unixsocket: bool,
    config: Option<String>,
    sentinel: bool,
    /// The certificate files of a TLS port, and whether clients must present a certificate.
    tls: Option<(PathBuf, PathBuf, PathBuf, bool)>,
}

impl RedisServerBuilder {
    /// Adds one extra command-line argument (after the harness's own).
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::builder().arg("--maxclients").arg("100").start();
    /// # drop(server);
    /// ```
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds extra command-line arguments. An ACL rule is one `--user` followed by its words as
    /// separate arguments: `["--user", "app", "on", ">secret", "~*", "+@all"]`.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::builder().args(["--requirepass", "pw"]).start();
    /// assert_eq!(server.password(), Some("pw"));
    /// ```
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Protects the default user with `password` (`--requirepass`); the helpers log in with it.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::builder().requirepass("pw").start();
    /// assert_eq!(server.password(), Some("pw"));
    /// ```
    pub fn requirepass(self, password: &str) -> Self {
        self.args(["--requirepass", password])
    }

    /// Defines an ACL user; [`RedisServer::url_for`] logs in as it.
    ///
    /// ```
    /// use lock_testkit::{AclUser, RedisServer};
    /// let user = AclUser::new("app", "pw").rules(["~*", "+@all"]);
    /// let server = RedisServer::builder().user(&user).start();
    /// assert!(server.url_for(&user).starts_with("redis://app:pw@"));
    /// ```
    pub fn user(self, user: &AclUser) -> Self {
        self.args(user.to_args())
    }

    /// Also listens on a unix socket in the server's directory; see [`RedisServer::unix_url`].
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::builder().unixsocket().start();
    /// assert!(server.unix_url().unwrap().starts_with("redis+unix://"));
    /// ```
    pub fn unixsocket(mut self) -> Self {
        self.unixsocket = true;
        self
    }

    /// Starts the server with a config file holding `text`: written as `redis.conf` in the
    /// server's directory and given as the first argument (before the harness's own options,
    /// which override it). The server may rewrite it (`CONFIG REWRITE`, sentinel state); a
    /// [`restart`](RedisServer::restart) reads the rewritten file.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let server = lock_testkit::RedisServer::builder().config("maxclients 77\n").start();
    /// let v: Vec<String> = server.query(redis::cmd("CONFIG").arg("GET").arg("maxclients").clone()).await;
    /// assert_eq!(v[1], "77");
    /// # }
    /// ```
    pub fn config(mut self, text: impl Into<String>) -> Self {
        self.config = Some(text.into());
        self
    }

    /// Runs the process as a Redis Sentinel (`--sentinel`). Sentinel needs a config file it can
    /// rewrite: give its `sentinel monitor ...` lines with [`config`](Self::config) (an empty
    /// config is written when none is given). Readiness is the sentinel's `Sentinel ID is` log
    /// line instead of `Ready to accept connections`. See [`crate::sentinel`] for a whole set.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let sentinel = lock_testkit::RedisServer::builder().sentinel().start();
    /// let masters: Vec<redis::Value> = sentinel.query(redis::cmd("SENTINEL").arg("MASTERS").clone()).await;
    /// assert!(masters.is_empty());
    /// # }
    /// ```
    pub fn sentinel(mut self) -> Self {
        self.sentinel = true;
        self
    }

    /// Also listens for TLS on a port of its own ([`RedisServer::tls_port`],
    /// [`RedisServer::tls_url`]) with the server certificate of `certs` (`--tls-port`,
    /// `--tls-cert-file`, `--tls-key-file`, `--tls-ca-cert-file`; the files are copied into the
    /// server's directory), not asking clients for a certificate (`--tls-auth-clients no`;
    /// see [`tls_auth_clients`](Self::tls_auth_clients)). The plain port stays, for the
    /// helpers (and readiness); the code under test is given the TLS URL. A replica or a
    /// cluster node also needs `--tls-replication yes` or `--tls-cluster yes` (the
    /// [`sentinel`](crate::sentinel) and [`cluster`](crate::cluster) builders' `tls` add them).
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// let server = lock_testkit::RedisServer::builder().tls(&certs).start();
    /// assert!(server.tls_url().starts_with("rediss://127.0.0.1:"));
    /// ```
    pub fn tls(mut self, certs: &TlsCerts) -> Self {
        self.tls = Some((
            certs.server_cert_path(),
            certs.server_key_path(),
            certs.ca_path(),
            false,
        ));
        self
    }

    /// With [`tls`](Self::tls): clients must present a certificate signed by the authority
    /// (`--tls-auth-clients yes`, mutual TLS).
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// let server = lock_testkit::RedisServer::builder().tls(&certs).tls_auth_clients().start();
    /// assert!(server.tls_port().is_some());
    /// ```
    pub fn tls_auth_clients(mut self) -> Self {
        if let Some(tls) = &mut self.tls {
            tls.3 = true;
        }
        self
    }

    /// Uses this `redis-server` binary instead of looking for one. A path that is not a file
    /// makes [`start`](Self::start) panic with the install command.
    ///
    /// ```should_panic
    /// lock_testkit::RedisServer::builder().binary("/nonexistent/redis-server").start();
    /// ```
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// # Panics
    /// When `redis-server` is missing (the message names `apt-get install -y redis-server`),
    /// when it exits at start (the message holds its log), or when it does not answer within
    /// 15 s.
    ///
    /// ```
    /// let server = lock_testkit::RedisServer::builder().start();
    /// assert!(server.port() > 0);
    /// ```
    pub fn start(self) -> RedisServer {
        let binary = match self.binary {
            Some(path) if path.is_file() => path,
            Some(path) => panic!(
                "{}",
                missing_message(&format!(
                    "the redis-server binary {} does not exist",
                    path.display()
                ))
            ),
            None => find_redis_server().unwrap_or_else(|message| panic!("{message}")),
        };
        let dir = TempDir::new();
        let password = requirepass(&self.args);
        let unixsocket = self.unixsocket.then(|| dir.path().join("redis.sock"));
        let config_text = match (self.config, self.sentinel) {
            (Some(text), _) => Some(text),
            (None, true) => Some(String::new()),
            (None, false) => None,
        };
        let config = config_text.map(|text| {
            let path = dir.path().join("redis.conf");
            fs::write(&path, text)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            path
        });
        let tls = self.tls.map(|(cert, key, ca, auth_clients)| {
            let copy = |from: PathBuf, name: &str| {
                let to = dir.path().join(name);
                fs::copy(&from, &to).unwrap_or_else(|e| {
                    panic!("cannot copy {} to {}: {e}", from.display(), to.display())
                });
                to
            };
            Box::new(ServerTls {
                port: 0,
                cert: copy(cert, "tls-server.crt"),
                key: copy(key, "tls-server.key"),
                ca: copy(ca, "tls-ca.crt"),
                auth_clients,
            })
        });
        let mut server = RedisServer {
            binary,
            args: self.args,
            tls,
            port: 0,
            dir,
            unixsocket,
            password,
            config,
            sentinel: self.sentinel,
            process: Supervised::default(),
        };
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port();
            if let Some(tls) = &mut server.tls {
                tls.port = free_port();
            }
            match server.launch() {
                Ok(()) => return server,
                Err(Launch::PortTaken(log)) => last = log,
            }
        }
        panic!(
            "redis-server could not bind a free port in {PORT_ATTEMPTS} attempts; last log:\n{last}"
        );
    }
}
