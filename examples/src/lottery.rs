//! The lottery: one draw per user per draw, from a pool that is never over-awarded.
//!
//! Retries of one entry (same `Idempotency-Key`) never reach this module: lock-tower's
//! `IdempotencyLayer` on `POST /lottery/{draw}/entries` (see [`routes`](crate::routes)) runs the
//! first and replays its stored response to the others. What stays here is the business rule
//! that no idempotency key can express: a user draws once, whatever key it sends.
//!
//! Two locks, each taken by `#[distributed_lock]` on a method, always in the same order (so
//! they cannot deadlock), each waiting up to 5 s for a concurrent holder:
//! - `lottery:{draw}:user:{user}` around a whole entry: the user's earlier entry is checked and
//!   written under it, so a user never draws twice, even under two keys at once;
//! - `lottery:{draw}:pool` around awarding a prize: the awarded counter is a read-modify-write.
//!
//! State under the store's namespace:
//!
//! | key                                      | what                                          |
//! |------------------------------------------|-----------------------------------------------|
//! | `lottery:{draw}:prizes`                  | the size of the prize pool                    |
//! | `lottery:{draw}:awarded`                 | prizes awarded (read-modify-written)          |
//! | `lottery:{draw}:winners`                 | ledger: `prize:user` per prize awarded        |
//! | `lottery:{draw}:entries`                 | ledger: one user name per draw performed      |
//! | `lottery:{draw}:entry:{user}`            | the user's entry (JSON)                       |

use std::time::Duration;

use lock_core::{LockError, Locker, distributed_lock};
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

/// The chance, in percent, that an entry wins while prizes are left.
pub const WIN_PERCENT: u32 = 50;

/// The body of `POST /lottery/{draw}/entries`.
///
/// ```
/// let r: lock_examples::EntryRequest = serde_json::from_str(r#"{"user":"carol"}"#).unwrap();
/// assert_eq!(r.user, "carol");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryRequest {
    /// Who draws.
    pub user: String,
}

/// One user's draw.
///
/// ```
/// let e = lock_examples::Entry { draw: "d".into(), user: "u".into(), won: true, prize: Some(1) };
/// assert_eq!(serde_json::to_value(&e).unwrap()["prize"], 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The draw.
    pub draw: String,
    /// Who drew.
    pub user: String,
    /// Whether it won a prize.
    pub won: bool,
    /// The prize number (1..=pool size) when it won.
    pub prize: Option<u32>,
}

/// What an entry came to: `POST /lottery/{draw}/entries` answers 201 or 409 from it.
///
/// ```
/// use lock_examples::{Entry, EntryAnswer};
/// let e = Entry { draw: "d".into(), user: "u".into(), won: false, prize: None };
/// assert_eq!(EntryAnswer::Entered(e.clone()).entry(), &e);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", content = "entry", rename_all = "snake_case")]
pub enum EntryAnswer {
    /// The user drew now (HTTP 201).
    Entered(Entry),
    /// The user had already drawn in this draw under another key (HTTP 409).
    AlreadyEntered(Entry),
}

impl EntryAnswer {
    /// The entry the answer is about.
    ///
    /// ```
    /// use lock_examples::{Entry, EntryAnswer};
    /// let e = Entry { draw: "d".into(), user: "u".into(), won: false, prize: None };
    /// assert!(!EntryAnswer::AlreadyEntered(e).entry().won);
    /// ```
    pub fn entry(&self) -> &Entry {
        match self {
            EntryAnswer::Entered(e) | EntryAnswer::AlreadyEntered(e) => e,
        }
    }
}

/// The answer of `GET /lottery/{draw}`.
///
/// ```
/// let v = lock_examples::DrawView { draw: "d".into(), prizes: 2, awarded: 3, winners: vec![], entries: vec![] };
/// assert_eq!(v.over_awarded(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrawView {
    /// The draw.
    pub draw: String,
    /// The size of the prize pool.
    pub prizes: u32,
    /// The awarded counter.
    pub awarded: u32,
    /// The winners ledger, `prize:user`, in award order.
    pub winners: Vec<String>,
    /// The entries ledger: one user name per draw performed.
    pub entries: Vec<String>,
}

impl DrawView {
    /// Prizes handed out beyond the pool, counted in the winners ledger (0 when locked).
    ///
    /// ```
    /// let v = lock_examples::DrawView { draw: "d".into(), prizes: 2, awarded: 2, winners: vec!["1:a".into(), "2:b".into()], entries: vec![] };
    /// assert_eq!(v.over_awarded(), 0);
    /// ```
    pub fn over_awarded(&self) -> u32 {
        let handed_out = u32::try_from(self.winners.len()).unwrap_or(u32::MAX);
        handed_out.max(self.awarded).saturating_sub(self.prizes)
    }
}

/// Why an entry failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LotteryError {
    /// No such draw.
    #[error("no draw {0:?} is open")]
    UnknownDraw(String),
    /// The lock could not be taken, or was lost.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The system's random source failed.
    #[error("no randomness available for the draw: {0}")]
    Entropy(String),
}

/// The lottery service.
///
/// ```
/// # async fn demo() {
/// use lock_examples::{EntryAnswer, Lottery, Store};
/// let lottery = Lottery::new(Store::memory(""), lock_core::Locker::memory(), std::time::Duration::ZERO);
/// lottery.seed("spring", 3).await.unwrap();
/// let first = lottery.enter("spring", "dave").await.unwrap();
/// assert!(matches!(first, EntryAnswer::Entered(_)));
/// let again = lottery.enter("spring", "dave").await.unwrap();
/// assert!(matches!(again, EntryAnswer::AlreadyEntered(e) if &e == first.entry()));
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Clone)]
pub struct Lottery {
    store: Store,
    locker: Locker,
    locking: bool,
    work: Duration,
}

impl Lottery {
    /// A lottery on `store`, locking with `locker`. `work` is how long the read-modify-writes
    /// work between their read and their write.
    ///
    /// ```
    /// let l = lock_examples::Lottery::new(lock_examples::Store::memory(""), lock_core::Locker::memory(), std::time::Duration::ZERO);
    /// # drop(l);
    /// ```
    pub fn new(store: Store, locker: Locker, work: Duration) -> Lottery {
        Lottery {
            store,
            locker,
            locking: true,
            work,
        }
    }

    /// Turns locking off (`--no-lock`, to watch the draw break). On by default.
    ///
    /// ```
    /// let l = lock_examples::Lottery::new(lock_examples::Store::memory(""), lock_core::Locker::memory(), std::time::Duration::ZERO)
    ///     .locking(false);
    /// # drop(l);
    /// ```
    #[must_use]
    pub fn locking(mut self, on: bool) -> Lottery {
        self.locking = on;
        self
    }

    /// Opens `draw` with a pool of `prizes`. Use a new draw name per draw.
    ///
    /// # Errors
    /// [`StoreError`] when the store fails.
    ///
    /// ```
    /// # async fn demo() {
    /// let l = lock_examples::Lottery::new(lock_examples::Store::memory(""), lock_core::Locker::memory(), std::time::Duration::ZERO);
    /// l.seed("d1", 5).await.unwrap();
    /// assert_eq!(l.view("d1").await.unwrap().unwrap().prizes, 5);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn seed(&self, draw: &str, prizes: u32) -> Result<(), StoreError> {
        self.store.delete(&key(draw, "winners")).await?;
        self.store.delete(&key(draw, "entries")).await?;
        self.store.set(&key(draw, "awarded"), "0").await?;
        self.store
            .set(&key(draw, "prizes"), &prizes.to_string())
            .await
    }

    /// Enters `user` in `draw`, once: the first call draws; every later call gets
    /// [`EntryAnswer::AlreadyEntered`] with the first entry. (Replaying the first *answer* to a
    /// retry is the route's `IdempotencyLayer`'s job.)
    ///
    /// # Errors
    /// [`LotteryError::UnknownDraw`], lock errors (a lock still busy after 5 s), store errors.
    ///
    /// ```
    /// # async fn demo() {
    /// let l = lock_examples::Lottery::new(lock_examples::Store::memory(""), lock_core::Locker::memory(), std::time::Duration::ZERO);
    /// assert!(l.enter("closed", "erin").await.is_err());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn enter(&self, draw: &str, user: &str) -> Result<EntryAnswer, LotteryError> {
        if self.locking {
            self.enter_locked(draw, user).await
        } else {
            self.enter_unlocked(draw, user).await
        }
    }

    /// One entry under the user's lock: two entries of one user (even under different keys, on
    /// other processes) take turns here, and the second finds the first's entry.
    #[distributed_lock(key = "lottery:{draw}:user:{user}", locker = self.locker, wait = "5s")]
    async fn enter_locked(&self, draw: &str, user: &str) -> Result<EntryAnswer, LotteryError> {
        self.enter_unlocked(draw, user).await
    }

    /// The entry itself; serialized per (draw, user) by `enter_locked`.
    async fn enter_unlocked(&self, draw: &str, user: &str) -> Result<EntryAnswer, LotteryError> {
        let prizes = self.prizes(draw).await?;
        let entry_key = key(draw, &format!("entry:{user}"));
        match self.store.get_json::<Entry>(&entry_key).await? {
            Some(entry) => Ok(EntryAnswer::AlreadyEntered(entry)),
            None => {
                self.work().await;
                let wins = random_percent()? < WIN_PERCENT;
                let prize = if wins && prizes > 0 {
                    self.award(draw, user).await?
                } else {
                    None
                };
                let entry = Entry {
                    draw: draw.to_owned(),
                    user: user.to_owned(),
                    won: prize.is_some(),
                    prize,
                };
                self.store.set_json(&entry_key, &entry).await?;
                self.store.push(&key(draw, "entries"), user).await?;
                Ok(EntryAnswer::Entered(entry))
            }
        }
    }

    /// Takes the next prize from the pool for `user`, or `None` when it is empty.
    async fn award(&self, draw: &str, user: &str) -> Result<Option<u32>, LotteryError> {
        if self.locking {
            self.award_locked(draw, user).await
        } else {
            self.award_unlocked(draw, user).await
        }
    }

    /// The pool's read-modify-write under the pool's lock (taken inside a user's lock: always
    /// in that order, so the two cannot deadlock).
    #[distributed_lock(key = "lottery:{draw}:pool", locker = self.locker, wait = "5s")]
    async fn award_locked(&self, draw: &str, user: &str) -> Result<Option<u32>, LotteryError> {
        self.award_unlocked(draw, user).await
    }

    async fn award_unlocked(&self, draw: &str, user: &str) -> Result<Option<u32>, LotteryError> {
        let prizes = self.prizes(draw).await?;
        let awarded = self
            .store
            .get_i64(&key(draw, "awarded"))
            .await?
            .unwrap_or(0);
        let awarded = u32::try_from(awarded).unwrap_or(u32::MAX);
        if awarded >= prizes {
            return Ok(None);
        }
        self.work().await;
        let prize = awarded + 1;
        self.store
            .set(&key(draw, "awarded"), &prize.to_string())
            .await?;
        self.store
            .push(&key(draw, "winners"), &format!("{prize}:{user}"))
            .await?;
        Ok(Some(prize))
    }

    async fn prizes(&self, draw: &str) -> Result<u32, LotteryError> {
        let prizes = self
            .store
            .get_i64(&key(draw, "prizes"))
            .await?
            .ok_or_else(|| LotteryError::UnknownDraw(draw.to_owned()))?;
        Ok(u32::try_from(prizes).unwrap_or(0))
    }

    async fn work(&self) {
        if self.work.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(self.work).await;
        }
    }

    /// The state of `draw`, or `None` when it was never opened.
    ///
    /// # Errors
    /// [`StoreError`] when the store fails or holds something unreadable.
    ///
    /// ```
    /// # async fn demo() {
    /// let l = lock_examples::Lottery::new(lock_examples::Store::memory(""), lock_core::Locker::memory(), std::time::Duration::ZERO);
    /// assert!(l.view("never").await.unwrap().is_none());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn view(&self, draw: &str) -> Result<Option<DrawView>, StoreError> {
        let Some(prizes) = self.store.get_i64(&key(draw, "prizes")).await? else {
            return Ok(None);
        };
        let awarded = self
            .store
            .get_i64(&key(draw, "awarded"))
            .await?
            .unwrap_or(0);
        Ok(Some(DrawView {
            draw: draw.to_owned(),
            prizes: u32::try_from(prizes).unwrap_or(0),
            awarded: u32::try_from(awarded).unwrap_or(u32::MAX),
            winners: self.store.list(&key(draw, "winners")).await?,
            entries: self.store.list(&key(draw, "entries")).await?,
        }))
    }
}

fn key(draw: &str, what: &str) -> String {
    format!("lottery:{draw}:{what}")
}

fn random_percent() -> Result<u32, LotteryError> {
    getrandom::u32()
        .map(|n| n % 100)
        .map_err(|e| LotteryError::Entropy(e.to_string()))
}
