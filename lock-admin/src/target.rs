//! `--url`: which backend the tool talks to, one URL for every kind of backend.
//!
//! | URL | backend |
//! |---|---|
//! | `redis://[user:pass@]host:port[/db]`, `rediss://…`, `redis+unix:///path`, `unix:///path` | one Redis server |
//! | `redis+cluster://[user:pass@]h1:p1,h2:p2`, `rediss+cluster://…` | Redis Cluster (some of its nodes) |
//! | `redis+sentinel://[user:pass@]h1:p1,h2:p2/MASTER[/db]`, `rediss+sentinel://…` | the primary Sentinel names `MASTER` |
//! | `redlock://[user:pass@]h1:p1,h2:p2,h3:p3`, `redlock+rediss://…` | Redlock over N servers |
//! | `etcd://[user:pass@]h1:2379,h2:2379[?namespace=app/]`, `etcd+https://…` | etcd v3 |
//! | `zookeeper://[user:pass@]h1:2181,h2:2181[/chroot][?root=/lock-core]` | ZooKeeper |
//!
//! The user and password are the Redis ACL user's (on Sentinel: the primary's; the sentinels'
//! own go in `?sentinel_user=…&sentinel_password=…`), etcd's user, ZooKeeper's `digest` user.
//! Parsing never panics and never echoes a password: errors show the URL with it masked.

use std::fmt;

/// A parsed `--url`: what to connect to.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// One Redis server: the URL as given (redis-rs reads it).
    Redis { url: String },
    /// A Redis Cluster: one `redis://` (or `rediss://`) URL per node given.
    Cluster { nodes: Vec<String> },
    /// A Sentinel group: the sentinels' URLs, the primary's name, its user, password and db.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        user: Option<String>,
        password: Option<String>,
        db: Option<i64>,
    },
    /// Redlock: one `redis://` (or `rediss://`) URL per server.
    Redlock { servers: Vec<String> },
    /// etcd: `http://` (or `https://`) endpoints, a namespace, a user and password.
    Etcd {
        endpoints: Vec<String>,
        namespace: Option<String>,
        auth: Option<(String, String)>,
    },
    /// ZooKeeper: the connect string (with its chroot), the locks' root node, a digest user.
    ZooKeeper {
        hosts: String,
        root: Option<String>,
        auth: Option<(String, String)>,
    },
}

/// What is wrong with a `--url`, said with the URL's password masked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UrlError(pub(crate) String);

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UrlError {}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        write!(f, "Target({})", self.kind())
    }
}

/// The schemes, for the error that lists them.
const SCHEMES: &str = "redis://, rediss://, redis+unix://, unix://, redis+cluster://, rediss+cluster://, redis+sentinel://, rediss+sentinel://, redlock://, redlock+rediss://, etcd://, etcd+https://, zookeeper://";

impl Target {
    /// The kind of backend, as the tool's messages name it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Target::Redis { .. } => "Redis",
            Target::Cluster { .. } => "Redis Cluster",
            Target::Sentinel { .. } => "Redis Sentinel",
            Target::Redlock { .. } => "Redlock",
            Target::Etcd { .. } => "etcd",
            Target::ZooKeeper { .. } => "ZooKeeper",
        }
    }

    /// Parses a `--url` (see the module's table).
    pub(crate) fn parse(url: &str) -> Result<Target, UrlError> {
        let url = url.trim();
        let shown = bounded(&mask(url), 200);
        let fail = |why: String| UrlError(format!("bad --url {shown:?}: {}", bounded(&why, 300)));
        if url.is_empty() {
            return Err(UrlError(format!(
                "--url is empty: give one of {SCHEMES} (or set LOCK_ADMIN_URL)"
            )));
        }
        if url.chars().any(char::is_control) {
            return Err(fail("it holds a control character".to_owned()));
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            if url.eq_ignore_ascii_case("memory") || url.to_ascii_lowercase().starts_with("memory:")
            {
                return Err(fail(
                    "the memory backend lives inside one process: another process (this tool) cannot see its locks; call Locker::inspect/list/force_unlock in that process instead".to_owned(),
                ));
            }
            return Err(fail(format!("no scheme; use one of {SCHEMES}")));
        };
        let scheme = scheme.to_ascii_lowercase();
        match scheme.as_str() {
            "redis" | "rediss" | "redis+unix" | "unix" => {
                if scheme.starts_with("redis") && !scheme.ends_with("unix") {
                    let (login, after) = split_login(rest);
                    login.map(check_login).transpose().map_err(fail)?;
                    let hosts = after.split(['/', '?', '#']).next().unwrap_or("");
                    if hosts.contains(',') {
                        return Err(fail(
                            "several hosts in a one-server URL: use redis+cluster://, redis+sentinel://h1,h2/MASTER or redlock:// for several".to_owned(),
                        ));
                    }
                    if hosts.is_empty() {
                        return Err(fail("no host".to_owned()));
                    }
                    host_port(hosts, 6379).map_err(fail)?;
                } else if rest.is_empty() {
                    return Err(fail("no socket path".to_owned()));
                }
                Ok(Target::Redis {
                    url: url.to_owned(),
                })
            }
            "memory" => Err(fail(
                "the memory backend lives inside one process: this tool cannot see its locks"
                    .to_owned(),
            )),
            _ => Self::parse_many(&scheme, rest).map_err(fail),
        }
    }

    /// The schemes with several hosts.
    fn parse_many(scheme: &str, rest: &str) -> Result<Target, String> {
        let parts = Parts::split(rest)?;
        let (tls, kind) = match scheme {
            "redis+cluster" => (false, "cluster"),
            "rediss+cluster" => (true, "cluster"),
            "redis+sentinel" => (false, "sentinel"),
            "rediss+sentinel" => (true, "sentinel"),
            "redlock" | "redlock+redis" => (false, "redlock"),
            "redlock+rediss" => (true, "redlock"),
            "etcd" | "etcd+http" => (false, "etcd"),
            "etcd+https" => (true, "etcd"),
            "zookeeper" | "zk" => (false, "zookeeper"),
            other => return Err(format!("unknown scheme {other:?}; use one of {SCHEMES}")),
        };
        let redis_scheme = if tls { "rediss" } else { "redis" };
        let default_port = match kind {
            "sentinel" => 26379,
            "etcd" => 2379,
            "zookeeper" => 2181,
            _ => 6379,
        };
        let hosts = parts
            .hosts
            .iter()
            .map(|h| host_port(h, default_port))
            .collect::<Result<Vec<_>, _>>()?;
        let login = parts.userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        match kind {
            "cluster" | "redlock" => {
                parts.allow_query(&[])?;
                let db = match parts.path.trim_matches('/') {
                    "" => String::new(),
                    db if kind == "redlock" && db.parse::<u32>().is_ok() => db.to_owned(),
                    other => {
                        return Err(format!(
                            "unexpected path {other:?} (a cluster has no databases; Redlock takes /DB)"
                        ));
                    }
                };
                let urls = hosts
                    .iter()
                    .map(|h| format!("{redis_scheme}://{login}{h}/{db}"))
                    .collect();
                Ok(if kind == "cluster" {
                    Target::Cluster { nodes: urls }
                } else {
                    Target::Redlock { servers: urls }
                })
            }
            "sentinel" => {
                parts.allow_query(&["sentinel_user", "sentinel_password"])?;
                let mut path = parts.path.trim_matches('/').split('/');
                let master = path.next().unwrap_or("");
                if master.is_empty() {
                    return Err(
                        "no primary name: redis+sentinel://h1:26379,h2:26379/MASTER".to_owned()
                    );
                }
                let db = match path.next() {
                    None => None,
                    Some(db) => Some(
                        db.parse::<i64>()
                            .ok()
                            .filter(|d| *d >= 0)
                            .ok_or_else(|| format!("database {db:?} is not a number"))?,
                    ),
                };
                if path.next().is_some() {
                    return Err("the path is /MASTER or /MASTER/DB".to_owned());
                }
                let (user, password) = match parts.userinfo {
                    None => (None, None),
                    Some(u) => {
                        let (user, password) = split_userinfo(u)?;
                        (Some(user).filter(|u| !u.is_empty()), password)
                    }
                };
                let sentinel_login = match (
                    parts.query("sentinel_user"),
                    parts.query("sentinel_password"),
                ) {
                    (None, None) => String::new(),
                    // Decoded, then encoded for the URL: a '/' or '@' in them stays theirs.
                    (user, password) => format!(
                        "{}{}@",
                        encode(&decode(user.unwrap_or(""))?),
                        match password {
                            Some(p) => format!(":{}", encode(&decode(p)?)),
                            None => String::new(),
                        }
                    ),
                };
                Ok(Target::Sentinel {
                    sentinels: hosts
                        .iter()
                        .map(|h| format!("{redis_scheme}://{sentinel_login}{h}/"))
                        .collect(),
                    master: decode(master)?,
                    user,
                    password,
                    db,
                })
            }
            "etcd" => {
                parts.allow_query(&["namespace"])?;
                if !parts.path.trim_matches('/').is_empty() {
                    return Err("unexpected path; give a namespace as ?namespace=app/".to_owned());
                }
                let http = if tls { "https" } else { "http" };
                Ok(Target::Etcd {
                    endpoints: hosts.iter().map(|h| format!("{http}://{h}")).collect(),
                    namespace: parts.query("namespace").map(decode).transpose()?,
                    auth: parts.userinfo.map(auth).transpose()?,
                })
            }
            _ => {
                parts.allow_query(&["root"])?;
                let chroot = parts.path.trim_end_matches('/');
                let root = parts.query("root").map(decode).transpose()?;
                if root.as_deref().is_some_and(|r| !r.starts_with('/')) {
                    return Err("?root= is an absolute node path (/lock-core)".to_owned());
                }
                Ok(Target::ZooKeeper {
                    hosts: format!("{}{}", hosts.join(","), decode(chroot)?),
                    root,
                    auth: parts.userinfo.map(auth).transpose()?,
                })
            }
        }
    }
}

/// `text` cut to about `max` bytes (on a character), saying how long it was: an error quotes
/// the URL, which may be huge.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} bytes)", &text[..cut], text.len())
}

/// The pieces of `[userinfo@]h1,h2[/path][?query]`.
struct Parts<'a> {
    userinfo: Option<&'a str>,
    hosts: Vec<&'a str>,
    path: &'a str,
    query: Vec<(&'a str, &'a str)>,
}

impl<'a> Parts<'a> {
    fn split(rest: &'a str) -> Result<Self, String> {
        // The user info first (all before the last '@'): a password is never read as a host,
        // a path or a query.
        let (userinfo, rest) = split_login(rest);
        userinfo.map(check_login).transpose()?;
        if rest.contains('#') {
            return Err("a fragment (#...) has no meaning here".to_owned());
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if hosts.is_empty() {
            return Err("no host".to_owned());
        }
        let hosts: Vec<&str> = hosts.split(',').collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err("an empty host in the list (two commas, or one at an end)".to_owned());
        }
        let mut pairs = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if pairs.iter().any(|(key, _)| *key == k) {
                return Err(format!("?{k}= given twice"));
            }
            pairs.push((k, v));
        }
        Ok(Parts {
            userinfo,
            hosts,
            path,
            query: pairs,
        })
    }

    fn allow_query(&self, allowed: &[&str]) -> Result<(), String> {
        match self.query.iter().find(|(k, _)| !allowed.contains(k)) {
            None => Ok(()),
            Some((k, _)) if allowed.is_empty() => {
                Err(format!("unknown option ?{k}= (this scheme takes none)"))
            }
            Some((k, _)) => Err(format!(
                "unknown option ?{k}= (this scheme takes {})",
                allowed.join(", ")
            )),
        }
    }

    fn query(&self, key: &str) -> Option<&'a str> {
        self.query.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// Checks `host[:port]` (`[v6]:port` too) and gives it back with the port (the default when
/// none).
fn host_port(text: &str, default_port: u16) -> Result<String, String> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("host {text:?}: an IPv6 address needs its closing ']'"))?;
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return Err(format!("host {text:?} is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("host {text:?}: expected ':port' after the address"))?,
            ),
        };
        (format!("[{addr}]"), port)
    } else {
        let (host, port) = match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        };
        if host.is_empty() {
            return Err(format!("host {text:?} has no name"));
        }
        if !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return Err(format!(
                "host {text:?} is not a host name or address (a password with ':', '@' or '/' must be percent-encoded)"
            ));
        }
        (host.to_owned(), port)
    };
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("port {p:?} of {host} is not a port (1-65535)"))?,
    };
    Ok(format!("{host}:{port}"))
}

/// `user:password`, each percent-decoded.
fn split_userinfo(userinfo: &str) -> Result<(String, Option<String>), String> {
    match userinfo.split_once(':') {
        Some((user, password)) => Ok((decode(user)?, Some(decode(password)?))),
        None => Ok((decode(userinfo)?, None)),
    }
}

/// A user and its password, both required (etcd, ZooKeeper).
fn auth(userinfo: &str) -> Result<(String, String), String> {
    match split_userinfo(userinfo)? {
        (user, Some(password)) if !user.is_empty() => Ok((user, password)),
        _ => Err("give both a user and a password (user:password@)".to_owned()),
    }
}

/// Percent-decoding (`%40` is `@`), refusing malformed escapes and what is not UTF-8.
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a '%' not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a percent-escape that is not UTF-8".to_owned())
}

/// The user info of `rest` (what follows `scheme://`) and what follows it: everything before
/// the last `@`, so that a password holding `/`, `?`, `#` or `@` is never taken for a host, a
/// path or a query (and never echoed as one).
fn split_login(rest: &str) -> (Option<&str>, &str) {
    match rest.rsplit_once('@') {
        Some((login, after)) => (Some(login), after),
        None => (None, rest),
    }
}

/// Refuses a user info the URLs built from it would read differently (redis-rs and the other
/// clients stop the user info at the first `/`, `?` or `#`): never echoing it.
fn check_login(login: &str) -> Result<(), String> {
    if login.contains(['/', '?', '#']) {
        return Err("the user or password holds '/', '?' or '#' (or a query value an '@'): percent-encode it (%2F, %3F, %23, %40)".to_owned());
    }
    Ok(())
}

/// `url` with the password of its user info replaced by `***`, and the value of every
/// `*password*=` option too. The user info is all before the last `@` (a password may hold
/// `/`, `?`, `#` or `@` unencoded); a URL without a scheme is masked the same way.
pub(crate) fn mask(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let (login, after) = split_login(rest);
    let masked = match login {
        None => String::new(),
        Some("") => "@".to_owned(),
        Some(login) => match login.split_once(':') {
            Some((user, _)) if !user.contains(['/', '?', '#', '&', '=']) => {
                format!("{user}:***@")
            }
            // A lone word is the user; masked anyway, some put a token there.
            _ => "***@".to_owned(),
        },
    };
    format!("{scheme}{masked}{}", mask_options(after))
}

/// `text` with the value of every option whose name holds `pass` (`sentinel_password=`,
/// redis-rs's `?pass=` of a socket URL) masked to the next `&`, wherever it stands.
fn mask_options(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let name_start = rest[..eq].rfind(['?', '&', '/', '@']).map_or(0, |i| i + 1);
        let value_end = rest[eq..].find('&').map_or(rest.len(), |i| eq + i);
        out.push_str(&rest[..=eq]);
        if rest[name_start..eq].to_ascii_lowercase().contains("pass") {
            out.push_str("***");
        } else {
            out.push_str(&rest[eq + 1..value_end]);
        }
        rest = &rest[value_end..];
    }
    out.push_str(rest);
    out
}

/// Percent-encodes `text` for a URL's user info (all but the unreserved characters).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> Target {
        Target::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    fn err(url: &str) -> String {
        match Target::parse(url) {
            Ok(t) => panic!("{url} parsed as {t:?}"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn one_server_urls_pass_through() {
        for url in [
            "redis://127.0.0.1:6379/",
            "redis://app:s3cret@10.0.0.1:6380/2",
            "rediss://cache.example.com:6380",
            "redis://[::1]:6379/",
            "redis+unix:///run/redis.sock",
            "unix:///run/redis.sock?db=1",
        ] {
            assert_eq!(
                ok(url),
                Target::Redis {
                    url: url.to_owned()
                }
            );
        }
    }

    #[test]
    fn clusters_and_redlock_get_one_url_per_node_with_the_login() {
        assert_eq!(
            ok("redis+cluster://app:pw@h1:7000,h2:7001,10.0.0.3"),
            Target::Cluster {
                nodes: vec![
                    "redis://app:pw@h1:7000/".to_owned(),
                    "redis://app:pw@h2:7001/".to_owned(),
                    "redis://app:pw@10.0.0.3:6379/".to_owned(),
                ]
            }
        );
        assert_eq!(
            ok("rediss+cluster://h1:7000/"),
            Target::Cluster {
                nodes: vec!["rediss://h1:7000/".to_owned()]
            }
        );
        assert_eq!(
            ok("redlock+rediss://a:1,b:2,c:3/4"),
            Target::Redlock {
                servers: vec![
                    "rediss://a:1/4".to_owned(),
                    "rediss://b:2/4".to_owned(),
                    "rediss://c:3/4".to_owned(),
                ]
            }
        );
    }

    #[test]
    fn sentinel_takes_the_primary_name_its_login_and_the_sentinels_login() {
        assert_eq!(
            ok(
                "redis+sentinel://app:p%40ss@s1:26379,s2/mymaster/3?sentinel_user=sen&sentinel_password=x"
            ),
            Target::Sentinel {
                sentinels: vec![
                    "redis://sen:x@s1:26379/".to_owned(),
                    "redis://sen:x@s2:26379/".to_owned(),
                ],
                master: "mymaster".to_owned(),
                user: Some("app".to_owned()),
                password: Some("p@ss".to_owned()),
                db: Some(3),
            }
        );
        assert!(err("redis+sentinel://s1:26379").contains("no primary name"));
        assert!(err("redis+sentinel://s1/m/x").contains("not a number"));
        assert!(err("redis+sentinel://s1/m/1/2").contains("/MASTER/DB"));
    }

    #[test]
    fn consensus_stores_get_endpoints_namespace_root_and_auth() {
        assert_eq!(
            ok("etcd://root:pw@e1,e2:2380?namespace=app/"),
            Target::Etcd {
                endpoints: vec!["http://e1:2379".to_owned(), "http://e2:2380".to_owned()],
                namespace: Some("app/".to_owned()),
                auth: Some(("root".to_owned(), "pw".to_owned())),
            }
        );
        assert_eq!(
            ok("zookeeper://z1:2181,z2/apps/shop?root=/locks"),
            Target::ZooKeeper {
                hosts: "z1:2181,z2:2181/apps/shop".to_owned(),
                root: Some("/locks".to_owned()),
                auth: None,
            }
        );
        assert!(err("etcd://e1/app").contains("?namespace="));
        assert!(err("etcd://user@e1").contains("both a user and a password"));
        assert!(err("zookeeper://z1?root=locks").contains("absolute"));
    }

    #[test]
    fn bad_urls_are_refused_with_a_reason_never_a_panic() {
        let cases = [
            ("", "empty"),
            ("memory:", "inside one process"),
            ("memory://", "inside one process"),
            ("localhost:6379", "no scheme"),
            ("http://h:1", "unknown scheme"),
            ("redis://h1:1,h2:2", "redis+cluster"),
            ("redis://h:99999", "not a port"),
            ("redis://h:0", "not a port"),
            ("redis://", "no host"),
            ("redis+cluster://", "no host"),
            ("redis+cluster://h1,,h2", "empty host"),
            ("redis+cluster://h1/2", "unexpected path"),
            ("redis+cluster://h1?x=1", "unknown option"),
            ("redis+cluster://h1?x=1&x=2", "twice"),
            ("redlock://[::1:6379", "closing"),
            ("redlock://[zz]:1", "not an IPv6"),
            ("redlock://[::1]6379", "':port'"),
            ("redlock://h o:1", "not a host name"),
            ("redlock://h:1#frag", "fragment"),
            ("zookeeper://u:p%zz@z1", "two hex digits"),
            ("unix://", "no socket path"),
            ("redis://h\n:1", "control character"),
        ];
        for (url, why) in cases {
            let e = err(url);
            assert!(e.contains(why), "{url:?}: {e}");
        }
        // Random bytes around the separators: an error or a target, never a panic.
        for url in [
            "redis+sentinel://@/",
            "redis+sentinel://:@h/%",
            "etcd://:@[]",
            "zookeeper://%",
            "redlock://@@@",
            "rediss+cluster://?",
            "redis+sentinel://h/%ff",
            "é://ü",
        ] {
            let _ = Target::parse(url);
        }
    }

    /// Passwords as people type them: with `?`, `/`, `#`, `@` or `:` unencoded, or a URL
    /// without its scheme. Whatever the parser makes of it, no piece of the password is
    /// printed.
    #[test]
    fn passwords_with_url_characters_never_leak_into_errors() {
        for (url, secret) in [
            ("redis://ops:Zq7?Xk9@h:1/", &["Zq7", "Xk9"][..]),
            ("redis://ops:Zq7/Xk9@h:1/", &["Zq7", "Xk9"]),
            ("redis://ops:Zq7#Xk9@h:1/", &["Zq7", "Xk9"]),
            ("redis+cluster://ops:Zq7?Xk9@h:1", &["Zq7", "Xk9"]),
            ("redis+cluster://ops:Zq7/Xk9@h:1", &["Zq7", "Xk9"]),
            ("redlock://ops:Zq7@Xk9@h1,h2,h3:99999", &["Zq7", "Xk9"]),
            ("ops:hunter2@10.0.0.1:6379", &["hunter2"]),
            ("htp://ops:hunter2@h", &["hunter2"]),
            ("etcd://root:Zq7?Xk9@e1:0", &["Zq7", "Xk9"]),
            (
                "redis+sentinel://s1/m?sentinel_user=a@b&sentinel_password=hunter2",
                &["hunter2"],
            ),
            (
                "redis+sentinel://s1/m?sentinel_password=hun/ter&x=1",
                &["hun/ter"],
            ),
            ("unix:///run/redis.sock?pass=hunter2&db=x#", &["hunter2"]),
        ] {
            let message = match Target::parse(url) {
                Err(e) => e.0,
                // Taken: the target itself never shows the password either.
                Ok(t) => format!("{t:?}"),
            };
            for piece in secret {
                assert!(!message.contains(piece), "{url}: {piece} in {message}");
            }
        }
    }

    /// Every short string over the URL's separators (and a few letters, digits and a
    /// non-ASCII one), after each scheme: an error or a target, never a panic; and a huge URL
    /// gives a short error.
    #[test]
    fn no_url_makes_the_parser_panic() {
        let alphabet: Vec<char> = ":/@?#[],%=&a1é".chars().collect();
        let schemes = [
            "",
            "redis://",
            "redis+unix://",
            "redis+cluster://",
            "redis+sentinel://",
            "redlock://",
            "etcd://",
            "zookeeper://",
        ];
        let mut tried = 0;
        for scheme in schemes {
            for n in 0..=4_u32 {
                for mut i in 0..alphabet.len().pow(n) {
                    let mut url = scheme.to_owned();
                    for _ in 0..n {
                        url.push(alphabet[i % alphabet.len()]);
                        i /= alphabet.len();
                    }
                    let _ = Target::parse(&url);
                    let _ = mask(&url);
                    tried += 1;
                }
            }
        }
        assert!(tried > 300_000, "{tried}");
        let huge = format!("redis://u:pw@h:1,{}:1", "h".repeat(1_000_000));
        let e = err(&huge);
        assert!(e.len() < 1_000, "{}", e.len());
        let e = err(&format!("redis://u:pw@h:{}", "9".repeat(1_000_000)));
        assert!(e.len() < 1_000, "{}", e.len());
    }

    #[test]
    fn passwords_are_masked_in_errors_and_debug() {
        let e = err("redis+cluster://app:hunter2@h1:99999");
        assert!(!e.contains("hunter2"), "{e}");
        assert!(e.contains("app:***"), "{e}");
        let e = err("redis+sentinel://h1?sentinel_password=hunter2&sentinel_user=s");
        assert!(!e.contains("hunter2"), "{e}");
        let t = ok("redis://app:hunter2@h1:6379/");
        assert!(!format!("{t:?}").contains("hunter2"));
        assert_eq!(mask("redis://h:1/"), "redis://h:1/");
        assert_eq!(mask("redis://:pw@h:1/"), "redis://:***@h:1/");
        assert_eq!(
            mask("redis://u:p@h:1/?sentinel_password=x"),
            "redis://u:***@h:1/?sentinel_password=***"
        );
    }
}
