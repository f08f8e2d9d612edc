//! The gRPC listener's bounds, against the built binary: at most `MAX_GRPC_CONNECTIONS`
//! connections, a call's request read within `REQUEST_READ_TIMEOUT`, and the request bytes of
//! calls being received within `MAX_PENDING_REQUEST_BYTES`, the preface within `PREFACE_TIMEOUT`. The stalled calls are sent by a raw
//! HTTP/2 client (h2), which can stop in the middle of a gRPC message as no gRPC client does.

use crate::backends::{Files, ServerProcess};
use crate::support::{client, grpc_status, h2_connection, request, start_call, views};

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use bytes::Bytes;
use runlimit_server::{
    MAX_GRPC_CONNECTIONS, MAX_PENDING_REQUEST_BYTES, PREFACE_TIMEOUT, REQUEST_READ_TIMEOUT,
};

/// HTTP/2's client connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const RULES: &str = "\
domain: bounds
descriptors:
  - key: client
    rate_limit:
      unit: hour
      requests_per_unit: 5
";

fn start(files: &Files) -> ServerProcess {
    let (rules, secret) = (files.rules(), files.secret());
    ServerProcess::start(&["--config", &rules, "--key-secret-file", &secret], &[])
}

/// Connections beyond `MAX_GRPC_CONNECTIONS` are closed as soon as they are accepted; one
/// closed by its client frees its place for the next.
/// Regression: every idle connection was kept for ever, until the process ran out of file
/// descriptors (and with them its HTTP listener and its reloads).
#[tokio::test]
async fn connections_beyond_the_bound_are_closed_at_once() {
    let files = Files::new(RULES);
    let process = start(&files);
    // Each sends HTTP/2's preface (so it is not closed for lacking one) and reads the server's
    // first frame header (so it was accepted before the next connection is made).
    let mut held: Vec<TcpStream> = (0..MAX_GRPC_CONNECTIONS)
        .map(|_| {
            let mut stream = TcpStream::connect(process.grpc).unwrap();
            stream.write_all(PREFACE).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut settings = [0; 9];
            stream.read_exact(&mut settings).unwrap();
            stream
        })
        .collect();
    let closed_at_once = |address: SocketAddr| {
        let mut extra = TcpStream::connect(address).unwrap();
        extra.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut byte = [0; 1];
        match extra.read(&mut byte) {
            Ok(0) => true,
            Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    };
    assert!(closed_at_once(process.grpc), "a connection beyond the bound was kept");
    // One closed frees its place: a gRPC call is served again.
    held.truncate(MAX_GRPC_CONNECTIONS - 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let response = loop {
        let call = tokio::time::timeout(Duration::from_secs(2), async {
            client(process.grpc).await.should_rate_limit(request("bounds", &[&[("client", "a")]])).await
        });
        if let Ok(Ok(response)) = call.await {
            break response.into_inner();
        }
        assert!(Instant::now() < deadline, "no call served after a connection closed");
    };
    assert_eq!(views(&response)[0].2, 4);
    drop(held);
}

/// A connection that has not sent HTTP/2's preface within `PREFACE_TIMEOUT` is closed (and
/// gives its place back). Regression: it was kept for ever.
#[test]
fn a_connection_without_a_preface_is_closed() {
    let files = Files::new(RULES);
    let process = start(&files);
    let mut silent = TcpStream::connect(process.grpc).unwrap();
    // Fewer bytes than the preface's 24.
    silent.write_all(&PREFACE[..10]).unwrap();
    let started = Instant::now();
    silent.set_read_timeout(Some(PREFACE_TIMEOUT + Duration::from_secs(10))).unwrap();
    let mut received = Vec::new();
    match silent.read_to_end(&mut received) {
        Ok(_) => {}
        Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}"),
    }
    let elapsed = started.elapsed();
    assert!(elapsed >= PREFACE_TIMEOUT - Duration::from_millis(100), "closed after {elapsed:?}");
    assert!(elapsed < PREFACE_TIMEOUT + Duration::from_secs(5), "closed after {elapsed:?}");
}

/// Starts a `ShouldRateLimit` call on `sender` whose gRPC message announces `announced` bytes
/// and sends the first `sent` of them, never ending the stream; returns the response's future.
fn stalled_call(
    sender: &mut h2::client::SendRequest<Bytes>,
    announced: u32,
    sent: usize,
) -> h2::client::ResponseFuture {
    let (response, mut stream) = start_call(sender);
    let mut message = vec![0_u8];
    message.extend_from_slice(&announced.to_be_bytes());
    message.resize(5 + sent, b'x');
    stream.send_data(Bytes::from(message), false).unwrap();
    // The stream stays open: dropping the handle does not end it.
    std::mem::forget(stream);
    response
}

/// A call that sends part of its message and stops is answered `DEADLINE_EXCEEDED` (4) once
/// `REQUEST_READ_TIMEOUT` has passed. Regression: it was kept for ever, with what it had sent.
#[tokio::test]
async fn a_stalled_request_is_answered_deadline_exceeded() {
    let files = Files::new(RULES);
    let process = start(&files);
    let mut sender = h2_connection(process.grpc).await;
    let started = Instant::now();
    let response = stalled_call(&mut sender, 100, 10);
    let answered = tokio::time::timeout(REQUEST_READ_TIMEOUT * 3, grpc_status(response)).await;
    let (status, message) = answered.expect("no answer to a stalled call");
    assert_eq!((status.as_str(), message.as_str()), ("4", "the request was not received within 10 s"));
    assert!(started.elapsed() >= REQUEST_READ_TIMEOUT, "{:?}", started.elapsed());
    // The server still serves.
    let response =
        client(process.grpc).await.should_rate_limit(request("bounds", &[&[("client", "a")]])).await;
    assert_eq!(views(&response.unwrap().into_inner())[0].2, 4);
}

/// Calls that together send more than `MAX_PENDING_REQUEST_BYTES` of unfinished messages (17
/// calls of 4,000,000 bytes each, 68,000,000 against 67,108,864) are not all kept: at least one
/// is answered `RESOURCE_EXHAUSTED` (8) at once, and the others `DEADLINE_EXCEEDED` when their
/// time is up. Regression: each was kept, so calls like these held gigabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_requests_share_a_bounded_budget() {
    const CALLS: usize = 17;
    const SENT: usize = 4_000_000;
    const { assert!(CALLS * SENT > MAX_PENDING_REQUEST_BYTES && (CALLS - 1) * SENT < MAX_PENDING_REQUEST_BYTES) };
    let files = Files::new(RULES);
    let process = start(&files);
    let mut sender = h2_connection(process.grpc).await;
    let responses: Vec<_> = (0..CALLS).map(|_| stalled_call(&mut sender, 4 * 1024 * 1024, SENT)).collect();
    let answers = tokio::time::timeout(
        REQUEST_READ_TIMEOUT * 3,
        join_all(responses.into_iter().map(grpc_status).collect()),
    )
    .await
    .expect("stalled calls were not all answered");
    let exhausted = answers.iter().filter(|(status, _)| status == "8").count();
    let timed_out = answers.iter().filter(|(status, _)| status == "4").count();
    assert!(exhausted >= 1, "{answers:?}");
    assert_eq!(exhausted + timed_out, CALLS, "{answers:?}");
    let (_, message) = answers.iter().find(|(status, _)| status == "8").unwrap();
    assert_eq!(message, "the server holds its limit of 64 MiB of requests being received; retry");
}

/// Awaits every future, concurrently (tokio tasks; the test has no futures crate).
async fn join_all<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        outputs.push(task.await.unwrap());
    }
    outputs
}
