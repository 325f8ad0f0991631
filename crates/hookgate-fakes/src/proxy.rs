//! A TCP proxy that can be cut: every connection dropped, new ones refused, until it is
//! restored. Put in front of PostgreSQL, it makes the database unreachable without stopping a
//! server that other tests share.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// A running proxy; its accept loop ends with the runtime.
#[derive(Debug)]
pub struct Proxy {
    pub address: SocketAddr,
    open: Arc<AtomicBool>,
    /// Bumped on every cut; each proxied connection ends when it changes.
    cuts: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let address = listener.local_addr().expect("bound");
        let open = Arc::new(AtomicBool::new(true));
        let (cuts, _) = tokio::sync::watch::channel(0u64);
        let (accept_open, accept_cuts) = (Arc::clone(&open), cuts.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { continue };
                if !accept_open.load(Ordering::SeqCst) {
                    let _ = inbound.shutdown().await;
                    continue;
                }
                let mut cut = accept_cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {},
                        _ = cut.changed() => {},
                    }
                });
            }
        });
        Proxy { address, open, cuts }
    }

    /// Drops every proxied connection and refuses new ones.
    pub async fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
        // Let the connection tasks see the change and close their sockets.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}
