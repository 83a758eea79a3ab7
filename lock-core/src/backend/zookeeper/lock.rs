//! Acquire, release, renew and wait on ZooKeeper: the contender nodes of a lock, the holder
//! being the one with the lowest sequence.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

use super::session::Session;
use super::{Contender, Shared, ZooKeeperBackend, backend_error, timed_out};
use crate::LockError;
use crate::backend::stamp::{self, Since};
use crate::backend::{Attempt, AttemptOptions, Kept, QueueTicket, Renewal, Renewed};
use crate::key::LockKey;
use crate::token::Token;

/// The most reads one renewal sends in one multi-read.
const MAX_READS: usize = 1000;

/// What `force_unlock` writes in a lock's node (the parent of its contender nodes) with the
/// delete of a holder's node, followed by that node's name: a release sent again after a lost
/// connection that finds its node gone reads there whether an operator removed it (then
/// `LeaseLost`) or its own first delete went through (`Ok`). Only the latest removal of a
/// lock is named; older versions leave the data empty and never read it.
pub(super) const FORCED: &[u8] = b"forced:";

/// A contender node's name: `<kind>-<token>-<sequence>`, the kind `q` for a waiter, `f` for a
/// fair waiter, `t` for a single attempt (deleted before it answers, unless it holds).
pub(super) struct Node<'a> {
    pub(super) name: &'a str,
    /// The sequence ZooKeeper appended, as an unsigned 32-bit count (see [`sequence_of`]).
    sequence: i64,
}

/// The creation order of contender `name`: its sequence, a signed 32-bit counter of the
/// parent's child changes that ZooKeeper writes with its sign (`-2147483648` after
/// `2147483647`), read as the unsigned count it is, so the nodes made after the counter passed
/// 2^31 still sort after those made before it. (Read as signed, they would sort first: a node
/// behind the holder would take itself for the holder.) The unsigned count wraps at 2^32 child
/// changes of one parent, which no contender outlives.
fn sequence_of(name: &str) -> Option<i64> {
    let rest = name.get(2..)?;
    let (token, digits) = rest.split_once('-')?;
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let signed: i64 = digits.parse().ok()?;
    Some(signed.rem_euclid(1 << 32))
}

/// The contender nodes among `children`, in queue order (other children, the record, are
/// left out).
pub(super) fn queue(children: &[String]) -> Vec<Node<'_>> {
    let mut nodes: Vec<Node<'_>> = children
        .iter()
        .filter(|c| is_contender(c))
        .filter_map(|name| {
            Some(Node {
                name,
                sequence: sequence_of(name)?,
            })
        })
        .collect();
    nodes.sort_unstable_by_key(|n| n.sequence);
    nodes
}

/// Whether child `name` of a lock's node is a contender (the record is not).
pub(super) fn is_contender(name: &str) -> bool {
    ["q-", "f-", "t-"].iter().any(|kind| name.starts_with(kind))
}

/// Whether contender node `name` is one of `token`'s.
fn of_token(name: &str, token: &Token) -> bool {
    name.get(2..)
        .and_then(|rest| rest.strip_prefix(token.as_str()))
        .is_some_and(|rest| rest.starts_with('-'))
        && is_contender(name)
}

/// What one look at the queue found for our node.
enum Place {
    /// Ours is first: the lock is ours.
    First,
    /// Another is ahead: the one just ahead (its path), and whether it is the holder.
    Behind(String, bool),
    /// Our node is gone.
    Gone,
}

impl ZooKeeperBackend {
    pub(super) async fn acquire_lock(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: AttemptOptions<'_>,
    ) -> Result<Attempt, LockError> {
        // The whole attempt within two request timeouts: a create looked for after a lost
        // answer, a container made again, and the listing each have their own bound.
        let bound = self.inner.request_timeout * 2;
        match tokio::time::timeout(bound, self.attempt_lock(key, token, lease, options)).await {
            Ok(answer) => answer,
            Err(_) => Err(timed_out("acquire", Some(key.user()))),
        }
    }

    async fn attempt_lock(
        &self,
        key: &LockKey,
        token: &Token,
        lease: Duration,
        options: AttemptOptions<'_>,
    ) -> Result<Attempt, LockError> {
        let session = self.inner.sessions.current().await?;
        // Against the session the node will be made on (a new one may grant less).
        self.check_lease(lease, session.timeout)?;
        let ticket = options.ticket.filter(|t| !t.ttl.is_zero());
        let id = Self::contender_id(key, token);
        let dir = self.lock_path(key);
        // The node's stamp: a single attempt's node holds if it is first (else it goes before
        // the attempt answers); a waiter's queues, and is rewritten once it holds.
        let since = match ticket {
            None => Since::Held(stamp::now_ms()),
            Some(_) => Since::Queued(stamp::now_ms()),
        };
        let data = stamp::value(None, since, lease, options.holder);
        let mut created_now = false;
        for _ in 0..3 {
            let known = self
                .inner
                .contenders
                .lock()
                .get(&id)
                .filter(|c| c.session == session.id)
                .map(|c| (c.path.clone(), c.czxid));
            let (path, czxid) = match known {
                Some(known) => known,
                None => {
                    created_now = true;
                    let made = self
                        .create_node(&session, key, &dir, token, ticket, &data)
                        .await?;
                    if made.1 <= 0 {
                        // No fence to give from it: refused, never passed on as 0.
                        self.delete_in_background(&session, made.0, key.name());
                        return Err(LockError::protocol(
                            "acquire",
                            key.user(),
                            "ZooKeeper answered a create with no transaction id (czxid)",
                        ));
                    }
                    let mut contenders = self.inner.contenders.lock();
                    contenders.insert(
                        id.clone(),
                        Contender {
                            path: made.0.clone(),
                            czxid: made.1,
                            session: session.id,
                            watch: None,
                            ends: None,
                            turn: Arc::default(),
                            written: Some(data.clone()),
                        },
                    );
                    made
                }
            };
            let place = self.place(&session, key, &dir, &path, token).await;
            let (place, alone_since) = match place {
                Ok((place, _, pzxid)) => (place, created_now && pzxid == czxid),
                Err(e) => {
                    if ticket.is_none() && created_now {
                        // A single attempt that cannot tell: its node goes (or the engine's
                        // in-flight release finds it).
                        self.forget_and_delete(&session, &id, key);
                    }
                    return Err(e);
                }
            };
            match place {
                Place::First => {
                    self.hold(&id);
                    // Its session outlives it: a lock not renewed (the watchdog off, or
                    // stopped at `max_hold`) ends at its lease all the same.
                    self.end_at_lease(key, &id, lease);
                    self.stamp_holder(&session, &id, alone_since);
                    return Ok(acquired(czxid, options.fenced));
                }
                Place::Behind(ahead, holder) => {
                    let Some(ticket) = ticket else {
                        // A single attempt leaves nothing behind (before it answers).
                        let forgotten = self.inner.contenders.lock().remove(&id);
                        if let Some(c) = forgotten {
                            let path = c.path.clone();
                            let deleted = self.within(session.client.delete(&path, None)).await;
                            if !matches!(deleted, Some(Ok(()) | Err(zk::Error::NoNode))) {
                                self.delete_in_background(&session, path, key.name());
                            }
                        }
                        return Ok(Attempt::Busy { remaining: None });
                    };
                    self.wait_behind(&session, key, &id, ticket, options.fenced, ahead, holder)
                        .await?;
                    return Ok(Attempt::Busy { remaining: None });
                }
                Place::Gone => {
                    // Deleted behind our back (an operator, an unrenewed end): a waiter
                    // queues again, at the end.
                    self.inner.contenders.lock().remove(&id);
                    if ticket.is_none() {
                        return Ok(Attempt::Busy { remaining: None });
                    }
                }
            }
        }
        Ok(Attempt::Busy { remaining: None })
    }

    /// Creates our contender node for `token` under `dir` (and `dir` when it is missing: a
    /// container goes when its last child does). A create whose answer was lost is looked for
    /// by name before it is sent again. Our path and its czxid.
    async fn create_node(
        &self,
        session: &Session,
        key: &LockKey,
        dir: &str,
        token: &Token,
        ticket: Option<&QueueTicket>,
        data: &[u8],
    ) -> Result<(String, i64), LockError> {
        let kind = match ticket {
            Some(t) if t.strict => 'f',
            Some(_) => 'q',
            None => 't',
        };
        let prefix = format!("{dir}/{kind}-{}-", token.as_str());
        let acls = self.inner.acls();
        let options = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let mut failure = None;
        for _ in 0..3 {
            let made = session.client.create(&prefix, data, &options);
            match tokio::time::timeout(self.inner.request_timeout, made).await {
                Ok(Ok((stat, sequence))) => return Ok((format!("{prefix}{sequence}"), stat.czxid)),
                Ok(Err(zk::Error::NoNode)) => {
                    let container = zk::CreateMode::Container.with_acls(acls);
                    let made = session.client.create(dir, &[], &container);
                    match self.within(made).await {
                        Some(Ok(_) | Err(zk::Error::NodeExists)) => {}
                        Some(Err(e)) => return Err(backend_error("acquire", Some(key.user()), e)),
                        None => return Err(timed_out("acquire", Some(key.user()))),
                    }
                }
                Ok(Err(e @ (zk::Error::ConnectionLoss | zk::Error::Timeout))) => {
                    failure = Some(backend_error("acquire", Some(key.user()), e));
                    if let Some(found) = self.find_node(session, key, dir, token).await? {
                        return Ok(found);
                    }
                }
                Ok(Err(e)) => return Err(backend_error("acquire", Some(key.user()), e)),
                Err(_) => {
                    failure = Some(timed_out("acquire", Some(key.user())));
                    if let Some(found) = self.find_node(session, key, dir, token).await? {
                        return Ok(found);
                    }
                }
            }
        }
        Err(failure.unwrap_or_else(|| timed_out("acquire", Some(key.user()))))
    }

    /// Our node for `token` under `dir`, if one is there: its path and czxid.
    async fn find_node(
        &self,
        session: &Session,
        key: &LockKey,
        dir: &str,
        token: &Token,
    ) -> Result<Option<(String, i64)>, LockError> {
        // Looked for after an answer was lost: the session may be on another member now, which
        // may not have applied a create the first one passed on. It catches up with the leader
        // first (the sync goes out before the listing: a session's requests are served in
        // order).
        let synced = session.client.sync(dir);
        let (synced, children) =
            tokio::join!(self.within(synced), self.children(session, key, dir));
        match synced {
            Some(Ok(()) | Err(zk::Error::NoNode)) => {}
            Some(Err(e)) => return Err(backend_error("acquire", Some(key.user()), e)),
            None => return Err(timed_out("acquire", Some(key.user()))),
        }
        let Some((children, _)) = children? else {
            return Ok(None);
        };
        let Some(name) = queue(&children)
            .into_iter()
            .find(|n| of_token(n.name, token))
            .map(|n| n.name.to_owned())
        else {
            return Ok(None);
        };
        let path = format!("{dir}/{name}");
        let stat = self
            .bounded("acquire", Some(key), session.client.check_stat(&path))
            .await?;
        Ok(stat.map(|s| (path, s.czxid)))
    }

    /// Where our node `path` stands in `dir`'s queue, how many contenders there are, and the
    /// zxid of the last change to `dir`'s children (its `pzxid`: our node's czxid when
    /// nothing came or went since it was made). Another node of our token (a create whose
    /// answer was lost, sent again) is deleted: only one may queue.
    async fn place(
        &self,
        session: &Arc<Session>,
        key: &LockKey,
        dir: &str,
        path: &str,
        token: &Token,
    ) -> Result<(Place, usize, i64), LockError> {
        let Some((children, pzxid)) = self.children(session, key, dir).await? else {
            return Ok((Place::Gone, 0, 0));
        };
        let nodes = queue(&children);
        let ours = path.rsplit('/').next().unwrap_or_default();
        for stray in nodes
            .iter()
            .filter(|n| n.name != ours && of_token(n.name, token))
        {
            self.delete_in_background(session, format!("{dir}/{}", stray.name), key.name());
        }
        let nodes: Vec<&Node<'_>> = nodes
            .iter()
            .filter(|n| n.name == ours || !of_token(n.name, token))
            .collect();
        let Some(at) = nodes.iter().position(|n| n.name == ours) else {
            return Ok((Place::Gone, nodes.len(), pzxid));
        };
        let place = match at {
            0 => Place::First,
            _ => Place::Behind(format!("{dir}/{}", nodes[at - 1].name), at == 1),
        };
        Ok((place, nodes.len(), pzxid))
    }

    /// The children of `dir`, and the zxid of their last change (`pzxid`); `None` when it is
    /// gone.
    async fn children(
        &self,
        session: &Session,
        key: &LockKey,
        dir: &str,
    ) -> Result<Option<(Vec<String>, i64)>, LockError> {
        match self.within(session.client.get_children(dir)).await {
            Some(Ok((children, stat))) => Ok(Some((children, stat.pzxid))),
            Some(Err(zk::Error::NoNode)) => Ok(None),
            Some(Err(e)) => Err(backend_error("acquire", Some(key.user()), e)),
            None => Err(timed_out("acquire", Some(key.user()))),
        }
    }

    /// Our node (known as `id`, on `session`) holds the lock: its stamp is rewritten "held
    /// since now" unless it says so already and the node has been first since it was made
    /// (`alone_since`: nothing came or went in the queue since; a waiter's node then holds
    /// since it queued). In the background, off the acquire's path, with a `setData` on the
    /// data version it was created with: never its czxid (the fence), never a node deleted
    /// meanwhile made again. Until it lands `inspect` shows no age for a waiter's node; a
    /// single attempt's node is stamped "held" when made, and a holder ahead of it that left
    /// between its create and its look at the queue is counted in its age until then.
    fn stamp_holder(&self, session: &Arc<Session>, id: &str, alone_since: bool) {
        let (path, written) = {
            let mut contenders = self.inner.contenders.lock();
            let Some(c) = contenders.get_mut(id) else {
                return;
            };
            let Some(written) = c.written.take() else {
                return;
            };
            (c.path.clone(), written)
        };
        let at = match stamp::queued_at(&written) {
            Some(queued) if alone_since => queued,
            // Held since it was made, and nothing ahead left since: right as written.
            None if alone_since => return,
            _ => stamp::now_ms(),
        };
        restamp_in_background(&self.inner, session, path, &written, at);
    }

    /// Our node is the holder: nothing to watch any more.
    fn hold(&self, id: &str) {
        if let Some(c) = self.inner.contenders.lock().get_mut(id)
            && let Some(watch) = c.watch.take()
        {
            watch.abort();
        }
    }

    /// A single attempt's node (made on `session`) goes: forgotten, and deleted.
    fn forget_and_delete(&self, session: &Arc<Session>, id: &str, key: &LockKey) {
        if let Some(c) = self.inner.contenders.lock().remove(id) {
            self.delete_in_background(session, c.path.clone(), key.name());
        }
    }

    /// Our waiting node watches `ahead` (unless it watches it already). When `ahead` was the
    /// holder, its deletion makes ours the holder: the lock is handed to the waiter, naming
    /// its latest answered attempt (`turn`), with our czxid as the fence. Otherwise, and on
    /// any other end of the watch, the waiter is woken to try again.
    ///
    /// The watch is set on `session`, the one our node was made on and placed with: a
    /// deletion seen by a later session would say nothing of our node, gone with its session
    /// (and handing the lock on would make a second holder). On an ended session the watch
    /// fails, and so does the attempt.
    #[allow(
        clippy::too_many_arguments,
        reason = "one attempt's parts, passed on once"
    )]
    pub(super) async fn wait_behind(
        &self,
        session: &Arc<Session>,
        key: &LockKey,
        id: &str,
        ticket: &QueueTicket,
        fenced: bool,
        ahead: String,
        holder: bool,
    ) -> Result<(), LockError> {
        let (czxid, turn) = {
            let contenders = self.inner.contenders.lock();
            let Some(c) = contenders.get(id) else {
                return Ok(());
            };
            (c.czxid, c.turn.clone())
        };
        turn.store(ticket.generation, Ordering::Release);
        let watched = self
            .bounded(
                "acquire",
                Some(key),
                session.client.check_and_watch_stat(&ahead),
            )
            .await?;
        let (stat, watcher) = watched;
        let shared = Arc::downgrade(&self.inner);
        let (owned_key, owned_id) = (key.clone(), id.to_owned());
        let handover_lease = ticket.handover_lease;
        let name = key.name().to_owned();
        let fence = if fenced {
            u64::try_from(czxid).unwrap_or(0)
        } else {
            0
        };
        let ticket_id = ticket.id.clone();
        let gone_already = stat.is_none();
        let (session, timeout) = (session.clone(), self.inner.request_timeout);
        let task = crate::background::spawn(async move {
            let mut watcher = watcher;
            let deleted = gone_already
                || loop {
                    let event = watcher.changed().await;
                    if event.event_type != zk::EventType::NodeDataChanged {
                        break event.event_type == zk::EventType::NodeDeleted;
                    }
                    // The node ahead rewrote its stamp (it was handed the lock): watched again.
                    let again = session.client.check_and_watch_stat(&ahead);
                    match tokio::time::timeout(timeout, again).await {
                        Ok(Ok((None, _))) => break true,
                        Ok(Ok((Some(_), next))) => watcher = next,
                        _ => break false,
                    }
                };
            let Some(inner) = shared.upgrade() else {
                return;
            };
            let generation = turn.load(Ordering::Acquire);
            if deleted && holder && generation > 0 {
                // Ours holds now: it ends at the hand-over's lease unless renewed, as an
                // acquired lock does (the waiter may never take it, or stop renewing it before
                // its first renewal; the session would keep its node). This task's handle is
                // let go, not aborted: the end's task takes its place.
                if let Some(c) = inner.contenders.lock().get_mut(&owned_id) {
                    drop(c.watch.take());
                }
                let backend = ZooKeeperBackend {
                    inner: inner.clone(),
                };
                backend.end_at_lease(&owned_key, &owned_id, handover_lease);
                let grant = format!("{ticket_id}:{generation}:{fence}");
                inner.listeners.lock().wake(&name, grant.as_bytes());
                // After the waiter was told: held since now.
                backend.stamp_holder(&session, &owned_id, false);
            } else {
                inner.listeners.lock().wake(&name, ticket_id.as_bytes());
            }
        });
        if let Some(c) = self.inner.contenders.lock().get_mut(id) {
            if let Some(old) = c.watch.take() {
                old.abort();
            }
            c.watch = task;
        }
        Ok(())
    }

    pub(super) async fn release_lock(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<bool, LockError> {
        let known = self
            .inner
            .contenders
            .lock()
            .remove(&Self::contender_id(key, token));
        self.delete_ours(key, token, known, "release").await
    }

    /// A waiter gives up: deletes its node (when a release made it the holder meanwhile, this
    /// passes the lock on).
    pub(super) async fn leave(&self, key: &LockKey, token: &Token) -> Result<(), LockError> {
        let known = self
            .inner
            .contenders
            .lock()
            .remove(&Self::contender_id(key, token));
        self.delete_ours(key, token, known, "leave the queue")
            .await
            .map(|_| ())
    }

    /// Deletes our node for `token` (`known`, or looked for by name): whether it was there.
    /// A node of a session that ended went with it. A delete sent again after the connection
    /// dropped that finds no node, on the same live session, went through the first time (only
    /// this backend deletes its nodes while its session lives). A delete without an answer goes
    /// on in the background: the session keeps the node otherwise.
    async fn delete_ours(
        &self,
        key: &LockKey,
        token: &Token,
        known: Option<Contender>,
        operation: &'static str,
    ) -> Result<bool, LockError> {
        let Some(session) = self.inner.sessions.live() else {
            return Ok(false);
        };
        let path = match known {
            Some(c) if c.session == session.id => c.path.clone(),
            // Not known, or known on a session that ended (its node went with it): an attempt
            // on the live session may have made a node whose answer was lost.
            _ => {
                let dir = self.lock_path(key);
                match self.find_node(&session, key, &dir, token).await {
                    Ok(Some((path, _))) => path,
                    Ok(None) => return Ok(false),
                    Err(e) => {
                        // A create whose answer was lost may have made a node, which our
                        // session would keep for good, at the head of the queue.
                        self.find_and_delete_in_background(&session, key, token);
                        return Err(e);
                    }
                }
            }
        };
        let mut resent = false;
        loop {
            let sent = session.client.delete(&path, None);
            match tokio::time::timeout(self.inner.request_timeout, sent).await {
                Ok(Ok(())) => {
                    self.inner.listeners.lock().wake(key.name(), b"released");
                    return Ok(true);
                }
                Ok(Err(zk::Error::NoNode)) => {
                    let mut ours = resent
                        && self
                            .inner
                            .sessions
                            .live()
                            .is_some_and(|s| s.id == session.id);
                    if ours {
                        // Unless an operator removed it: `force_unlock` names the node it
                        // removed in the lock's node.
                        ours = !self.forced(&session, key, &path, operation).await?;
                    }
                    if ours {
                        self.inner.listeners.lock().wake(key.name(), b"released");
                    }
                    return Ok(ours);
                }
                Ok(Err(zk::Error::ConnectionLoss)) if !resent => resent = true,
                Ok(Err(zk::Error::SessionExpired)) => return Ok(false),
                Ok(Err(e)) => {
                    self.delete_in_background(&session, path, key.name());
                    return Err(backend_error(operation, Some(key.user()), e));
                }
                Err(_) => {
                    self.delete_in_background(&session, path, key.name());
                    return Err(timed_out(operation, Some(key.user())));
                }
            }
        }
    }

    /// Whether `force_unlock` removed node `path` (see [`FORCED`]): its parent names it.
    async fn forced(
        &self,
        session: &Session,
        key: &LockKey,
        path: &str,
        operation: &'static str,
    ) -> Result<bool, LockError> {
        let Some((dir, name)) = path.rsplit_once('/') else {
            return Ok(false);
        };
        match self.within(session.client.get_data(dir)).await {
            Some(Ok((data, _))) => Ok(data
                .strip_prefix(FORCED)
                .is_some_and(|n| n == name.as_bytes())),
            // No lock node: nobody named ours (ZooKeeper drops it once empty).
            Some(Err(zk::Error::NoNode)) => Ok(false),
            Some(Err(e)) => Err(backend_error(operation, Some(key.user()), e)),
            None => Err(timed_out(operation, Some(key.user()))),
        }
    }

    /// Looks for our node of `token` on `session` in the background until ZooKeeper answers
    /// (or the session ends, and the node with it), and deletes it: a give-up whose look
    /// failed. Requests of a session are served in order, so an answered look sees every
    /// create sent before it.
    fn find_and_delete_in_background(&self, session: &Arc<Session>, key: &LockKey, token: &Token) {
        let session = session.clone();
        let inner = Arc::downgrade(&self.inner);
        let (key, token) = (key.clone(), token.clone());
        crate::background::spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                tokio::time::sleep(pause).await;
                if session.client.state().is_terminated() {
                    return;
                }
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let backend = ZooKeeperBackend { inner };
                let id = Self::contender_id(&key, &token);
                if backend.inner.contenders.lock().contains_key(&id) {
                    // The token is in use again: its own release deletes its node.
                    return;
                }
                let dir = backend.lock_path(&key);
                match backend.find_node(&session, &key, &dir, &token).await {
                    Ok(Some((path, _))) => {
                        backend.delete_in_background(&session, path, key.name());
                        return;
                    }
                    Ok(None) => return,
                    Err(_) => pause = (pause * 2).min(Duration::from_secs(5)),
                }
            }
        });
    }

    /// Deletes node `path`, made on `session`, in the background until ZooKeeper answers (or
    /// the session ends, and the node with it), then wakes `name`'s listeners. Only on that
    /// session: a node of the same path made by a later one (a token queued again after its
    /// session expired, in a container made again, whose sequence started over) is not this
    /// one. The task, for a test to wait on.
    pub(super) fn delete_in_background(
        &self,
        session: &Arc<Session>,
        path: String,
        name: &str,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let session = session.clone();
        let inner = Arc::downgrade(&self.inner);
        let name = name.to_owned();
        crate::background::spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let Some(shared) = inner.upgrade() else {
                    return;
                };
                let timeout = shared.request_timeout;
                drop(shared);
                let sent = tokio::time::timeout(timeout, session.client.delete(&path, None)).await;
                match sent {
                    Ok(Ok(()) | Err(zk::Error::NoNode)) => {
                        if let Some(shared) = inner.upgrade() {
                            shared.listeners.lock().wake(&name, b"released");
                        }
                        return;
                    }
                    // Its node went with the session. (A session that moved to another member
                    // is still alive: sent again.)
                    Ok(Err(zk::Error::SessionExpired)) => return,
                    _ if session.client.state().is_terminated() => return,
                    _ => {}
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        })
    }

    pub(super) async fn keep_alone(&self, key: &LockKey, token: &Token) -> Result<Kept, LockError> {
        let id = Self::contender_id(key, token);
        let Some(session) = self.inner.sessions.live() else {
            self.inner.contenders.lock().remove(&id);
            return Ok(Kept::NotOurs);
        };
        let known = self
            .inner
            .contenders
            .lock()
            .get(&id)
            .filter(|c| c.session == session.id)
            .map(|c| c.path.clone());
        let Some(path) = known else {
            return Ok(Kept::NotOurs);
        };
        let dir = self.lock_path(key);
        match self.place(&session, key, &dir, &path, token).await? {
            (Place::First, 1, _) => Ok(Kept::Alone),
            (Place::First, ..) => Ok(if self.release_lock(key, token).await? {
                Kept::Released
            } else {
                Kept::NotOurs
            }),
            // Gone, or (impossible while our node lives) behind another: not ours.
            (Place::Gone | Place::Behind(..), ..) => {
                if let Some(c) = self.inner.contenders.lock().remove(&id) {
                    self.delete_in_background(&session, c.path.clone(), key.name());
                }
                Ok(Kept::NotOurs)
            }
        }
    }

    /// One multi-read of every item's node: `Yes` only when it is still the node we created,
    /// of the live session.
    pub(super) async fn renew_locks(&self, items: &[Renewal]) -> Result<Vec<Renewed>, LockError> {
        let Some(session) = self.inner.sessions.live() else {
            // The session ended, and every node of it.
            for item in items {
                self.inner
                    .contenders
                    .lock()
                    .remove(&Self::contender_id(&item.key, &item.token));
            }
            return Ok(vec![Renewed::Lost; items.len()]);
        };
        let mut verdicts = vec![Renewed::Lost; items.len()];
        let known: Vec<Option<(String, i64)>> = items
            .iter()
            .map(|i| {
                self.inner
                    .contenders
                    .lock()
                    .get(&Self::contender_id(&i.key, &i.token))
                    .filter(|c| c.session == session.id)
                    .map(|c| (c.path.clone(), c.czxid))
            })
            .collect();
        let asked: Vec<usize> = (0..items.len()).filter(|i| known[*i].is_some()).collect();
        let mut failure = None;
        for chunk in asked.chunks(MAX_READS) {
            let mut reader = session.client.new_multi_reader();
            for i in chunk {
                let Some((path, _)) = &known[*i] else {
                    continue;
                };
                if let Err(e) = reader.add_get_data(path) {
                    return Err(backend_error("renew", Some(items[*i].key.user()), e));
                }
            }
            // A member answers reads alone, even one cut off from the leader (until its sync
            // limit runs out), while the leader may already have expired the session: the
            // renewal counts only with a sync through the leader, sent before the read (a
            // session's requests are served in order).
            let synced = session.client.sync(&self.inner.root);
            let key = &items[chunk[0]].key;
            let (synced, read) = tokio::join!(
                self.bounded("renew", Some(key), synced),
                self.bounded("renew", Some(key), reader.commit())
            );
            let read = synced.and(read);
            let results = match read {
                Ok(results) if results.len() == chunk.len() => results,
                Ok(_) => {
                    failure = Some(LockError::protocol(
                        "renew",
                        items[chunk[0]].key.user(),
                        "ZooKeeper answered a multi-read with another number of results",
                    ));
                    for i in chunk {
                        verdicts[*i] = Renewed::Unknown;
                    }
                    continue;
                }
                Err(e) => {
                    failure = Some(e);
                    for i in chunk {
                        verdicts[*i] = Renewed::Unknown;
                    }
                    continue;
                }
            };
            for (i, result) in chunk.iter().zip(results) {
                let Some((_, czxid)) = &known[*i] else {
                    continue;
                };
                verdicts[*i] = match result {
                    zk::MultiReadResult::Data { stat, .. }
                        if stat.czxid == *czxid && stat.ephemeral_owner == session.id =>
                    {
                        Renewed::Yes
                    }
                    zk::MultiReadResult::Data { .. } => Renewed::Lost,
                    zk::MultiReadResult::Error {
                        err: zk::Error::NoNode,
                    } => Renewed::Lost,
                    _ => Renewed::Unknown,
                };
            }
        }
        if asked.is_empty() || verdicts.iter().any(|v| *v != Renewed::Unknown) {
            failure = None;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        // A lease the session cannot vouch for is refused for a lock still ours (one that is
        // not is lost, whatever it asks).
        for (item, verdict) in items.iter().zip(&verdicts) {
            if *verdict == Renewed::Yes {
                self.check_lease(item.lease, session.timeout)?;
            }
        }
        let mut unwatched = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let id = Self::contender_id(&item.key, &item.token);
            let mut contenders = self.inner.contenders.lock();
            match verdicts[i] {
                Renewed::Lost => {
                    tracing::debug!(key = %item.key.display(), "lock lost: its ZooKeeper node or session is gone");
                    contenders.remove(&id);
                }
                Renewed::Yes => match contenders.get_mut(&id) {
                    // Renewed (or extended): it ends a lease from now, unless renewed again.
                    Some(c) if known[i].as_ref().is_some_and(|(_, z)| *z == c.czxid) => {
                        if c.ends.is_none() {
                            // Handed over by a release: its end is watched from now on.
                            unwatched.push(i);
                        }
                        c.ends = Some(Instant::now() + item.lease);
                    }
                    // Its end came while the read was out (the entry is gone, its node being
                    // deleted): no "yes" for it.
                    _ => verdicts[i] = Renewed::Unknown,
                },
                Renewed::Unknown => {}
            }
        }
        for i in unwatched {
            let item = &items[i];
            self.end_at_lease(
                &item.key,
                &Self::contender_id(&item.key, &item.token),
                item.lease,
            );
        }
        Ok(verdicts)
    }

    /// Our node (known as `id`) was just acquired: it ends `lease` from now, moved on by each
    /// renewal (its session would keep it for as long as this process lives).
    fn end_at_lease(&self, key: &LockKey, id: &str, lease: Duration) {
        let ends = Instant::now() + lease;
        let mut contenders = self.inner.contenders.lock();
        let Some(c) = contenders.get_mut(id) else {
            return;
        };
        c.ends = Some(ends);
        if let Some(old) = c.watch.take() {
            old.abort();
        }
        let (shared, czxid) = (Arc::downgrade(&self.inner), c.czxid);
        let (key, id) = (key.clone(), id.to_owned());
        c.watch = crate::background::spawn(async move {
            let mut at = ends;
            loop {
                tokio::time::sleep_until(at).await;
                let Some(inner) = shared.upgrade() else {
                    return;
                };
                let (path, made_on) = {
                    let mut contenders = inner.contenders.lock();
                    let Some(c) = contenders.get_mut(&id).filter(|c| c.czxid == czxid) else {
                        return;
                    };
                    match c.ends {
                        Some(ends) if ends > Instant::now() => {
                            at = ends;
                            continue;
                        }
                        Some(_) => {}
                        None => return,
                    }
                    // Out of the entry before it goes: dropping the entry would abort this.
                    drop(c.watch.take());
                    let (path, made_on) = (c.path.clone(), c.session);
                    contenders.remove(&id);
                    (path, made_on)
                };
                tracing::debug!(key = %key.display(), "an unrenewed ZooKeeper lock reached the end of its lease");
                // A node of a session that ended went with it.
                if let Some(session) = inner.sessions.live().filter(|s| s.id == made_on) {
                    ZooKeeperBackend { inner }.delete_in_background(&session, path, key.name());
                }
                return;
            }
        });
    }
}

/// Rewrites node `path`'s stamp (`written`, as created) "held since `at`", on `session` (the
/// one that made it), in the background: a `setData` on data version 0, so a node rewritten
/// already, or deleted (released, forced, its session ended), is left alone, never made again.
fn restamp_in_background(
    inner: &Arc<Shared>,
    session: &Arc<Session>,
    path: String,
    written: &[u8],
    at: u64,
) {
    let Some(held) = stamp::held_since(written, at) else {
        return;
    };
    let (session, timeout) = (session.clone(), inner.request_timeout);
    crate::background::spawn(async move {
        let sent = session.client.set_data(&path, &held, Some(0));
        if !matches!(tokio::time::timeout(timeout, sent).await, Ok(Ok(_))) {
            tracing::debug!("rewriting a new holder's stamp failed; inspect shows no age for it");
        }
    });
}

fn acquired(czxid: i64, fenced: bool) -> Attempt {
    Attempt::Acquired {
        fence: fenced.then(|| u64::try_from(czxid).unwrap_or(0)),
    }
}

#[cfg(test)]
mod order_tests {
    use super::queue;

    fn order(children: &[&str]) -> Vec<String> {
        let children: Vec<String> = children.iter().map(|c| (*c).to_owned()).collect();
        queue(&children).iter().map(|n| n.name.to_owned()).collect()
    }

    #[test]
    fn nodes_keep_creation_order_across_the_sequence_counters_sign() {
        // ZooKeeper's counter after 2147483647 is written -2147483648, then counts up.
        let made = [
            "q-aa-2147483646",
            "f-bb-2147483647",
            "q-cc--2147483648",
            "t-dd--2147483000",
        ];
        let mut shuffled = made;
        shuffled.reverse();
        assert_eq!(order(&shuffled), made);
        assert_eq!(
            order(&["q-aa-0000000010", "q-bb-0000000002", "record"]),
            ["q-bb-0000000002", "q-aa-0000000010"]
        );
        // Not a contender's name: left out rather than misplaced.
        assert!(order(&["q-zz-0000000001", "q--0000000001", "q-aa-x"]).is_empty());
    }
}
