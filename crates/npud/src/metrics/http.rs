//! The metrics listener: HTTP/1.1 on `metrics.listen`, `GET /metrics` in Prometheus' text
//! format (version 0.0.4), 404 for every other path, 405 for another method on `/metrics`.
//!
//! It is small on purpose: at most [`MAX_CONNECTIONS`] connections at once (more are closed
//! as they arrive), a request's headers must arrive within [`HEADER_TIMEOUT`], request bodies
//! are never read, and a connection is closed after [`CONNECTION_LIFETIME`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::Exporter;

/// Connections served at once; Prometheus uses one per target.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a request's headers may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
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

/// Serves `listener` until `stop`; connections still open then are closed with the runtime.
pub async fn serve(listener: TcpListener, exporter: Arc<Exporter>, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics listener: {MAX_CONNECTIONS} connections open; closed a new one");
            continue;
        };
        let exporter = exporter.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let r = answer(&exporter, &req);
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let conn = tokio::time::timeout(CONNECTION_LIFETIME, conn);
            tokio::select! {
                () = stop.cancelled() => {}
                r = conn => if let Ok(Err(e)) = r {
                    tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
                },
            }
            drop(slot);
        });
    }
}
