//! The metrics listener: HTTP/1.1 on `metrics.listen`, `GET /metrics` in Prometheus' text
//! format (version 0.0.4), 404 for every other path, 405 for another method on `/metrics`.
//!
//! It is small on purpose, and a scraper gets through however many connections others hold:
//! at most [`MAX_CONNECTIONS`] connections at once and [`MAX_PER_ADDRESS`] from one address;
//! a new connection past either limit closes the connection (of that address, or of any) that
//! has gone longest without a request, so connections that say nothing cannot keep a scraper
//! out. A request's headers must arrive within [`HEADER_TIMEOUT`], request bodies are never
//! read, and a connection is closed after [`CONNECTION_LIFETIME`].

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Exporter;

/// Connections served at once; Prometheus uses one per target.
pub const MAX_CONNECTIONS: usize = 16;
/// Connections served at once from one address.
pub const MAX_PER_ADDRESS: usize = 4;
/// How long a request's headers may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a connection lives at most (Prometheus opens a new one when it is closed).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);

/// The content type of the text format served.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

fn answer(exporter: &Exporter, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, body: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: GET /metrics\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut r = Response::new(Full::new(Bytes::from(exporter.render())));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE),
    );
    r
}

/// One open connection.
#[derive(Debug)]
struct Open {
    id: u64,
    ip: IpAddr,
    /// When it was accepted or last answered a request.
    active: Instant,
    close: CancellationToken,
}

/// The open connections, and who goes when a new one needs room.
#[derive(Debug, Default)]
struct Table {
    open: Vec<Open>,
    next: u64,
}

impl Table {
    /// Makes room for a connection from `ip` (closing the one longest without a request: of
    /// `ip` past [`MAX_PER_ADDRESS`], else of any past [`MAX_CONNECTIONS`]) and adds it.
    fn admit(&mut self, ip: IpAddr, now: Instant) -> (u64, CancellationToken) {
        let evict = |open: &mut Vec<Open>, mine: bool| {
            if let Some(i) = open
                .iter()
                .enumerate()
                .filter(|(_, o)| !mine || o.ip == ip)
                .min_by_key(|(_, o)| o.active)
                .map(|(i, _)| i)
            {
                let o = open.swap_remove(i);
                tracing::debug!(peer = %o.ip, "metrics listener: closed the connection longest without a request to make room");
                o.close.cancel();
            }
        };
        if self.open.iter().filter(|o| o.ip == ip).count() >= MAX_PER_ADDRESS {
            evict(&mut self.open, true);
        }
        if self.open.len() >= MAX_CONNECTIONS {
            evict(&mut self.open, false);
        }
        self.next += 1;
        let close = CancellationToken::new();
        self.open.push(Open {
            id: self.next,
            ip,
            active: now,
            close: close.clone(),
        });
        (self.next, close)
    }

    fn answered(&mut self, id: u64, now: Instant) {
        if let Some(o) = self.open.iter_mut().find(|o| o.id == id) {
            o.active = now;
        }
    }

    fn closed(&mut self, id: u64) {
        self.open.retain(|o| o.id != id);
    }
}

fn lock(t: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    // Each update is one vector operation; a panic cannot leave it half done.
    t.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves `listener` until `stop`; connections still open then are closed with the runtime.
pub async fn serve(listener: TcpListener, exporter: Arc<Exporter>, stop: CancellationToken) {
    let table = Arc::new(Mutex::new(Table::default()));
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of fds, or a connection reset before it was accepted: try again shortly.
                tracing::debug!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (id, close) = lock(&table).admit(peer.ip().to_canonical(), Instant::now());
        let exporter = exporter.clone();
        let stop = stop.clone();
        let table = table.clone();
        tokio::spawn(async move {
            let answered = table.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let r = answer(&exporter, &req);
                lock(&answered).answered(id, Instant::now());
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let conn = tokio::time::timeout(CONNECTION_LIFETIME, conn);
            tokio::select! {
                () = stop.cancelled() => {}
                () = close.cancelled() => {}
                r = conn => if let Ok(Err(e)) = r {
                    tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
                },
            }
            lock(&table).closed(id);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_made_by_closing_the_connection_longest_without_a_request() {
        let mut t = Table::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let mut closes = Vec::new();
        for i in 0..MAX_PER_ADDRESS as u64 {
            closes.push(t.admit(a, at(i)).1);
        }
        t.answered(1, at(100));
        // Past the per-address cap: the oldest of that address without a request goes.
        t.admit(a, at(200));
        assert!(!closes[0].is_cancelled() && closes[1].is_cancelled());
        let mut others = Vec::new();
        for i in 0..MAX_CONNECTIONS as u64 {
            let ip = IpAddr::from([10, 0, 0, u8::try_from(i).unwrap()]);
            others.push(t.admit(ip, at(300 + i)).1);
        }
        assert_eq!(t.open.len(), MAX_CONNECTIONS);
        assert!(closes[2].is_cancelled() && closes[3].is_cancelled());
        let last = t.next;
        t.closed(last);
        assert_eq!(t.open.len(), MAX_CONNECTIONS - 1);
    }
}
