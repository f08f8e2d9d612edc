//! The gRPC service of [`Service`]: `envoy.service.ratelimit.v3.RateLimitService` with a codec
//! of our own, so a request that cannot be decoded is the client's error.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message as _;
use tonic::{
    Request, Response, Status,
    codec::{Codec, DecodeBuf, Decoder},
    server::{Grpc, NamedService, UnaryService},
};
use tonic_prost::ProstEncoder;

use super::Service;

/// The path of the only method: `ShouldRateLimit`.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The gRPC service `envoy.service.ratelimit.v3.RateLimitService` answered by a [`Service`]:
/// add it to a `tonic::transport::Server` (the [`Server`](crate::Server) does).
///
/// It answers as envoy-types' generated `RateLimitServiceServer` does (same method, same
/// message size bound of 4 MiB, no compression), but for one thing: a request message that is
/// not a valid `RateLimitRequest` (a string field holding invalid UTF-8, a truncated or
/// mistyped field) is answered `INVALID_ARGUMENT`, `the request could not be decoded: `
/// followed by prost's reason, where the generated service answers `INTERNAL` (tonic's prost
/// codec maps every decoding error to `INTERNAL`). Such a request is the client's error, as
/// every other malformed request is; `INTERNAL` would read as the server's. A request is
/// decoded as the generated service decodes it (prost, in one pass), so well-formed requests
/// cost the same.
///
/// Every other path is answered `UNIMPLEMENTED`.
#[derive(Clone, Debug)]
pub struct RateLimitServer {
    service: Service,
}

impl RateLimitServer {
    /// The gRPC service answering with `service`.
    #[must_use]
    pub fn new(service: Service) -> Self {
        Self { service }
    }
}

impl NamedService for RateLimitServer {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

/// A boxed, sendable future: what tonic's services return.
type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

impl<B> tower_service::Service<http::Request<B>> for RateLimitServer
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync + 'static>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() == SHOULD_RATE_LIMIT {
            let method = ShouldRateLimit(self.service.clone());
            Box::pin(async move { Ok(Grpc::new(RequestCodec).unary(method, request).await) })
        } else {
            Box::pin(async move { Ok(Status::unimplemented("").into_http()) })
        }
    }
}

/// The `ShouldRateLimit` method as tonic's unary service.
struct ShouldRateLimit(Service);

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.should_rate_limit(request.get_ref()).await.map(Response::new) })
    }
}

/// tonic's prost codec for `RateLimitRequest` in and `RateLimitResponse` out, but with
/// [`RequestDecoder`]: a request that prost cannot decode is `INVALID_ARGUMENT`, not
/// `INTERNAL`.
#[derive(Clone, Copy, Debug, Default)]
struct RequestCodec;

impl Codec for RequestCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ProstEncoder<RateLimitResponse>;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder
    }
}

/// Decodes a `RateLimitRequest` as tonic's prost decoder does (`prost::Message::decode` over
/// the whole message), mapping prost's error to `INVALID_ARGUMENT`: the bytes came from the
/// client, so a message that is not a valid `RateLimitRequest` (invalid UTF-8 in a string, a
/// truncated field, a wrong wire type) is a malformed request. tonic's decoder answers
/// `INTERNAL`, which says the server failed and which the README's promise for malformed
/// requests excludes.
#[derive(Clone, Copy, Debug, Default)]
struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        RateLimitRequest::decode(buf)
            .map(Some)
            .map_err(|error| Status::invalid_argument(format!("the request could not be decoded: {error}")))
    }
}
