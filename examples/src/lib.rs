//! The flash-sale and lottery services, and the demo that proves nothing is oversold.
//!
//! - [`Shop`] is one axum app: `POST /inventory/{sku}/reserve` (the stock decrement is a
//!   read-modify-write on purpose, serialized per SKU by lock-tower's `LockLayer` keyed by the
//!   `sku` path parameter), `POST /lottery/{draw}/entries` (one draw per user and a prize pool
//!   never over-awarded: `#[distributed_lock]` on the [`Lottery`] methods; `Idempotency-Key`
//!   retries replayed by lock-tower's `IdempotencyLayer`), `POST /checkout` (a simulated
//!   payment charged at most once per `Idempotency-Key`, by `IdempotencyLayer`), and
//!   `GET /inventory/{sku}`, `GET /lottery/{draw}`, `GET /payments/{order}`.
//! - State lives in the same backend as the locks: in this process ([`Store::memory`] with
//!   [`lock_core::Locker::memory`]) or in Redis ([`Shop::redis`]).
//! - [`demo::run`] is the `flash-sale` binary's engine: it starts the service (in process, or
//!   several processes sharing Redis), runs the seed scenario over HTTP, reads the state back
//!   and checks the invariants.
//!
//! ```
//! # async fn demo() {
//! use lock_examples::{ReserveRequest, Shop, ShopConfig};
//!
//! let shop = Shop::memory(ShopConfig::default());
//! shop.inventory().seed("sku-1", 10).await.unwrap();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let server = shop.spawn(listener).unwrap();
//!
//! let client = lock_examples::client::ShopClient::new();
//! let buy = ReserveRequest { user: "alice".into(), quantity: 3 };
//! let reply = client.reserve(&server.base_url(), "sku-1", &buy, false).await.unwrap();
//! assert_eq!(reply.status, 200);
//! assert_eq!(client.stock(&server.base_url(), "sku-1").await.unwrap().stock, 7);
//! server.stop().await;
//! # }
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(demo());
//! ```
#![forbid(unsafe_code)]

pub mod app;
pub mod checkout;
pub mod client;
pub mod cluster;
pub mod demo;
pub mod inventory;
pub mod lottery;
pub mod metrics;
pub mod problem;
pub mod routes;
pub mod store;

pub use app::{RunningServer, SetupError, Shop, ShopConfig};
pub use checkout::{CheckoutRequest, Payment, Payments};
pub use inventory::{Inventory, Reservation, ReserveError, ReserveRequest, StockView};
pub use lottery::{DrawView, Entry, EntryAnswer, EntryRequest, Lottery, LotteryError};
pub use store::{Store, StoreError};
