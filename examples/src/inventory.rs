//! The inventory: stock per SKU, decremented by a read-modify-write that only a lock makes safe.
//!
//! State under the store's namespace:
//!
//! | key                        | what                                                      |
//! |----------------------------|-----------------------------------------------------------|
//! | `inventory:{sku}:initial`  | the stock the sale started with                           |
//! | `inventory:{sku}:stock`    | the stock left: read, then written back minus the quantity |
//! | `inventory:{sku}:sales`    | the ledger: one appended entry per reservation answered 200 |
//!
//! The ledger is appended atomically, so it counts every sale even when the stock counter loses
//! updates; comparing the two is how the demo proves (or disproves) that nothing was oversold.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

/// The body of `POST /inventory/{sku}/reserve`.
///
/// ```
/// let r: lock_examples::ReserveRequest =
///     serde_json::from_str(r#"{"user":"alice","quantity":1}"#).unwrap();
/// assert_eq!(r.quantity, 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveRequest {
    /// Who buys.
    pub user: String,
    /// How many items (at least 1, at most [`MAX_QUANTITY`]).
    pub quantity: u32,
}

/// The largest quantity one reservation may ask for.
pub const MAX_QUANTITY: u32 = 1000;

/// The 200 answer of `POST /inventory/{sku}/reserve`: the items are yours.
///
/// ```
/// let r = lock_examples::Reservation { sku: "s".into(), user: "u".into(), quantity: 1, stock_left: 9 };
/// assert_eq!(serde_json::to_value(&r).unwrap()["stock_left"], 9);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The SKU.
    pub sku: String,
    /// Who bought.
    pub user: String,
    /// How many items.
    pub quantity: u32,
    /// The stock this reservation left behind.
    pub stock_left: i64,
}

/// The answer of `GET /inventory/{sku}`.
///
/// ```
/// let v = lock_examples::StockView { sku: "s".into(), initial: 10, stock: 0, sold: 12, sales: 12 };
/// assert_eq!(v.oversold(), 2);
/// assert!(!v.consistent());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockView {
    /// The SKU.
    pub sku: String,
    /// The stock the sale started with.
    pub initial: i64,
    /// The stock counter now.
    pub stock: i64,
    /// Items sold, summed over the sales ledger.
    pub sold: u64,
    /// Reservations in the sales ledger.
    pub sales: u64,
}

impl StockView {
    /// Items sold beyond the initial stock (0 when the lock did its job).
    ///
    /// ```
    /// let v = lock_examples::StockView { sku: "s".into(), initial: 10, stock: 0, sold: 10, sales: 10 };
    /// assert_eq!(v.oversold(), 0);
    /// ```
    pub fn oversold(&self) -> u64 {
        self.sold
            .saturating_sub(u64::try_from(self.initial).unwrap_or(0))
    }

    /// Whether the counter and the ledger agree: `initial - stock == sold`, stock not negative.
    ///
    /// ```
    /// let v = lock_examples::StockView { sku: "s".into(), initial: 10, stock: 3, sold: 7, sales: 7 };
    /// assert!(v.consistent());
    /// ```
    pub fn consistent(&self) -> bool {
        self.stock >= 0
            && i128::from(self.initial) - i128::from(self.stock) == i128::from(self.sold)
    }
}

/// Why a reservation was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReserveError {
    /// The stock cannot cover the quantity.
    #[error("SKU {sku:?} is sold out: {available} left, {requested} requested")]
    SoldOut {
        /// The SKU.
        sku: String,
        /// What was asked for.
        requested: u32,
        /// What is left.
        available: i64,
    },
    /// No such SKU.
    #[error("no SKU {0:?} is on sale")]
    UnknownSku(String),
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The inventory service: seeding, the protected read-modify-write, and the state view.
///
/// ```
/// # async fn demo() {
/// use lock_examples::{Inventory, ReserveRequest, Store};
/// let inventory = Inventory::new(Store::memory("shop:"), std::time::Duration::ZERO);
/// inventory.seed("sku-1", 10).await.unwrap();
/// let locker = lock_core::Locker::memory();
/// let request = ReserveRequest { user: "alice".into(), quantity: 3 };
/// let reservation = locker
///     .lock("inventory:sku-1")
///     .run(inventory.reserve("sku-1", &request))
///     .await
///     .unwrap()
///     .unwrap();
/// assert_eq!(reservation.stock_left, 7);
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Clone)]
pub struct Inventory {
    store: Store,
    work: Duration,
}

impl Inventory {
    /// An inventory on `store`. `work` is how long a reservation works between reading the stock
    /// and writing it back (charging a card, say): the window in which an unlocked concurrent
    /// reservation reads the same stock.
    ///
    /// ```
    /// let i = lock_examples::Inventory::new(lock_examples::Store::memory(""), std::time::Duration::from_millis(5));
    /// # drop(i);
    /// ```
    pub fn new(store: Store, work: Duration) -> Inventory {
        Inventory { store, work }
    }

    /// Starts a sale of `stock` items of `sku`, forgetting any earlier sale of it.
    ///
    /// # Errors
    /// [`StoreError`] when the store fails.
    ///
    /// ```
    /// # async fn demo() {
    /// let i = lock_examples::Inventory::new(lock_examples::Store::memory(""), std::time::Duration::ZERO);
    /// i.seed("sku-1", 10).await.unwrap();
    /// assert_eq!(i.view("sku-1").await.unwrap().unwrap().stock, 10);
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn seed(&self, sku: &str, stock: i64) -> Result<(), StoreError> {
        self.store.delete(&sales_key(sku)).await?;
        self.store.set(&stock_key(sku), &stock.to_string()).await?;
        self.store.set(&initial_key(sku), &stock.to_string()).await
    }

    /// Reserves `request.quantity` items of `sku`.
    ///
    /// **Call it only under the lock on the SKU.** It reads the stock, works for a while, then
    /// writes the stock back minus the quantity: two unserialized calls both read the same stock
    /// and both sell it (see the crate docs and `--no-lock`).
    ///
    /// # Errors
    /// [`ReserveError::SoldOut`], [`ReserveError::UnknownSku`], [`ReserveError::Store`].
    ///
    /// ```
    /// # async fn demo() {
    /// use lock_examples::{Inventory, ReserveError, ReserveRequest, Store};
    /// let i = Inventory::new(Store::memory(""), std::time::Duration::ZERO);
    /// i.seed("sku-1", 1).await.unwrap();
    /// let req = ReserveRequest { user: "bob".into(), quantity: 2 };
    /// assert!(matches!(i.reserve("sku-1", &req).await, Err(ReserveError::SoldOut { .. })));
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn reserve(
        &self,
        sku: &str,
        request: &ReserveRequest,
    ) -> Result<Reservation, ReserveError> {
        // Read...
        let stock = self
            .store
            .get_i64(&stock_key(sku))
            .await?
            .ok_or_else(|| ReserveError::UnknownSku(sku.to_owned()))?;
        if stock < i64::from(request.quantity) {
            return Err(ReserveError::SoldOut {
                sku: sku.to_owned(),
                requested: request.quantity,
                available: stock,
            });
        }
        // ...work (the race window an unlocked service loses updates in)...
        if self.work.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(self.work).await;
        }
        // ...write.
        let stock_left = stock - i64::from(request.quantity);
        self.store
            .set(&stock_key(sku), &stock_left.to_string())
            .await?;
        self.store
            .push(
                &sales_key(sku),
                &format!("{}:{}", request.quantity, request.user),
            )
            .await?;
        Ok(Reservation {
            sku: sku.to_owned(),
            user: request.user.clone(),
            quantity: request.quantity,
            stock_left,
        })
    }

    /// The state of `sku`, or `None` when it was never seeded.
    ///
    /// # Errors
    /// [`StoreError`] when the store fails or holds something unreadable.
    ///
    /// ```
    /// # async fn demo() {
    /// let i = lock_examples::Inventory::new(lock_examples::Store::memory(""), std::time::Duration::ZERO);
    /// assert!(i.view("nope").await.unwrap().is_none());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn view(&self, sku: &str) -> Result<Option<StockView>, StoreError> {
        let Some(initial) = self.store.get_i64(&initial_key(sku)).await? else {
            return Ok(None);
        };
        let stock = self.store.get_i64(&stock_key(sku)).await?.unwrap_or(0);
        let ledger = self.store.list(&sales_key(sku)).await?;
        let mut sold = 0u64;
        for entry in &ledger {
            let quantity = entry
                .split_once(':')
                .and_then(|(q, _)| q.parse::<u64>().ok())
                .ok_or_else(|| StoreError::Corrupt {
                    key: sales_key(sku),
                    reason: format!("bad ledger entry {entry:?}"),
                })?;
            sold += quantity;
        }
        Ok(Some(StockView {
            sku: sku.to_owned(),
            initial,
            stock,
            sold,
            sales: ledger.len() as u64,
        }))
    }
}

/// The lock key of a SKU's stock (what `LockLayer` keyed by the `sku` path parameter guards).
///
/// ```
/// assert_eq!(lock_examples::inventory::lock_key("sku-1"), "inventory:sku-1");
/// ```
pub fn lock_key(sku: &str) -> String {
    format!("inventory:{sku}")
}

fn stock_key(sku: &str) -> String {
    format!("inventory:{sku}:stock")
}

fn initial_key(sku: &str) -> String {
    format!("inventory:{sku}:initial")
}

fn sales_key(sku: &str) -> String {
    format!("inventory:{sku}:sales")
}
