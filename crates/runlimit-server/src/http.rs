//! The HTTP listener: `GET /healthcheck`, `POST /json`, `GET /metrics`, `GET /rlconfig`.

use std::{
    fmt::Write as _,
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::{
    health::{Health, Status},
    json, metrics,
    service::Service,
};

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) service: Service,
    pub(crate) health: Health,
    pub(crate) metrics: Option<PrometheusHandle>,
}

/// The most HTTP connections served at once: 1,024. Further connections are closed as soon
/// as they are accepted.
pub const MAX_HTTP_CONNECTIONS: usize = 1_024;

/// How long a connection may take to send a request's headers: 10 s (then it is closed).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a `POST /json` body may take to arrive once its headers have: 10 s (then the
/// request is answered `408` and the connection closed). With [`HEADER_READ_TIMEOUT`] it bounds
/// how long a request can hold one of the [`MAX_HTTP_CONNECTIONS`].
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest `POST /json` body: 4 MiB, gRPC's default message bound (larger bodies are
/// answered `413`).
pub const MAX_JSON_BODY: usize = 4 * 1024 * 1024;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/json", post(json_call).layer(axum::extract::DefaultBodyLimit::max(MAX_JSON_BODY)))
        .route("/metrics", get(metrics_text))
        .route("/rlconfig", get(rlconfig))
        .with_state(state)
}

/// Serves `router` on `listener` (HTTP/1.1, `TCP_NODELAY`) until `stop` turns true, then lets
/// the connections finish their requests and returns.
///
/// Written on hyper rather than with `axum::serve`, which has no header-read timeout and no
/// bound on connections: a client that opens connections and sends nothing would otherwise
/// hold them (and the process's file descriptors) for ever.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_HTTP_CONNECTIONS));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let service = hyper_util::service::TowerToHyperService::new(router);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // A failed accept (out of file descriptors, a connection reset before it was
            // taken) ends nothing but that connection; wait a little so a lasting cause does
            // not spin.
            Err(error) => {
                tracing::debug!(%error, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            // At the bound: closed at once (dropped).
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service.clone());
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// `200 OK` while serving (with the problems of a refused reload, if the last one was); `503`
/// and the reason otherwise: preparing the backend, backend not ready (its readiness probe
/// failed), or shutting down.
async fn healthcheck(State(state): State<AppState>) -> Response {
    match state.health.status() {
        Status::Serving => {
            let mut body = "OK\n".to_owned();
            if let Some(problem) = state.health.config_problem() {
                let _ = writeln!(
                    body,
                    "the last reload was refused (at unix time {}); the rules loaded at unix time {} still serve:\n{}",
                    unix_seconds(problem.at),
                    unix_seconds(state.service.loaded_at()),
                    problem.errors
                );
            }
            text(StatusCode::OK, body)
        }
        Status::NotServing(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

/// envoyproxy/ratelimit's JSON form of the call: the proto3 JSON of a `RateLimitRequest` in,
/// of the `RateLimitResponse` out. `200` for `OK`, `429` for `OVER_LIMIT`, `400` for a body or
/// request refused (the message names the field), `413` for a body above [`MAX_JSON_BODY`],
/// `408` for one not received within [`BODY_READ_TIMEOUT`], `503` when the backend failed.
async fn json_call(State(state): State<AppState>, request: axum::extract::Request) -> Response {
    use axum::extract::FromRequest as _;
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, Bytes::from_request(request, &())).await {
        Ok(Ok(body)) => body,
        // Too large (413), or the connection failed.
        Ok(Err(rejection)) => return rejection.into_response(),
        Err(_) => {
            let message =
                format!("the request body was not received within {} s\n", BODY_READ_TIMEOUT.as_secs());
            return text(StatusCode::REQUEST_TIMEOUT, message);
        }
    };
    let request = match json::parse_request(&body) {
        Ok(request) => request,
        Err(error) => return text(StatusCode::BAD_REQUEST, format!("{error}\n")),
    };
    match state.service.should_rate_limit(&request).await {
        Ok(response) => {
            let status = if response.overall_code == i32::from(Code::OverLimit) {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, [(header::CONTENT_TYPE, "application/json")], json::render_response(&response))
                .into_response()
        }
        Err(status) => {
            let code = match status.code() {
                tonic::Code::InvalidArgument | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
                tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            text(code, format!("{}\n", status.message()))
        }
    }
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => {
            metrics::set_config_age(state.service.loaded_at());
            text(StatusCode::OK, handle.render())
        }
        None => text(StatusCode::NOT_FOUND, "no metrics recorder installed\n".to_owned()),
    }
}

/// The rules in force, as envoyproxy/ratelimit's `/rlconfig` shows them: one line per rule
/// with a `rate_limit`, sorted, after a header line saying when they were loaded and from
/// which files, and the problems of a refused reload, if the last one was.
async fn rlconfig(State(state): State<AppState>) -> Response {
    let (table, loaded_at) = state.service.snapshot();
    let mut body = format!("# loaded at unix time {} from", unix_seconds(loaded_at));
    for file in table.files() {
        // A file name may hold control characters too: the header stays one line.
        let _ = write!(body, " {}", crate::escape::escape_controls(&file.display().to_string()));
    }
    body.push('\n');
    if let Some(problem) = state.health.config_problem() {
        let _ = writeln!(body, "# the last reload was refused (at unix time {}):", unix_seconds(problem.at));
        for line in problem.errors.lines() {
            let _ = writeln!(body, "#   {line}");
        }
    }
    for line in table.dump() {
        body.push_str(&line);
        body.push('\n');
    }
    text(StatusCode::OK, body)
}
