//! What gRPC clients can hold on the server: connections, and the request bytes of calls in
//! flight.
//!
//! tonic bounds a message (4 MiB) and, as configured here, the calls of one connection
//! ([`MAX_CONCURRENT_STREAMS`](crate::MAX_CONCURRENT_STREAMS)), but neither the connections
//! nor how long a call may take to send its request: a client could open connections until
//! the process ran out of file descriptors (and with them its HTTP listener and its rule-file
//! reloads), or start calls that announce a 4 MiB message and never finish it, each holding
//! what it sent. Here:
//!
//! - at most [`MAX_GRPC_CONNECTIONS`] connections are served; a connection beyond them is
//!   closed as soon as it is accepted, and one that has not sent HTTP/2's 24-byte preface
//!   within [`PREFACE_TIMEOUT`] is closed; a peer that stops answering HTTP/2 pings (sent after
//!   30 s without traffic, 20 s to answer) or TCP keepalive probes is closed too, so a crashed
//!   or partitioned client gives its place back;
//! - a call must send its whole request within [`REQUEST_READ_TIMEOUT`] of its headers, or it
//!   is answered `DEADLINE_EXCEEDED`;
//! - the request bytes of all calls still being received hold at most
//!   [`MAX_PENDING_REQUEST_BYTES`]; a call whose next bytes would exceed it is answered
//!   `RESOURCE_EXHAUSTED`, so the bound holds whatever the number of connections and calls.
//!
//! An Envoy request is a few hundred bytes sent at once, far from every bound. Below these
//! bounds HTTP/2 flow control adds at most hyper's connection window (1 MiB) per connection of
//! data received but not yet read.
//!
//! What these bounds do not prevent: a client that keeps 4,096 connections alive (answering
//! pings) takes every place, and one that keeps 64 MiB of requests in flight has other calls
//! answered `RESOURCE_EXHAUSTED` meanwhile. Both refuse service rather than exhaust the
//! process; a per-client share of the bounds would narrow them further.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};
use tokio_stream::{Stream, StreamExt as _};
use tonic::{
    Status,
    transport::server::{Connected, TcpConnectInfo, TcpIncoming},
};

/// The most gRPC connections served at once: 4,096. Further connections are closed as soon as
/// they are accepted. The process's open-file limit should leave room for them, the HTTP
/// listener's [`MAX_HTTP_CONNECTIONS`](crate::MAX_HTTP_CONNECTIONS), the backend's connections
/// and the rule files (6,000 descriptors is enough).
pub const MAX_GRPC_CONNECTIONS: usize = 4_096;

/// How long a gRPC call may take to send its whole request, from its headers: 10 s. A call
/// still sending then is answered `DEADLINE_EXCEEDED`.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a new gRPC connection may take to send HTTP/2's 24-byte preface: 10 s (then it is
/// closed).
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// The length of HTTP/2's client connection preface (RFC 9113, section 3.4).
const PREFACE_LEN: usize = 24;

/// Idle time before TCP keepalive probes start on a gRPC connection: 60 s.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// The interval of the server's HTTP/2 pings on a connection without traffic, and how long the
/// peer has to answer one before the connection is closed.
pub(crate) const HTTP2_KEEPALIVE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(20));

/// The most request bytes that calls still being received may hold together: 64 MiB. A call
/// whose next bytes would go beyond is answered `RESOURCE_EXHAUSTED`.
pub const MAX_PENDING_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// The accepted connections of `listener`, with `TCP_NODELAY`, at most
/// [`MAX_GRPC_CONNECTIONS`] at once.
pub(crate) fn incoming(listener: TcpListener) -> impl Stream<Item = io::Result<Admitted>> {
    let permits = Arc::new(Semaphore::new(MAX_GRPC_CONNECTIONS));
    // TCP_NODELAY: a small response must not wait for the peer's delayed ACK (tonic sets it
    // only for the listeners it binds itself; measured: ~0.3 % of calls stalled 40 ms).
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true)).with_keepalive(Some(TCP_KEEPALIVE));
    incoming.filter_map(move |accepted| match accepted {
        Ok(stream) => match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => Some(Ok(Admitted {
                stream,
                preface: Some(Box::pin(tokio::time::sleep(PREFACE_TIMEOUT))),
                received: 0,
                _permit: permit,
            })),
            // At the bound: closed at once (dropped).
            Err(_) => None,
        },
        Err(error) => Some(Err(error)),
    })
}

/// An accepted connection, holding its place among the [`MAX_GRPC_CONNECTIONS`] until it is
/// closed; its reads fail with `TimedOut` if the preface has not arrived by [`PREFACE_TIMEOUT`].
pub(crate) struct Admitted {
    stream: TcpStream,
    /// Until the preface's bytes have arrived.
    preface: Option<Pin<Box<Sleep>>>,
    received: usize,
    _permit: OwnedSemaphorePermit,
}

impl Connected for Admitted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(preface) = this.preface.as_mut() else { return read };
        match read {
            Poll::Ready(Ok(())) => {
                this.received += buf.filled().len() - before;
                if this.received >= PREFACE_LEN {
                    this.preface = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                ready!(preface.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no HTTP/2 preface within 10 s")))
            }
        }
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The layer that bounds every call's request: [`REQUEST_READ_TIMEOUT`] and its share of
/// [`MAX_PENDING_REQUEST_BYTES`]. One per server: its calls share the byte budget.
#[derive(Clone)]
pub(crate) struct RequestBounds {
    budget: Arc<Semaphore>,
}

impl RequestBounds {
    pub(crate) fn new() -> Self {
        Self { budget: Arc::new(Semaphore::new(MAX_PENDING_REQUEST_BYTES)) }
    }
}

impl<S> tower_layer::Layer<S> for RequestBounds {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Bounded<S> {
        Bounded { inner, budget: Arc::clone(&self.budget) }
    }
}

/// The service of [`RequestBounds`]: the inner service, called with the request's body bounded.
#[derive(Clone)]
pub(crate) struct Bounded<S> {
    inner: S,
    budget: Arc<Semaphore>,
}

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for Bounded<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let budget = Arc::clone(&self.budget);
        self.inner.call(request.map(|inner| {
            tonic::body::Body::new(BoundedBody {
                inner,
                deadline: Some(tokio::time::sleep(REQUEST_READ_TIMEOUT)),
                budget,
                held: None,
            })
        }))
    }
}

pin_project! {
    /// A request body that fails with `DEADLINE_EXCEEDED` once [`REQUEST_READ_TIMEOUT`] has
    /// passed before its end, and with `RESOURCE_EXHAUSTED` when the bytes it has yielded
    /// cannot be added to the shared budget; what it took from the budget is returned when it
    /// is dropped.
    struct BoundedBody {
        #[pin]
        inner: tonic::body::Body,
        // `None` once the body has ended.
        #[pin]
        deadline: Option<Sleep>,
        budget: Arc<Semaphore>,
        held: Option<OwnedSemaphorePermit>,
    }
}

impl Body for BoundedBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, Status>>> {
        let mut this = self.project();
        let frame = match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if let Some(deadline) = this.deadline.as_mut().as_pin_mut() {
                    ready!(deadline.poll(cx));
                    this.deadline.set(None);
                    return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                        "the request was not received within {} s",
                        REQUEST_READ_TIMEOUT.as_secs()
                    )))));
                }
                return Poll::Pending;
            }
        };
        let Some(Ok(frame)) = frame else {
            // The end, or the transport's error: nothing more to bound.
            this.deadline.set(None);
            return Poll::Ready(frame);
        };
        if let Some(data) = frame.data_ref() {
            let bytes = u32::try_from(data.len()).unwrap_or(u32::MAX);
            match Arc::clone(this.budget).try_acquire_many_owned(bytes) {
                Ok(permit) => match this.held {
                    Some(held) => held.merge(permit),
                    None => *this.held = Some(permit),
                },
                Err(_) => {
                    this.deadline.set(None);
                    return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                        "the server holds its limit of {} MiB of requests being received; retry",
                        MAX_PENDING_REQUEST_BYTES / (1024 * 1024)
                    )))));
                }
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
