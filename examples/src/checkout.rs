//! The checkout: a simulated payment store that charges an order. Charging is not idempotent by
//! itself (every call is a new charge, like a card network's); `POST /checkout` is made
//! idempotent by lock-tower's `IdempotencyLayer` in [`routes`](crate::routes), not here.
//!
//! State under the store's namespace:
//!
//! | key                  | what                                                  |
//! |----------------------|-------------------------------------------------------|
//! | `payments:{order}`   | ledger: one JSON [`Payment`] per charge made           |

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

/// The largest amount one checkout may charge, in cents.
pub const MAX_AMOUNT_CENTS: u64 = 1_000_000;

/// The body of `POST /checkout`.
///
/// ```
/// let r: lock_examples::CheckoutRequest =
///     serde_json::from_str(r#"{"order":"o-1","user":"alice","amount_cents":1999}"#).unwrap();
/// assert_eq!(r.amount_cents, 1999);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckoutRequest {
    /// The order paid for.
    pub order: String,
    /// Who pays.
    pub user: String,
    /// How much, in cents (1 to [`MAX_AMOUNT_CENTS`]).
    pub amount_cents: u64,
}

/// One charge: the 201 answer of `POST /checkout`, and an entry of the payments ledger.
///
/// ```
/// let p = lock_examples::Payment { payment: "pay_1".into(), order: "o".into(), user: "u".into(), amount_cents: 5 };
/// assert_eq!(serde_json::to_value(&p).unwrap()["payment"], "pay_1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The payment's id, random per charge: two charges never share it.
    pub payment: String,
    /// The order.
    pub order: String,
    /// Who paid.
    pub user: String,
    /// How much, in cents.
    pub amount_cents: u64,
}

/// The simulated payment store.
///
/// ```
/// # async fn demo() {
/// use lock_examples::{CheckoutRequest, Payments, Store};
/// let payments = Payments::new(Store::memory(""), std::time::Duration::ZERO);
/// let order = CheckoutRequest { order: "o-1".into(), user: "alice".into(), amount_cents: 1999 };
/// let first = payments.charge(&order).await.unwrap();
/// let second = payments.charge(&order).await.unwrap(); // charging twice charges twice
/// assert_ne!(first.payment, second.payment);
/// assert_eq!(payments.charges("o-1").await.unwrap().len(), 2);
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, Clone)]
pub struct Payments {
    store: Store,
    work: Duration,
}

impl Payments {
    /// A payment store on `store`; each charge takes `work` (the card network's latency).
    ///
    /// ```
    /// let p = lock_examples::Payments::new(lock_examples::Store::memory(""), std::time::Duration::ZERO);
    /// # drop(p);
    /// ```
    pub fn new(store: Store, work: Duration) -> Payments {
        Payments { store, work }
    }

    /// Charges `request` once more: a new [`Payment`] in the order's ledger.
    ///
    /// # Errors
    /// [`StoreError`] when the store fails (nothing was charged then).
    ///
    /// ```
    /// # async fn demo() {
    /// let p = lock_examples::Payments::new(lock_examples::Store::memory(""), std::time::Duration::ZERO);
    /// let req = lock_examples::CheckoutRequest { order: "o".into(), user: "u".into(), amount_cents: 1 };
    /// assert_eq!(p.charge(&req).await.unwrap().order, "o");
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn charge(&self, request: &CheckoutRequest) -> Result<Payment, StoreError> {
        if self.work.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(self.work).await;
        }
        let payment = Payment {
            payment: format!("pay_{:016x}", getrandom::u64().unwrap_or_default()),
            order: request.order.clone(),
            user: request.user.clone(),
            amount_cents: request.amount_cents,
        };
        let entry = serde_json::to_string(&payment).map_err(|e| StoreError::Corrupt {
            key: ledger(&request.order),
            reason: e.to_string(),
        })?;
        self.store.push(&ledger(&request.order), &entry).await?;
        Ok(payment)
    }

    /// Every charge made for `order`, in order (one when checkout is idempotent).
    ///
    /// # Errors
    /// [`StoreError`] when the store fails or holds something unreadable.
    ///
    /// ```
    /// # async fn demo() {
    /// let p = lock_examples::Payments::new(lock_examples::Store::memory(""), std::time::Duration::ZERO);
    /// assert!(p.charges("none").await.unwrap().is_empty());
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
    /// ```
    pub async fn charges(&self, order: &str) -> Result<Vec<Payment>, StoreError> {
        let key = ledger(order);
        self.store
            .list(&key)
            .await?
            .iter()
            .map(|text| {
                serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
                    key: key.clone(),
                    reason: e.to_string(),
                })
            })
            .collect()
    }
}

fn ledger(order: &str) -> String {
    format!("payments:{order}")
}
