//! ACL users a server starts with, and the URLs that log in as them.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use lock_testkit::{AclUser, RedisServer};
//!
//! let app = AclUser::new("app", "s3cret").rules(["~lock:*", "&lock:*", "+@all"]);
//! let server = RedisServer::builder().requirepass("adminpw").user(&app).start();
//! assert_eq!(server.url_for(&app), format!("redis://app:s3cret@127.0.0.1:{}/", server.port()));
//! let mut conn = redis::Client::open(server.url_for(&app)).unwrap()
//!     .get_multiplexed_async_connection().await.unwrap();
//! let refused: redis::RedisResult<()> = redis::cmd("SET").arg("other").arg("1").query_async(&mut conn).await;
//! assert!(refused.is_err(), "the user's keys are restricted to lock:*");
//! # }
//! ```

/// One ACL user: a name, a password, and its `ACL SETUSER` rule words in order (`on`, the
/// `>password`, key patterns `~...`, channel patterns `&...`, commands `+@all`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclUser {
    name: String,
    password: String,
    words: Vec<String>,
}

impl AclUser {
    /// A user that can log in and do nothing until [`rules`](Self::rules) grant it something.
    pub fn new(name: impl Into<String>, password: impl Into<String>) -> Self {
        let password = password.into();
        AclUser {
            name: name.into(),
            words: vec!["on".to_owned(), format!(">{password}")],
            password,
        }
    }

    /// The words of an `ACL SETUSER` rule after `ACL SETUSER`, user name first (as a README
    /// gives it), kept word for word and in order; the password is the `>word`. `None`
    /// without a name or a `>password`.
    ///
    /// ```
    /// let user = lock_testkit::AclUser::from_setuser("app on >pw ~lock:* +@all".split_whitespace()).unwrap();
    /// assert_eq!((user.name(), user.password()), ("app", "pw"));
    /// assert_eq!(user.to_args(), ["--user", "app", "on", ">pw", "~lock:*", "+@all"]);
    /// ```
    pub fn from_setuser<I, S>(words: I) -> Option<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut words = words.into_iter().map(Into::into);
        let name = words.next()?;
        let words: Vec<String> = words.collect();
        let password = words.iter().find_map(|w| w.strip_prefix('>'))?.to_owned();
        Some(AclUser {
            name,
            password,
            words,
        })
    }

    /// Adds rule words (`~lock:*`, `&lock:*`, `+@all`, `-flushall`...).
    #[must_use]
    pub fn rules<I, S>(mut self, rules: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.words.extend(rules.into_iter().map(Into::into));
        self
    }

    /// The user name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The server's command-line arguments that define the user: `--user <name> <words...>`.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec!["--user".to_owned(), self.name.clone()];
        args.extend(self.words.iter().cloned());
        args
    }
}
