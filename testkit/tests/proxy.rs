//! The proxy itself, in front of an echo server: it forwards, a cut drops every connection
//! and the ones that follow until the restore, a blackhole holds traffic back and the restore
//! delivers it, and a freeze holds back the answer to one request.

#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "a test file: its helpers outside #[test] functions assert by panicking"
)]

use std::net::SocketAddr;
use std::time::Duration;

use lock_testkit::proxy::Proxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long "nothing arrives" is watched for.
const SILENCE: Duration = Duration::from_millis(300);

/// An echo server: every byte sent comes back.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn round_trip(conn: &mut TcpStream, message: &[u8]) -> Vec<u8> {
    conn.write_all(message).await.unwrap();
    let mut buf = vec![0u8; message.len()];
    tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut buf))
        .await
        .expect("the echo within 5 s")
        .unwrap();
    buf
}

/// Whether the connection is closed (EOF or reset) within a few seconds.
async fn is_closed(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Whether nothing arrives on the connection for a while (and it stays open).
async fn is_silent(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    tokio::time::timeout(SILENCE, conn.read(&mut buf))
        .await
        .is_err()
}

#[tokio::test]
async fn a_cut_drops_every_connection_until_the_restore() {
    let proxy = Proxy::start(echo_server().await).await;
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut a, b"a").await, b"a");
    assert_eq!(round_trip(&mut b, b"b").await, b"b");
    assert_eq!(proxy.accepted(), 2);

    proxy.cut();
    assert!(is_closed(&mut a).await);
    assert!(is_closed(&mut b).await);
    // A new connection while cut is dropped at once.
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(is_closed(&mut c).await);

    proxy.restore();
    let mut d = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut d, b"again").await, b"again");
    assert_eq!(proxy.accepted(), 4);
}

/// A cut followed at once by a restore still drops the connections open before it.
#[tokio::test]
async fn a_cut_then_an_immediate_restore_still_drops_the_old_connections() {
    let proxy = Proxy::start(echo_server().await).await;
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut a, b"a").await, b"a");
    proxy.cut();
    proxy.restore();
    assert!(is_closed(&mut a).await);
}

#[tokio::test]
async fn a_blackhole_holds_traffic_back_and_the_restore_delivers_it() {
    let proxy = Proxy::start(echo_server().await).await;
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut a, b"a").await, b"a");

    proxy.blackhole();
    a.write_all(b"held").await.unwrap();
    assert!(
        is_silent(&mut a).await,
        "nothing passes, the connection stays open"
    );
    // A new connection is accepted but reaches nothing.
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    b.write_all(b"late").await.unwrap();
    assert!(is_silent(&mut b).await);

    proxy.restore();
    let mut buf = [0u8; 4];
    a.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"held");
    b.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"late");
}

#[tokio::test]
async fn a_freeze_holds_back_the_answer_to_one_request() {
    let proxy = Proxy::start(echo_server().await).await;
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.freeze_after(b"lock/order:42");
    assert_eq!(round_trip(&mut a, b"other").await, b"other");
    assert_eq!(proxy.frozen(), 0);

    a.write_all(b"put lock/order:42").await.unwrap();
    assert!(is_silent(&mut a).await, "the answer is held back");
    assert_eq!(proxy.frozen(), 1);
    // Other connections go on, and the freeze was spent.
    assert_eq!(round_trip(&mut b, b"lock/order:42").await, b"lock/order:42");
    assert_eq!(proxy.frozen(), 1);
    // A restore does not thaw it; a cut drops it.
    proxy.restore();
    assert!(is_silent(&mut a).await);
    proxy.cut();
    assert!(is_closed(&mut a).await);
}

#[tokio::test]
async fn it_counts_the_bytes_it_forwards_each_way() {
    let proxy = Proxy::start(echo_server().await).await;
    assert_eq!(proxy.forwarded(), (0, 0));
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut a, b"hello").await, b"hello");
    assert_eq!(round_trip(&mut b, b"abc").await, b"abc");
    // The echo came back through the proxy: both directions are counted, over both
    // connections.
    assert_eq!(proxy.forwarded(), (8, 8));
}
