//! [`ShopClient`]: the demo's HTTP client (hyper-util's pooled client, HTTP/1, no TLS).

use std::time::{Duration, Instant};

use axum::http::{Method, Request, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::checkout::{CheckoutRequest, Payment};
use crate::inventory::{ReserveRequest, StockView};
use crate::lottery::{DrawView, EntryRequest};
use crate::problem::Problem;
use crate::routes::IDEMPOTENCY_KEY;

/// How long one request may take before the client gives up on it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A request that got no HTTP answer, or an answer that could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting or talking to the server failed.
    #[error("HTTP request to {url} failed: {source}")]
    Http {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// Reading the body failed.
    #[error("reading the answer of {url} failed: {source}")]
    Body {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: hyper::Error,
    },
    /// No answer within [`REQUEST_TIMEOUT`].
    #[error("no answer from {url} within {REQUEST_TIMEOUT:?}")]
    Timeout {
        /// The URL.
        url: String,
    },
    /// The request could not be built (a bad base URL).
    #[error("cannot build a request to {url}: {reason}")]
    Request {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The answer was not what the endpoint documents.
    #[error("unexpected answer from {url}: {status} {body}")]
    Unexpected {
        /// The URL.
        url: String,
        /// The status.
        status: StatusCode,
        /// The body (shortened).
        body: String,
    },
}

/// One HTTP answer, with how long it took.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The body bytes.
    pub body: Bytes,
    /// From sending the request to having read the whole body.
    pub latency: Duration,
    /// Whether the answer carried `Idempotent-Replayed: true` (a stored answer, replayed by
    /// lock-tower's `IdempotencyLayer`: the handler did not run).
    pub replayed: bool,
}

impl Reply {
    /// The problem+json body, when the body is one.
    ///
    /// ```
    /// use lock_examples::client::Reply;
    /// let r = Reply {
    ///     status: axum::http::StatusCode::CONFLICT,
    ///     body: br#"{"type":"t","title":"T","status":409}"#.to_vec().into(),
    ///     latency: Default::default(),
    ///     replayed: false,
    /// };
    /// assert!(r.problem().unwrap().is("t"));
    /// ```
    pub fn problem(&self) -> Option<Problem> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The body as JSON of type `T`, when it is one.
    ///
    /// ```
    /// use lock_examples::client::Reply;
    /// let r = Reply { status: axum::http::StatusCode::OK, body: b"42".to_vec().into(), latency: Default::default(), replayed: false };
    /// assert_eq!(r.json::<u32>(), Some(42));
    /// ```
    pub fn json<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// A client of the shop's HTTP API, pooling keep-alive connections per server.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_examples::client::ClientError> {
/// use lock_examples::{ReserveRequest, client::ShopClient};
/// let client = ShopClient::new();
/// let reply = client
///     .reserve("http://127.0.0.1:3000", "sku-1", &ReserveRequest { user: "alice".into(), quantity: 1 }, false)
///     .await?;
/// println!("{} in {:?}", reply.status, reply.latency);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ShopClient {
    http: Client<HttpConnector, Full<Bytes>>,
}

impl Default for ShopClient {
    fn default() -> Self {
        ShopClient::new()
    }
}

impl ShopClient {
    /// A client with a connection pool.
    ///
    /// ```
    /// let client = lock_examples::client::ShopClient::new();
    /// # drop(client);
    /// ```
    pub fn new() -> ShopClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        ShopClient {
            http: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
        }
    }

    /// `POST {base}/inventory/{sku}/reserve`; with `no_wait`, sends `Prefer: wait=0`.
    ///
    /// # Errors
    /// [`ClientError`] when no HTTP answer came back; every HTTP answer is a `Reply`.
    ///
    /// ```no_run
    /// # async fn demo(client: lock_examples::client::ShopClient) {
    /// let r = client.reserve("http://127.0.0.1:3000", "sku-1",
    ///     &lock_examples::ReserveRequest { user: "u".into(), quantity: 1 }, true).await;
    /// # drop(r);
    /// # }
    /// ```
    pub async fn reserve(
        &self,
        base: &str,
        sku: &str,
        request: &ReserveRequest,
        no_wait: bool,
    ) -> Result<Reply, ClientError> {
        let url = format!("{base}/inventory/{sku}/reserve");
        let headers: &[(&str, &str)] = if no_wait {
            &[("prefer", "wait=0")]
        } else {
            &[]
        };
        self.send(Method::POST, &url, headers, Some(request)).await
    }

    /// `POST {base}/lottery/{draw}/entries` with `Idempotency-Key: {key}`.
    ///
    /// # Errors
    /// [`ClientError`] when no HTTP answer came back.
    ///
    /// ```no_run
    /// # async fn demo(client: lock_examples::client::ShopClient) {
    /// let r = client.enter("http://127.0.0.1:3000", "spring", "carol", "key-1").await;
    /// # drop(r);
    /// # }
    /// ```
    pub async fn enter(
        &self,
        base: &str,
        draw: &str,
        user: &str,
        key: &str,
    ) -> Result<Reply, ClientError> {
        let url = format!("{base}/lottery/{draw}/entries");
        let body = EntryRequest {
            user: user.to_owned(),
        };
        self.send(Method::POST, &url, &[(IDEMPOTENCY_KEY, key)], Some(&body))
            .await
    }

    /// `POST {base}/checkout` with `Idempotency-Key: {key}`.
    ///
    /// # Errors
    /// [`ClientError`] when no HTTP answer came back.
    ///
    /// ```no_run
    /// # async fn demo(client: lock_examples::client::ShopClient) {
    /// let order = lock_examples::CheckoutRequest { order: "o-1".into(), user: "u".into(), amount_cents: 1999 };
    /// let r = client.checkout("http://127.0.0.1:3000", "key-1", &order).await;
    /// # drop(r);
    /// # }
    /// ```
    pub async fn checkout(
        &self,
        base: &str,
        key: &str,
        request: &CheckoutRequest,
    ) -> Result<Reply, ClientError> {
        let url = format!("{base}/checkout");
        self.send(Method::POST, &url, &[(IDEMPOTENCY_KEY, key)], Some(request))
            .await
    }

    /// `GET {base}/payments/{order}`: every charge made for the order.
    ///
    /// # Errors
    /// [`ClientError`], also when the answer is not a 200 with a list of [`Payment`]s.
    ///
    /// ```no_run
    /// # async fn demo(client: lock_examples::client::ShopClient) {
    /// let charges = client.payments("http://127.0.0.1:3000", "o-1").await.unwrap();
    /// assert!(charges.len() <= 1);
    /// # }
    /// ```
    pub async fn payments(&self, base: &str, order: &str) -> Result<Vec<Payment>, ClientError> {
        self.get_json(&format!("{base}/payments/{order}")).await
    }

    /// `GET {base}/metrics`: the service's metrics in Prometheus text.
    ///
    /// # Errors
    /// [`ClientError`], also when the answer is not a 200.
    ///
    /// ```no_run
    /// # async fn demo(client: lock_examples::client::ShopClient) {
    /// let text = client.metrics("http://127.0.0.1:3000").await.unwrap();
    /// assert!(text.contains("lock_acquire_duration_seconds"));
    /// # }
    /// ```
    pub async fn metrics(&self, base: &str) -> Result<String, ClientError> {
        let url = format!("{base}/metrics");
        let reply = self.send::<()>(Method::GET, &url, &[], None).await?;
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        if reply.status == StatusCode::OK {
            Ok(text)
        } else {
            Err(ClientError::Unexpected {
                url,
                status: reply.status,
                body: text.chars().take(200).collect(),
            })
        }
    }

    /// `GET {base}/inventory/{sku}`.
    ///
    /// # Errors
    /// [`ClientError`], also when the answer is not a 200 with a [`StockView`].
    ///
    /// ```no_run
    /// # async fn demo(client: lock_examples::client::ShopClient) {
    /// let view = client.stock("http://127.0.0.1:3000", "sku-1").await.unwrap();
    /// assert!(view.stock >= 0);
    /// # }
    /// ```
    pub async fn stock(&self, base: &str, sku: &str) -> Result<StockView, ClientError> {
        self.get_json(&format!("{base}/inventory/{sku}")).await
    }

    /// `GET {base}/lottery/{draw}`.
    ///
    /// # Errors
    /// [`ClientError`], also when the answer is not a 200 with a [`DrawView`].
    ///
    /// ```no_run
    /// # async fn demo(client: lock_examples::client::ShopClient) {
    /// let view = client.draw("http://127.0.0.1:3000", "spring").await.unwrap();
    /// assert!(view.awarded <= view.prizes);
    /// # }
    /// ```
    pub async fn draw(&self, base: &str, draw: &str) -> Result<DrawView, ClientError> {
        self.get_json(&format!("{base}/lottery/{draw}")).await
    }

    async fn get_json<T: DeserializeOwned>(&self, url: &str) -> Result<T, ClientError> {
        let reply = self.send::<()>(Method::GET, url, &[], None).await?;
        match reply.json() {
            Some(value) if reply.status == StatusCode::OK => Ok(value),
            _ => Err(ClientError::Unexpected {
                url: url.to_owned(),
                status: reply.status,
                body: String::from_utf8_lossy(&reply.body)
                    .chars()
                    .take(200)
                    .collect(),
            }),
        }
    }

    async fn send<B: Serialize>(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&B>,
    ) -> Result<Reply, ClientError> {
        let bad = |reason: String| ClientError::Request {
            url: url.to_owned(),
            reason,
        };
        let mut builder = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let payload = match body {
            Some(body) => {
                builder = builder.header(header::CONTENT_TYPE, "application/json");
                serde_json::to_vec(body).map_err(|e| bad(e.to_string()))?
            }
            None => Vec::new(),
        };
        let request = builder
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| bad(e.to_string()))?;
        let started = Instant::now();
        let exchange = async {
            let response =
                self.http
                    .request(request)
                    .await
                    .map_err(|source| ClientError::Http {
                        url: url.to_owned(),
                        source,
                    })?;
            let status = response.status();
            let replayed = response
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|source| ClientError::Body {
                    url: url.to_owned(),
                    source,
                })?
                .to_bytes();
            Ok(Reply {
                status,
                body,
                latency: started.elapsed(),
                replayed,
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                url: url.to_owned(),
            })?
    }
}
