//! The proto3 JSON mapping of the RLS v3 messages, for envoyproxy/ratelimit's `POST /json`: the
//! body is a `RateLimitRequest`, the answer a `RateLimitResponse`, both as protobuf's JSON
//! mapping (<https://protobuf.dev/programming-guides/json/>) as Go's `protojson` reads and
//! writes it. `envoy-types` has no serde support, so the request is read through mirror structs
//! and the response is written by hand.
//!
//! Reading, as `protojson.Unmarshal` does:
//! - a field may be named in lowerCamelCase or by its proto name (`hitsAddend`, `hits_addend`);
//!   naming one field twice (in either spelling) is an error, and so is an unknown field;
//! - `null` means the field's default (a wrapper or message field stays unset), except as a list
//!   element;
//! - integers are JSON numbers or decimal strings (`5`, `"5"`, `5.0`, `"5e0"`); a fraction, a
//!   sign on an unsigned field, a value out of range, or space inside a string is an error;
//! - an enum is its value name (case-sensitive) or any 32-bit number (proto3 enums are open).
//!
//! One divergence: serde_json hands a number written with a fraction or an exponent over as an
//! `f64`, so such a number is taken only when it is an integer no larger than 2^53 (where `f64`
//! is exact); `protojson` reads the digits exactly. An integer written as plain digits, or as a
//! string, is always read exactly. (So a number with more significant digits than an `f64` holds
//! that rounds to an integer, such as `1.0000000000000001`, is read as that integer.)
//!
//! Writing, as `protojson.Marshal` does: lowerCamelCase names in the proto's declaration order,
//! default values (0, `""`, the zero enum value, empty lists, unset messages) left out, enums
//! as their names (a number without a name as the number), a `Duration` as `"1.500s"`, a
//! `Timestamp` as RFC 3339 in UTC, bytes as padded base64. The output has no whitespace, so
//! equal responses render to equal bytes (`protojson` adds random spaces on purpose).

use std::{fmt, fmt::Write as _, marker::PhantomData};

use envoy_types::pb::{
    envoy::{
        config::core::v3::HeaderValue,
        extensions::common::ratelimit::v3::{
            RateLimitDescriptor,
            rate_limit_descriptor::{Entry, RateLimitOverride},
        },
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{
                Code, DescriptorStatus, Quota, RateLimit, quota::ExpirationSpecifier, rate_limit::Unit,
            },
        },
        r#type::v3::RateLimitUnit,
    },
    google::protobuf::{Duration, Struct, Timestamp, UInt64Value, Value, value::Kind},
};
use serde::{
    Deserialize, Deserializer,
    de::{self, MapAccess, Unexpected, Visitor, value::MapAccessDeserializer},
};

/// Why a body was refused: a message naming the field, e.g.
/// ``descriptors[0].entries[1]: unknown field `valu`, expected `key` or `value` ``. A body that
/// is not JSON at all also gives the line and column.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct JsonError {
    message: String,
}

impl JsonError {
    fn new(path: Option<&serde_path_to_error::Path>, error: &serde_json::Error) -> Self {
        use serde_path_to_error::Segment;

        let mut message = error.to_string();
        // serde_json appends the position to every error; for a field's value the path says
        // where (and is stable under reformatting), for broken JSON the position does.
        if error.is_data() {
            let position = format!(" at line {} column {}", error.line(), error.column());
            if let Some(stripped) = message.strip_suffix(&position) {
                message.truncate(stripped.len());
            }
        }
        let mut segments: Vec<&Segment> = path.map(|path| path.iter().collect()).unwrap_or_default();
        // Where a syntax error interrupts a key, the path ends in segments of unknown name.
        while segments.last().is_some_and(|segment| matches!(segment, Segment::Unknown)) {
            segments.pop();
        }
        // An unknown field is named by the message; the path is the object it is in.
        if let Some(Segment::Map { key }) = segments.last()
            && message.starts_with(&format!("unknown field `{key}`"))
        {
            segments.pop();
        }
        if !segments.is_empty() {
            let mut prefix = String::new();
            for segment in segments {
                if !prefix.is_empty() && !matches!(segment, Segment::Seq { .. }) {
                    prefix.push('.');
                }
                let _ = write!(prefix, "{segment}");
            }
            message = format!("{prefix}: {message}");
        }
        Self { message }
    }
}

/// Parses the proto3 JSON form of a RateLimitRequest (the body of POST /json).
pub(crate) fn parse_request(body: &[u8]) -> Result<RateLimitRequest, JsonError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let Message(request) = serde_path_to_error::deserialize::<_, Message<RequestJson>>(&mut deserializer)
        .map_err(|error| JsonError::new(Some(error.path()), error.inner()))?;
    deserializer.end().map_err(|error| JsonError::new(None, &error))?;
    Ok(request.into_proto())
}

/// The proto3 JSON form of a RateLimitResponse.
pub(crate) fn render_response(response: &RateLimitResponse) -> String {
    let mut out = String::with_capacity(256);
    let mut object = Object::begin(&mut out);
    if response.overall_code != 0 {
        code(object.key("overallCode"), response.overall_code);
    }
    if !response.statuses.is_empty() {
        list(object.key("statuses"), &response.statuses, status);
    }
    if !response.response_headers_to_add.is_empty() {
        list(object.key("responseHeadersToAdd"), &response.response_headers_to_add, header);
    }
    if !response.request_headers_to_add.is_empty() {
        list(object.key("requestHeadersToAdd"), &response.request_headers_to_add, header);
    }
    if !response.raw_body.is_empty() {
        base64(object.key("rawBody"), &response.raw_body);
    }
    if let Some(metadata) = &response.dynamic_metadata {
        json_struct(object.key("dynamicMetadata"), metadata);
    }
    if let Some(value) = &response.quota {
        quota(object.key("quota"), value);
    }
    object.end();
    out
}

// ---------------------------------------------------------------------------------------------
// Reading

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestJson {
    domain: Option<String>,
    descriptors: Option<Vec<Message<DescriptorJson>>>,
    #[serde(rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<UInt32>,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorJson {
    entries: Option<Vec<Message<EntryJson>>>,
    limit: Option<Message<OverrideJson>>,
    /// A `google.protobuf.UInt64Value`: the plain value; `null` leaves it unset.
    #[serde(rename = "hitsAddend", alias = "hits_addend")]
    hits_addend: Option<UInt64>,
    #[serde(rename = "isNegativeHits", alias = "is_negative_hits")]
    is_negative_hits: Option<bool>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryJson {
    key: Option<String>,
    value: Option<String>,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideJson {
    #[serde(rename = "requestsPerUnit", alias = "requests_per_unit")]
    requests_per_unit: Option<UInt32>,
    unit: Option<UnitJson>,
}

impl RequestJson {
    fn into_proto(self) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.unwrap_or_default(),
            descriptors: self
                .descriptors
                .unwrap_or_default()
                .into_iter()
                .map(|Message(descriptor)| descriptor.into_proto())
                .collect(),
            hits_addend: self.hits_addend.map_or(0, |UInt32(value)| value),
        }
    }
}

impl DescriptorJson {
    fn into_proto(self) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: self
                .entries
                .unwrap_or_default()
                .into_iter()
                .map(|Message(entry)| Entry {
                    key: entry.key.unwrap_or_default(),
                    value: entry.value.unwrap_or_default(),
                })
                .collect(),
            limit: self.limit.map(|Message(limit)| RateLimitOverride {
                requests_per_unit: limit.requests_per_unit.map_or(0, |UInt32(value)| value),
                unit: limit.unit.map_or(0, |UnitJson(unit)| unit),
            }),
            hits_addend: self.hits_addend.map(|UInt64(value)| UInt64Value { value }),
            is_negative_hits: self.is_negative_hits.unwrap_or_default(),
        }
    }
}

/// A proto message's name, for the "expected a RateLimitDescriptor object" of a type error.
trait Named {
    const NAME: &'static str;
}

impl Named for RequestJson {
    const NAME: &'static str = "RateLimitRequest";
}

impl Named for DescriptorJson {
    const NAME: &'static str = "RateLimitDescriptor";
}

impl Named for EntryJson {
    const NAME: &'static str = "RateLimitDescriptor.Entry";
}

impl Named for OverrideJson {
    const NAME: &'static str = "RateLimitDescriptor.RateLimitOverride";
}

/// A message: a JSON object only. (A derived struct would also take a JSON array of its field
/// values, which `protojson` refuses.)
struct Message<T>(T);

impl<'de, T: Deserialize<'de> + Named> Deserialize<'de> for Message<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de> + Named> Visitor<'de> for ObjectVisitor<T> {
            type Value = Message<T>;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(formatter, "a {} object", T::NAME)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(Message)
            }
        }

        deserializer.deserialize_map(ObjectVisitor(PhantomData))
    }
}

/// A `uint32`: a JSON number or a decimal string.
struct UInt32(u32);

/// A `uint64` (here the value of a `google.protobuf.UInt64Value`): a JSON number or a decimal
/// string.
struct UInt64(u64);

impl<'de> Deserialize<'de> for UInt32 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let visitor = Unsigned { max: u32::MAX.into(), expecting: "a uint32 (a number or a decimal string)" };
        let value = deserializer.deserialize_any(visitor)?;
        u32::try_from(value)
            .map(Self)
            .map_err(|_| de::Error::invalid_value(Unexpected::Unsigned(value), &visitor))
    }
}

impl<'de> Deserialize<'de> for UInt64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let visitor = Unsigned { max: u64::MAX, expecting: "a uint64 (a number or a decimal string)" };
        deserializer.deserialize_any(visitor).map(Self)
    }
}

/// 2^53: up to here every integer is an `f64`, so a number serde_json read as one is exact.
const F64_EXACT_LIMIT: f64 = 9_007_199_254_740_992.0;

#[derive(Clone, Copy)]
struct Unsigned {
    max: u64,
    expecting: &'static str,
}

impl Visitor<'_> for Unsigned {
    type Value = u64;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.expecting)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<u64, E> {
        if value <= self.max { Ok(value) } else { Err(E::invalid_value(Unexpected::Unsigned(value), &self)) }
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<u64, E> {
        match u64::try_from(value) {
            Ok(value) => self.visit_u64(value),
            Err(_) => Err(E::invalid_value(Unexpected::Signed(value), &self)),
        }
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<u64, E> {
        let integer = integral_f64(value).filter(|_| value.is_sign_positive());
        match integer.and_then(|integer| u64::try_from(integer).ok()) {
            Some(integer) if integer <= self.max => {
                if value > F64_EXACT_LIMIT {
                    Err(inexact(value))
                } else {
                    Ok(integer)
                }
            }
            _ => Err(E::invalid_value(Unexpected::Float(value), &self)),
        }
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<u64, E> {
        // The text of a JSON number, whole: no sign (`protojson` refuses even "-0"), no space.
        let integer = match integer_text(value) {
            IntegerText::Integer(integer) if !value.starts_with('-') => u64::try_from(integer).ok(),
            _ => None,
        };
        match integer {
            Some(integer) if integer <= self.max => Ok(integer),
            _ => Err(E::invalid_value(Unexpected::Str(value), &self)),
        }
    }
}

/// An `envoy.type.v3.RateLimitUnit`: a value name, or a number (proto3 enums are open, so any
/// 32-bit number is taken, as `protojson` does).
struct UnitJson(i32);

impl<'de> Deserialize<'de> for UnitJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UnitVisitor).map(Self)
    }
}

/// The names of `envoy.type.v3.RateLimitUnit`.
/// The unit names accepted: `envoy.type.v3.RateLimitUnit`'s, and `WEEK` (7), which newer Envoy
/// API versions add and this server accepts (its responses name it).
const UNIT_NAMES: &[&str] = &["UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"];

struct UnitVisitor;

impl Visitor<'_> for UnitVisitor {
    type Value = i32;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a RateLimitUnit name (such as \"SECOND\") or number")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<i32, E> {
        i32::try_from(value).map_err(|_| E::invalid_value(Unexpected::Unsigned(value), &self))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<i32, E> {
        i32::try_from(value).map_err(|_| E::invalid_value(Unexpected::Signed(value), &self))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<i32, E> {
        integral_f64(value)
            .and_then(|integer| i32::try_from(integer).ok())
            .ok_or_else(|| E::invalid_value(Unexpected::Float(value), &self))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<i32, E> {
        if value == "WEEK" {
            return Ok(7);
        }
        RateLimitUnit::from_str_name(value)
            .map(i32::from)
            .ok_or_else(|| E::unknown_variant(value, UNIT_NAMES))
    }
}

/// The integer an `f64` holds, if it is a finite integer.
fn integral_f64(value: f64) -> Option<i128> {
    if !value.is_finite() || value.fract() != 0.0 {
        return None;
    }
    // Display writes a finite f64 as plain decimal digits (no exponent); -0.0 as "-0".
    match integer_text(&value.to_string()) {
        IntegerText::Integer(integer) => Some(integer),
        IntegerText::Fraction | IntegerText::OutOfRange | IntegerText::Invalid => None,
    }
}

fn inexact<E: de::Error>(value: f64) -> E {
    E::custom(format_args!(
        "the number {value} is written with a fraction or an exponent and is above 2^53, so it \
         may have been rounded; write it as plain digits or as a decimal string"
    ))
}

/// What the text of a JSON number denotes, as an integer.
#[derive(Debug, PartialEq, Eq)]
enum IntegerText {
    Integer(i128),
    /// A number, but not an integer (`1.5`, `1e-1`).
    Fraction,
    /// An integer beyond `i128`.
    OutOfRange,
    /// Not the text of a JSON number (`+1`, `01`, `1.`, ` 1`, `""`).
    Invalid,
}

/// Reads `text` as a JSON number (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`), exactly:
/// `1.50e1` is 15 and `1e-1` a fraction.
fn integer_text(text: &str) -> IntegerText {
    fn digits(text: &str) -> (&str, &str) {
        text.split_at(text.bytes().take_while(u8::is_ascii_digit).count())
    }

    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, rest) = digits(rest);
    if int.is_empty() || (int.len() > 1 && int.starts_with('0')) {
        return IntegerText::Invalid;
    }
    let (fraction, rest) = match rest.strip_prefix('.') {
        Some(rest) => match digits(rest) {
            ("", _) => return IntegerText::Invalid, // "1." or "1.e5"
            split => split,
        },
        None => ("", rest),
    };
    let exponent = match rest.strip_prefix(['e', 'E']) {
        Some(rest) => {
            let (sign, rest) = match rest.strip_prefix(['+', '-']) {
                Some(unsigned) => (if rest.starts_with('-') { -1 } else { 1 }, unsigned),
                None => (1, rest),
            };
            let (exponent, rest) = digits(rest);
            if exponent.is_empty() || !rest.is_empty() {
                return IntegerText::Invalid;
            }
            sign * exponent
                .bytes()
                .fold(0_i64, |n, digit| n.saturating_mul(10).saturating_add(i64::from(digit - b'0')))
        }
        None if rest.is_empty() => 0,
        None => return IntegerText::Invalid,
    };
    // The value is `significand × 10^shift`, the significand the digits without the point.
    let significand = format!("{int}{fraction}");
    let significand = significand.trim_start_matches('0');
    let trimmed = significand.trim_end_matches('0');
    if trimmed.is_empty() {
        return IntegerText::Integer(0);
    }
    let trailing_zeros = i64::try_from(significand.len() - trimmed.len()).unwrap_or(i64::MAX);
    let fraction_len = i64::try_from(fraction.len()).unwrap_or(i64::MAX);
    let shift = exponent.saturating_sub(fraction_len).saturating_add(trailing_zeros);
    if shift < 0 {
        return IntegerText::Fraction;
    }
    let magnitude =
        u32::try_from(shift).ok().and_then(|shift| 10_i128.checked_pow(shift)).and_then(|scale| {
            trimmed
                .bytes()
                .try_fold(0_i128, |n, digit| n.checked_mul(10)?.checked_add(i128::from(digit - b'0')))?
                .checked_mul(scale)
        });
    match magnitude {
        Some(magnitude) => IntegerText::Integer(if negative { -magnitude } else { magnitude }),
        None => IntegerText::OutOfRange,
    }
}

// ---------------------------------------------------------------------------------------------
// Writing

/// A JSON object being written: `{`, then `"key":value` pairs separated by commas, then `}`.
struct Object<'a> {
    out: &'a mut String,
    empty: bool,
}

impl<'a> Object<'a> {
    fn begin(out: &'a mut String) -> Self {
        out.push('{');
        Self { out, empty: true }
    }

    /// Writes the key of the next member; the caller writes its value to the returned buffer.
    fn key(&mut self, name: &str) -> &mut String {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        string(self.out, name);
        self.out.push(':');
        self.out
    }

    fn end(self) {
        self.out.push('}');
    }
}

fn list<T>(out: &mut String, items: &[T], write: fn(&mut String, &T)) {
    out.push('[');
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        write(out, item);
    }
    out.push(']');
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus`.
fn status(out: &mut String, status: &DescriptorStatus) {
    let mut object = Object::begin(out);
    if status.code != 0 {
        code(object.key("code"), status.code);
    }
    if let Some(limit) = &status.current_limit {
        rate_limit(object.key("currentLimit"), limit);
    }
    if status.limit_remaining != 0 {
        number(object.key("limitRemaining"), status.limit_remaining);
    }
    if let Some(duration) = &status.duration_until_reset {
        string(object.key("durationUntilReset"), &duration_text(duration));
    }
    if let Some(value) = &status.quota {
        quota(object.key("quota"), value);
    }
    object.end();
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit` (`name` is declared first).
fn rate_limit(out: &mut String, limit: &RateLimit) {
    let mut object = Object::begin(out);
    if !limit.name.is_empty() {
        string(object.key("name"), &limit.name);
    }
    if limit.requests_per_unit != 0 {
        number(object.key("requestsPerUnit"), limit.requests_per_unit);
    }
    if limit.unit != 0 {
        match Unit::try_from(limit.unit) {
            Ok(unit) => string(object.key("unit"), unit.as_str_name()),
            Err(_) => number(object.key("unit"), limit.unit),
        }
    }
    object.end();
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.Quota` (`valid_until` is declared second).
fn quota(out: &mut String, quota: &Quota) {
    let mut object = Object::begin(out);
    if quota.requests != 0 {
        number(object.key("requests"), quota.requests);
    }
    if let Some(ExpirationSpecifier::ValidUntil(timestamp)) = &quota.expiration_specifier {
        string(object.key("validUntil"), &timestamp_text(timestamp));
    }
    if !quota.id.is_empty() {
        string(object.key("id"), &quota.id);
    }
    object.end();
}

/// `envoy.config.core.v3.HeaderValue`.
fn header(out: &mut String, header: &HeaderValue) {
    let mut object = Object::begin(out);
    if !header.key.is_empty() {
        string(object.key("key"), &header.key);
    }
    if !header.value.is_empty() {
        string(object.key("value"), &header.value);
    }
    if !header.raw_value.is_empty() {
        base64(object.key("rawValue"), &header.raw_value);
    }
    object.end();
}

/// A `RateLimitResponse.Code`: its name, or the number when it has none.
fn code(out: &mut String, value: i32) {
    match Code::try_from(value) {
        Ok(code) => string(out, code.as_str_name()),
        Err(_) => number(out, value),
    }
}

fn number(out: &mut String, value: impl fmt::Display) {
    // Writing to a String cannot fail.
    let _ = write!(out, "{value}");
}

/// A JSON string: `"`, `\` and the control characters escaped, everything else as it is.
fn string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Bytes: standard base64 with padding, as a JSON string.
fn base64(out: &mut String, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let symbol = |index: u8| char::from(ALPHABET[usize::from(index & 0x3f)]);
    out.push('"');
    for chunk in bytes.chunks(3) {
        let [a, b, c] = [0, 1, 2].map(|i| chunk.get(i).copied().unwrap_or(0));
        out.push(symbol(a >> 2));
        out.push(symbol((a << 4) | (b >> 4)));
        out.push(if chunk.len() > 1 { symbol((b << 2) | (c >> 6)) } else { '=' });
        out.push(if chunk.len() > 2 { symbol(c) } else { '=' });
    }
    out.push('"');
}

/// A `google.protobuf.Struct`: a JSON object, its keys sorted (as `protojson` writes a map).
fn json_struct(out: &mut String, value: &Struct) {
    let mut fields: Vec<_> = value.fields.iter().collect();
    fields.sort_unstable_by_key(|&(key, _)| key);
    let mut object = Object::begin(out);
    for (key, field) in fields {
        json_value(object.key(key), field);
    }
    object.end();
}

/// A `google.protobuf.Value`: the JSON value it holds. `protojson` refuses to write an unset
/// kind and a non-finite number; this writes `null` and the proto3 JSON of a `double`
/// (`"NaN"`, `"Infinity"`, `"-Infinity"`) instead.
fn json_value(out: &mut String, value: &Value) {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => out.push_str("null"),
        Some(Kind::NumberValue(value)) if value.is_nan() => out.push_str("\"NaN\""),
        Some(Kind::NumberValue(value)) if value.is_infinite() => {
            out.push_str(if *value > 0.0 { "\"Infinity\"" } else { "\"-Infinity\"" });
        }
        // Display writes a finite f64 as plain decimal digits, a valid JSON number.
        Some(Kind::NumberValue(value)) => number(out, value),
        Some(Kind::StringValue(text)) => string(out, text),
        Some(Kind::BoolValue(flag)) => out.push_str(if *flag { "true" } else { "false" }),
        Some(Kind::StructValue(object)) => json_struct(out, object),
        Some(Kind::ListValue(items)) => list(out, &items.values, json_value),
    }
}

const NANOS_PER_SECOND: i128 = 1_000_000_000;

/// The fraction of a second as `protojson` writes it: nothing, or 3, 6 or 9 digits, as few
/// as are exact (`""`, `".500"`, `".000001"`). `nanos` is in 0..1e9.
fn fraction_text(nanos: i128) -> String {
    if nanos == 0 {
        return String::new();
    }
    let digits = format!("{nanos:09}");
    let digits = digits.strip_suffix("000000").or_else(|| digits.strip_suffix("000")).unwrap_or(&digits);
    format!(".{digits}")
}

/// A `google.protobuf.Duration`: `"58s"`, `"1.500s"`, `"-0.250s"`. Written from its total
/// nanoseconds, so a duration `protojson` would refuse (mixed signs, out of range), which the
/// service never builds, still reads as its value.
fn duration_text(duration: &Duration) -> String {
    let total = i128::from(duration.seconds) * NANOS_PER_SECOND + i128::from(duration.nanos);
    let magnitude = total.abs();
    let sign = if total < 0 { "-" } else { "" };
    let (seconds, nanos) = (magnitude / NANOS_PER_SECOND, magnitude % NANOS_PER_SECOND);
    format!("{sign}{seconds}{}s", fraction_text(nanos))
}

/// A `google.protobuf.Timestamp`: RFC 3339 in UTC, `"2026-08-06T12:00:00Z"`, with 0, 3, 6 or 9
/// fractional digits. (Nanoseconds outside 0..1e9 are carried into the seconds.)
fn timestamp_text(timestamp: &Timestamp) -> String {
    let total = i128::from(timestamp.seconds) * NANOS_PER_SECOND + i128::from(timestamp.nanos);
    let (seconds, nanos) = (total.div_euclid(NANOS_PER_SECOND), total.rem_euclid(NANOS_PER_SECOND));
    let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days: the proleptic Gregorian date of a day count.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i128::from(month <= 2);
    let (hour, minute, second) = (second_of_day / 3600, second_of_day / 60 % 60, second_of_day % 60);
    let fraction = fraction_text(nanos);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}{fraction}Z")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use envoy_types::pb::google::protobuf::ListValue;

    use super::*;

    fn entry(key: &str, value: &str) -> Entry {
        Entry { key: key.into(), value: value.into() }
    }

    fn refusal(body: &str) -> String {
        match parse_request(body.as_bytes()) {
            Ok(request) => panic!("{body} parsed as {request:?}"),
            Err(error) => error.to_string(),
        }
    }

    /// Every field of the request set, in the shape each `full_request_*` body describes.
    fn full_request() -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![entry("remote_address", "192.0.2.4"), entry("path", "/a")],
                    limit: Some(RateLimitOverride {
                        requests_per_unit: 10,
                        unit: RateLimitUnit::Second.into(),
                    }),
                    hits_addend: Some(UInt64Value { value: 3 }),
                    is_negative_hits: true,
                },
                RateLimitDescriptor {
                    entries: vec![entry("user", "")],
                    hits_addend: Some(UInt64Value { value: 0 }),
                    ..RateLimitDescriptor::default()
                },
            ],
            hits_addend: 2,
        }
    }

    #[test]
    fn the_readme_example_parses() {
        let body =
            br#"{"domain":"dummy","descriptors":[{"entries":[{"key":"one_per_day","value":"something"}]}]}"#;
        let expected = RateLimitRequest {
            domain: "dummy".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![entry("one_per_day", "something")],
                limit: None,
                hits_addend: None,
                is_negative_hits: false,
            }],
            hits_addend: 0,
        };
        assert_eq!(parse_request(body).unwrap(), expected);
    }

    #[test]
    fn camel_case_and_snake_case_names_both_parse() {
        let camel = r#"{
            "domain": "edge",
            "descriptors": [
                {
                    "entries": [{"key": "remote_address", "value": "192.0.2.4"}, {"key": "path", "value": "/a"}],
                    "limit": {"requestsPerUnit": 10, "unit": "SECOND"},
                    "hitsAddend": 3,
                    "isNegativeHits": true
                },
                {"entries": [{"key": "user"}], "hitsAddend": "0"}
            ],
            "hitsAddend": 2
        }"#;
        let snake = r#"{"domain":"edge","descriptors":[
            {"entries":[{"key":"remote_address","value":"192.0.2.4"},{"key":"path","value":"/a"}],
             "limit":{"requests_per_unit":10,"unit":"SECOND"},"hits_addend":"3","is_negative_hits":true},
            {"entries":[{"key":"user","value":""}],"hits_addend":0}],"hits_addend":2}"#;
        // Either spelling per field, mixed; numbers as strings; a unit as its number.
        let mixed = r#"{"hits_addend":"2","descriptors":[
            {"is_negative_hits":true,"hitsAddend":"3","limit":{"unit":1,"requests_per_unit":"10"},
             "entries":[{"value":"192.0.2.4","key":"remote_address"},{"key":"path","value":"/a"}]},
            {"hits_addend":0,"entries":[{"key":"user","value":null}]}],"domain":"edge"}"#;
        for body in [camel, snake, mixed] {
            assert_eq!(parse_request(body.as_bytes()).unwrap(), full_request(), "{body}");
        }
    }

    #[test]
    fn null_and_absent_fields_are_their_defaults() {
        let empty = RateLimitRequest::default();
        assert_eq!(parse_request(b"{}").unwrap(), empty);
        let nulls = r#"{"domain":null,"descriptors":null,"hitsAddend":null}"#;
        assert_eq!(parse_request(nulls.as_bytes()).unwrap(), empty);

        let body = r#"{"descriptors":[{},{"entries":null,"limit":null,"hits_addend":null,"isNegativeHits":null},
            {"entries":[{}],"limit":{}},{"limit":{"requestsPerUnit":null,"unit":null}}]}"#;
        let override_ = RateLimitOverride { requests_per_unit: 0, unit: 0 };
        let expected = RateLimitRequest {
            descriptors: vec![
                RateLimitDescriptor::default(),
                RateLimitDescriptor::default(),
                RateLimitDescriptor {
                    entries: vec![entry("", "")],
                    limit: Some(override_),
                    ..RateLimitDescriptor::default()
                },
                RateLimitDescriptor { limit: Some(override_), ..RateLimitDescriptor::default() },
            ],
            ..RateLimitRequest::default()
        };
        assert_eq!(parse_request(body.as_bytes()).unwrap(), expected);
    }

    #[test]
    fn integers_are_numbers_or_decimal_strings() {
        let hits = |json: &str| -> Result<u32, String> {
            parse_request(format!(r#"{{"hitsAddend":{json}}}"#).as_bytes())
                .map(|request| request.hits_addend)
                .map_err(|error| error.to_string())
        };
        for (json, value) in [
            ("0", 0),
            ("7", 7),
            (r#""7""#, 7),
            ("4294967295", u32::MAX),
            (r#""4294967295""#, u32::MAX),
            // protojson also takes an integer written with a fraction or an exponent.
            ("7.0", 7),
            ("7e0", 7),
            ("1E3", 1000),
            ("0.7e1", 7),
            (r#""7.0""#, 7),
            (r#""1.50e1""#, 15),
            (r#""1000e-3""#, 1),
            (r#""0e999999999999999999""#, 0),
            (r#""\u0037""#, 7),
        ] {
            assert_eq!(hits(json), Ok(value), "{json}");
        }

        let addend = |json: &str| {
            parse_request(format!(r#"{{"descriptors":[{{"hitsAddend":{json}}}]}}"#).as_bytes())
                .map(|request| request.descriptors[0].hits_addend)
                .map_err(|error| error.to_string())
        };
        for (json, value) in [
            ("0", Some(0)),
            ("null", None),
            ("18446744073709551615", Some(u64::MAX)),
            (r#""18446744073709551615""#, Some(u64::MAX)),
            (r#""1.8446744073709551615e19""#, Some(u64::MAX)),
            ("9007199254740992.0", Some(1 << 53)),
        ] {
            assert_eq!(addend(json), Ok(value.map(|value| UInt64Value { value })), "{json}");
        }
    }

    #[test]
    fn a_unit_is_a_name_or_a_number() {
        let unit = |json: &str| {
            parse_request(format!(r#"{{"descriptors":[{{"limit":{{"unit":{json}}}}}]}}"#).as_bytes())
                .map(|request| request.descriptors[0].limit.map(|limit| limit.unit))
                .map_err(|error| error.to_string())
        };
        for (name, value) in UNIT_NAMES.iter().zip([0, 1, 2, 3, 4, 5, 6]) {
            assert_eq!(unit(&format!("\"{name}\"")), Ok(Some(value)));
        }
        assert_eq!(unit("4"), Ok(Some(RateLimitUnit::Day.into())));
        assert_eq!(unit("4.0"), Ok(Some(4)));
        // proto3 enums are open: a number without a name is kept (as protojson does).
        assert_eq!(unit("7"), Ok(Some(7)));
        assert_eq!(unit("-1"), Ok(Some(-1)));
        assert_eq!(unit("null"), Ok(Some(0)));
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert_eq!(
            refusal(
                r#"{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"b"},{"key":"c","valu":"d"}]}]}"#
            ),
            "descriptors[0].entries[1]: unknown field `valu`, expected `key` or `value`"
        );
        assert_eq!(
            refusal(r#"{"domain":"d","descriptor":[]}"#),
            "unknown field `descriptor`, expected one of `domain`, `descriptors`, `hitsAddend`, `hits_addend`"
        );
        assert_eq!(
            refusal(r#"{"descriptors":[{"entries":[],"shadow_mode":true}]}"#),
            "descriptors[0]: unknown field `shadow_mode`, expected one of `entries`, `limit`, `hitsAddend`, \
             `hits_addend`, `isNegativeHits`, `is_negative_hits`"
        );
        assert_eq!(
            refusal(r#"{"descriptors":[{"limit":{"requestsPerUnit":1,"unit":"SECOND","name":"x"}}]}"#),
            "descriptors[0].limit: unknown field `name`, expected one of `requestsPerUnit`, `requests_per_unit`, \
             `unit`"
        );
        // Names are case-sensitive, and only the two spellings are known.
        assert_eq!(
            refusal(r#"{"Domain":"d"}"#),
            "unknown field `Domain`, expected one of `domain`, `descriptors`, `hitsAddend`, `hits_addend`"
        );
        assert_eq!(
            refusal(r#"{"hits-addend":1}"#),
            "unknown field `hits-addend`, expected one of `domain`, `descriptors`, `hitsAddend`, `hits_addend`"
        );
    }

    #[test]
    fn a_field_named_twice_is_refused() {
        assert_eq!(refusal(r#"{"domain":"a","domain":"b"}"#), "duplicate field `domain`");
        assert_eq!(refusal(r#"{"hitsAddend":1,"hits_addend":1}"#), "duplicate field `hitsAddend`");
        assert_eq!(
            refusal(r#"{"descriptors":[{"is_negative_hits":true,"isNegativeHits":true}]}"#),
            "descriptors[0]: duplicate field `isNegativeHits`"
        );
    }

    #[test]
    fn wrong_types_are_refused() {
        for (body, message) in [
            (r#"{"domain":5}"#, "domain: invalid type: integer `5`, expected a string"),
            (r#"{"domain":["d"]}"#, "domain: invalid type: sequence, expected a string"),
            (r#"{"descriptors":{"entries":[]}}"#, "descriptors: invalid type: map, expected a sequence"),
            (
                r#"{"descriptors":["one_per_day"]}"#,
                "descriptors[0]: invalid type: string \"one_per_day\", expected a RateLimitDescriptor object",
            ),
            // A list's element may not be null; a message is not an array of its fields.
            (
                r#"{"descriptors":[null]}"#,
                "descriptors[0]: invalid type: null, expected a RateLimitDescriptor object",
            ),
            (
                r#"{"descriptors":[{"entries":[["k","v"]]}]}"#,
                "descriptors[0].entries[0]: invalid type: sequence, expected a RateLimitDescriptor.Entry object",
            ),
            (
                r#"{"descriptors":[{"entries":[{"key":"k","value":1}]}]}"#,
                "descriptors[0].entries[0].value: invalid type: integer `1`, expected a string",
            ),
            (
                r#"{"descriptors":[{"limit":[10,"SECOND"]}]}"#,
                "descriptors[0].limit: invalid type: sequence, expected a RateLimitDescriptor.RateLimitOverride \
                 object",
            ),
            (
                r#"{"descriptors":[{"isNegativeHits":"true"}]}"#,
                "descriptors[0].isNegativeHits: invalid type: string \"true\", expected a boolean",
            ),
            (
                r#"{"descriptors":[{"is_negative_hits":1}]}"#,
                "descriptors[0].is_negative_hits: invalid type: integer `1`, expected a boolean",
            ),
            (
                r#"{"hitsAddend":true}"#,
                "hitsAddend: invalid type: boolean `true`, expected a uint32 (a number or a decimal string)",
            ),
            (
                r#"{"descriptors":[{"hitsAddend":{"value":1}}]}"#,
                "descriptors[0].hitsAddend: invalid type: map, expected a uint64 (a number or a decimal string)",
            ),
            (
                r#"{"descriptors":[{"limit":{"unit":true}}]}"#,
                "descriptors[0].limit.unit: invalid type: boolean `true`, expected a RateLimitUnit name (such as \
                 \"SECOND\") or number",
            ),
            ("[]", "invalid type: sequence, expected a RateLimitRequest object"),
            ("null", "invalid type: null, expected a RateLimitRequest object"),
            (r#""{}""#, "invalid type: string \"{}\", expected a RateLimitRequest object"),
        ] {
            assert_eq!(refusal(body), message, "{body}");
        }
    }

    #[test]
    fn week_is_a_unit_name_as_in_the_responses() {
        let request = parse_request(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"limit":{"requestsPerUnit":3,"unit":"WEEK"}}]}"#,
        )
        .unwrap();
        assert_eq!(
            request.descriptors[0].limit.map(|limit| (limit.requests_per_unit, limit.unit)),
            Some((3, 7))
        );
    }

    #[test]
    fn bad_unit_names_are_refused() {
        let names = "expected one of `UNKNOWN`, `SECOND`, `MINUTE`, `HOUR`, `DAY`, `MONTH`, `YEAR`, `WEEK`";
        for (unit, message) in [
            (r#""SECONDS""#, format!("unknown variant `SECONDS`, {names}")),
            // Case-sensitive, as in protojson (the YAML rule files' `unit: second` is another matter).
            (r#""second""#, format!("unknown variant `second`, {names}")),
            (r#""week""#, format!("unknown variant `week`, {names}")),
            // A string is a name, never a number.
            (r#""1""#, format!("unknown variant `1`, {names}")),
            (
                "1.5",
                "invalid value: floating point `1.5`, expected a RateLimitUnit name (such as \"SECOND\") or number"
                    .to_owned(),
            ),
            (
                "2147483648",
                "invalid value: integer `2147483648`, expected a RateLimitUnit name (such as \"SECOND\") or number"
                    .to_owned(),
            ),
        ] {
            let body = format!(r#"{{"descriptors":[{{"limit":{{"requests_per_unit":1,"unit":{unit}}}}}]}}"#);
            assert_eq!(refusal(&body), format!("descriptors[0].limit.unit: {message}"), "{unit}");
        }
    }

    #[test]
    fn negative_fractional_and_out_of_range_numbers_are_refused() {
        let uint32 = "expected a uint32 (a number or a decimal string)";
        let uint64 = "expected a uint64 (a number or a decimal string)";
        let limit = |json: &str| format!(r#"{{"descriptors":[{{"limit":{{"requestsPerUnit":{json}}}}}]}}"#);
        let addend = |json: &str| format!(r#"{{"descriptors":[{{"hitsAddend":{json}}}]}}"#);
        for (body, message) in [
            (limit("-1"), format!("descriptors[0].limit.requestsPerUnit: invalid value: integer `-1`, {uint32}")),
            (limit("1.5"), format!("descriptors[0].limit.requestsPerUnit: invalid value: floating point `1.5`, {uint32}")),
            (limit("1e-1"), format!("descriptors[0].limit.requestsPerUnit: invalid value: floating point `0.1`, {uint32}")),
            (limit("-0"), format!("descriptors[0].limit.requestsPerUnit: invalid value: floating point `-0.0`, {uint32}")),
            (
                limit("4294967296"),
                format!("descriptors[0].limit.requestsPerUnit: invalid value: integer `4294967296`, {uint32}"),
            ),
            (
                limit("1e10"),
                format!("descriptors[0].limit.requestsPerUnit: invalid value: floating point `10000000000.0`, {uint32}"),
            ),
            (limit(r#""-1""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"-1\", {uint32}")),
            (limit(r#""-0""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"-0\", {uint32}")),
            (limit(r#""1.5""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"1.5\", {uint32}")),
            // The text of a JSON number, whole: no space, no plus, no leading zero, no hex, not empty.
            (limit(r#"" 5""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \" 5\", {uint32}")),
            (limit(r#""5 ""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"5 \", {uint32}")),
            (limit(r#""+5""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"+5\", {uint32}")),
            (limit(r#""05""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"05\", {uint32}")),
            (limit(r#""5.""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"5.\", {uint32}")),
            (limit(r#""0x5""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"0x5\", {uint32}")),
            (limit(r#""""#), format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"\", {uint32}")),
            (
                limit(r#""4294967296""#),
                format!("descriptors[0].limit.requestsPerUnit: invalid value: string \"4294967296\", {uint32}"),
            ),
            (
                r#"{"hits_addend":-3}"#.to_owned(),
                format!("hits_addend: invalid value: integer `-3`, {uint32}"),
            ),
            (addend("-1"), format!("descriptors[0].hitsAddend: invalid value: integer `-1`, {uint64}")),
            (addend("0.5"), format!("descriptors[0].hitsAddend: invalid value: floating point `0.5`, {uint64}")),
            (
                addend(r#""18446744073709551616""#),
                format!("descriptors[0].hitsAddend: invalid value: string \"18446744073709551616\", {uint64}"),
            ),
            (
                addend("18446744073709551616"),
                format!("descriptors[0].hitsAddend: invalid value: floating point `1.8446744073709552e+19`, {uint64}"),
            ),
            (
                addend("1e19"),
                "descriptors[0].hitsAddend: the number 10000000000000000000 is written with a fraction or an \
                 exponent and is above 2^53, so it may have been rounded; write it as plain digits or as a decimal \
                 string"
                    .to_owned(),
            ),
        ] {
            assert_eq!(refusal(&body), message, "{body}");
        }
    }

    #[test]
    fn malformed_json_is_refused_with_its_position() {
        for (body, message) in [
            ("", "EOF while parsing a value at line 1 column 0"),
            (r#"{"domain":"dummy""#, "EOF while parsing an object at line 1 column 17"),
            (r#"{"domain":"dummy",}"#, "trailing comma at line 1 column 19"),
            (r#"{"domain":dummy}"#, "domain: expected value at line 1 column 11"),
            (
                r#"{"descriptors":[{"entries":[}]}"#,
                "descriptors[0].entries[0]: expected value at line 1 column 29",
            ),
            (r#"{"domain":"d"} {}"#, "trailing characters at line 1 column 16"),
            ("{'domain':'d'}", "key must be a string at line 1 column 2"),
            (r#"{"domain":"\ud800"}"#, "domain: unexpected end of hex escape at line 1 column 18"),
        ] {
            assert_eq!(refusal(body), message, "{body:?}");
        }
        assert_eq!(
            parse_request(b"{\"domain\":\"\xff\"}").unwrap_err().to_string(),
            "domain: invalid unicode code point at line 1 column 12"
        );
    }

    #[test]
    fn integer_text_reads_json_numbers_exactly() {
        use IntegerText::{Fraction, Integer, Invalid, OutOfRange};
        for (text, expected) in [
            ("0", Integer(0)),
            ("-0", Integer(0)),
            ("120", Integer(120)),
            ("-120", Integer(-120)),
            ("1.20e2", Integer(120)),
            ("12E+1", Integer(120)),
            ("1200e-1", Integer(120)),
            ("0.000e5", Integer(0)),
            ("0.5", Fraction),
            ("1e-1", Fraction),
            ("1.25e1", Fraction),
            ("1e38", Integer(10_i128.pow(38))),
            ("1e39", OutOfRange),
            ("1e9999999999999999999999", OutOfRange),
            ("1e-9999999999999999999999", Fraction),
            ("", Invalid),
            ("-", Invalid),
            ("+1", Invalid),
            ("01", Invalid),
            ("1.", Invalid),
            (".5", Invalid),
            ("1e", Invalid),
            ("1e+", Invalid),
            ("1.e5", Invalid),
            ("1 ", Invalid),
            ("1x", Invalid),
            ("١", Invalid),
        ] {
            assert_eq!(integer_text(text), expected, "{text:?}");
        }
    }

    fn header_value(key: &str, value: &str) -> HeaderValue {
        HeaderValue { key: key.into(), value: value.into(), ..HeaderValue::default() }
    }

    fn duration(seconds: i64, nanos: i32) -> Option<Duration> {
        Some(Duration { seconds, nanos })
    }

    fn limit(name: &str, requests_per_unit: u32, unit: Unit) -> Option<RateLimit> {
        Some(RateLimit { name: name.into(), requests_per_unit, unit: unit.into() })
    }

    /// An OK response with one status of each shape, and both header lists.
    fn ok_response() -> RateLimitResponse {
        RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses: vec![
                DescriptorStatus {
                    code: Code::Ok.into(),
                    current_limit: limit("", 10, Unit::Minute),
                    limit_remaining: 9,
                    duration_until_reset: duration(58, 0),
                    ..DescriptorStatus::default()
                },
                DescriptorStatus {
                    code: Code::Ok.into(),
                    current_limit: limit("per_ip", 2, Unit::Second),
                    limit_remaining: 1,
                    duration_until_reset: duration(1, 500_000_000),
                    ..DescriptorStatus::default()
                },
                DescriptorStatus {
                    code: Code::Ok.into(),
                    current_limit: limit("", 100, Unit::Week),
                    limit_remaining: 99,
                    duration_until_reset: duration(0, 1_000_000),
                    ..DescriptorStatus::default()
                },
                // A shadow-mode rule over its limit: OK, nothing remaining, the reset due now.
                DescriptorStatus {
                    code: Code::Ok.into(),
                    current_limit: limit("", 1, Unit::Hour),
                    limit_remaining: 0,
                    duration_until_reset: duration(0, 0),
                    ..DescriptorStatus::default()
                },
                // No rule matched.
                DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() },
                // Unlimited.
                DescriptorStatus {
                    code: Code::Ok.into(),
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                },
            ],
            response_headers_to_add: vec![
                header_value("RateLimit-Limit", "2"),
                header_value("RateLimit-Remaining", "1"),
                header_value("RateLimit-Reset", "2"),
            ],
            request_headers_to_add: vec![header_value("x-ratelimit-checked", "true")],
            ..RateLimitResponse::default()
        }
    }

    const OK_JSON: &str = concat!(
        r#"{"overallCode":"OK","statuses":["#,
        r#"{"code":"OK","currentLimit":{"requestsPerUnit":10,"unit":"MINUTE"},"limitRemaining":9,"durationUntilReset":"58s"},"#,
        r#"{"code":"OK","currentLimit":{"name":"per_ip","requestsPerUnit":2,"unit":"SECOND"},"limitRemaining":1,"durationUntilReset":"1.500s"},"#,
        r#"{"code":"OK","currentLimit":{"requestsPerUnit":100,"unit":"WEEK"},"limitRemaining":99,"durationUntilReset":"0.001s"},"#,
        r#"{"code":"OK","currentLimit":{"requestsPerUnit":1,"unit":"HOUR"},"durationUntilReset":"0s"},"#,
        r#"{"code":"OK"},"#,
        r#"{"code":"OK","limitRemaining":4294967295}],"#,
        r#""responseHeadersToAdd":[{"key":"RateLimit-Limit","value":"2"},{"key":"RateLimit-Remaining","value":"1"},{"key":"RateLimit-Reset","value":"2"}],"#,
        r#""requestHeadersToAdd":[{"key":"x-ratelimit-checked","value":"true"}]}"#,
    );

    /// The example of notes §6.1: over the limit on the first descriptor, not the second.
    fn over_limit_response() -> RateLimitResponse {
        RateLimitResponse {
            overall_code: Code::OverLimit.into(),
            statuses: vec![
                DescriptorStatus {
                    code: Code::OverLimit.into(),
                    current_limit: limit("", 1, Unit::Minute),
                    duration_until_reset: duration(42, 0),
                    ..DescriptorStatus::default()
                },
                DescriptorStatus {
                    code: Code::Ok.into(),
                    current_limit: limit("", 2, Unit::Minute),
                    limit_remaining: 1,
                    duration_until_reset: duration(42, 0),
                    ..DescriptorStatus::default()
                },
            ],
            ..RateLimitResponse::default()
        }
    }

    const OVER_LIMIT_JSON: &str = concat!(
        r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":1,"unit":"MINUTE"},"durationUntilReset":"42s"},"#,
        r#"{"code":"OK","currentLimit":{"requestsPerUnit":2,"unit":"MINUTE"},"limitRemaining":1,"durationUntilReset":"42s"}]}"#,
    );

    #[test]
    fn an_ok_response_renders_every_status_shape() {
        assert_eq!(render_response(&ok_response()), OK_JSON);
    }

    #[test]
    fn an_over_limit_response_renders() {
        assert_eq!(render_response(&over_limit_response()), OVER_LIMIT_JSON);
    }

    #[test]
    fn unlimited_and_unmatched_statuses_render_alone() {
        let response = RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses: vec![
                DescriptorStatus {
                    code: Code::Ok.into(),
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                },
                DescriptorStatus { code: Code::Ok.into(), ..DescriptorStatus::default() },
            ],
            ..RateLimitResponse::default()
        };
        assert_eq!(
            render_response(&response),
            r#"{"overallCode":"OK","statuses":[{"code":"OK","limitRemaining":4294967295},{"code":"OK"}]}"#
        );
    }

    #[test]
    fn default_values_are_left_out() {
        // UNKNOWN is the zero value of Code, and an empty current limit is still present.
        assert_eq!(render_response(&RateLimitResponse::default()), "{}");
        let response = RateLimitResponse {
            statuses: vec![
                DescriptorStatus::default(),
                DescriptorStatus { current_limit: Some(RateLimit::default()), ..DescriptorStatus::default() },
            ],
            response_headers_to_add: vec![HeaderValue::default()],
            ..RateLimitResponse::default()
        };
        assert_eq!(
            render_response(&response),
            r#"{"statuses":[{},{"currentLimit":{}}],"responseHeadersToAdd":[{}]}"#
        );
    }

    #[test]
    fn headers_are_escaped_and_enums_without_a_name_are_numbers() {
        let response = RateLimitResponse {
            overall_code: 9,
            statuses: vec![DescriptorStatus {
                code: 3,
                current_limit: Some(RateLimit { name: "a\"b\\c".into(), requests_per_unit: 1, unit: 8 }),
                ..DescriptorStatus::default()
            }],
            response_headers_to_add: vec![header_value("X-Note", "tab\there\nline\u{1}é☃")],
            request_headers_to_add: vec![HeaderValue {
                key: "X-Raw".into(),
                value: String::new(),
                raw_value: b"\x00\xffab".to_vec(),
            }],
            ..RateLimitResponse::default()
        };
        let json = render_response(&response);
        assert_eq!(
            json,
            concat!(
                r#"{"overallCode":9,"statuses":[{"code":3,"currentLimit":{"name":"a\"b\\c","requestsPerUnit":1,"unit":8}}],"#,
                r#""responseHeadersToAdd":[{"key":"X-Note","value":"tab\there\nline\u0001é☃"}],"#,
                r#""requestHeadersToAdd":[{"key":"X-Raw","rawValue":"AP9hYg=="}]}"#,
            )
        );
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["responseHeadersToAdd"][0]["value"], "tab\there\nline\u{1}é☃");
        assert_eq!(parsed["statuses"][0]["currentLimit"]["name"], "a\"b\\c");
    }

    #[test]
    fn the_rest_of_the_response_renders_too() {
        let mut metadata = HashMap::new();
        let value = |kind| Value { kind: Some(kind) };
        metadata.insert("domain".to_owned(), value(Kind::StringValue("edge".into())));
        metadata.insert("hitsAddend".to_owned(), value(Kind::NumberValue(2.0)));
        metadata.insert("ratio".to_owned(), value(Kind::NumberValue(0.25)));
        metadata.insert("passed".to_owned(), value(Kind::BoolValue(true)));
        metadata.insert("none".to_owned(), value(Kind::NullValue(0)));
        metadata.insert(
            "descriptors".to_owned(),
            value(Kind::ListValue(ListValue {
                values: vec![value(Kind::StructValue(Struct {
                    fields: HashMap::from([(
                        "entries".to_owned(),
                        value(Kind::ListValue(ListValue::default())),
                    )]),
                }))],
            })),
        );
        let response = RateLimitResponse {
            overall_code: Code::Ok.into(),
            statuses: vec![DescriptorStatus {
                code: Code::Ok.into(),
                quota: Some(Quota { requests: 5, id: "q".into(), expiration_specifier: None }),
                ..DescriptorStatus::default()
            }],
            raw_body: b"over".to_vec(),
            dynamic_metadata: Some(Struct { fields: metadata }),
            quota: Some(Quota {
                requests: 10,
                id: String::new(),
                expiration_specifier: Some(ExpirationSpecifier::ValidUntil(Timestamp {
                    seconds: 1_786_017_600,
                    nanos: 250_000_000,
                })),
            }),
            ..RateLimitResponse::default()
        };
        assert_eq!(
            render_response(&response),
            concat!(
                r#"{"overallCode":"OK","statuses":[{"code":"OK","quota":{"requests":5,"id":"q"}}],"rawBody":"b3Zlcg==","#,
                r#""dynamicMetadata":{"descriptors":[{"entries":[]}],"domain":"edge","hitsAddend":2,"none":null,"passed":true,"ratio":0.25},"#,
                r#""quota":{"requests":10,"validUntil":"2026-08-06T12:00:00.250Z"}}"#,
            )
        );
    }

    #[test]
    fn durations_have_0_3_6_or_9_fractional_digits() {
        for ((seconds, nanos), text) in [
            ((0, 0), "0s"),
            ((58, 0), "58s"),
            ((1, 500_000_000), "1.500s"),
            ((0, 1_000_000), "0.001s"),
            ((0, 1_000), "0.000001s"),
            ((0, 1), "0.000000001s"),
            ((3, 120_000), "3.000120s"),
            ((3, 123_456_789), "3.123456789s"),
            ((86_400, 0), "86400s"),
            ((-1, -500_000_000), "-1.500s"),
            ((0, -250_000_000), "-0.250s"),
            ((315_576_000_000, 999_999_999), "315576000000.999999999s"),
            ((i64::MIN, i32::MIN), "-9223372036854775810.147483648s"),
        ] {
            assert_eq!(duration_text(&Duration { seconds, nanos }), text, "{seconds} {nanos}");
        }
    }

    #[test]
    fn timestamps_are_rfc_3339_in_utc() {
        for ((seconds, nanos), text) in [
            ((0, 0), "1970-01-01T00:00:00Z"),
            ((1_786_017_600, 0), "2026-08-06T12:00:00Z"),
            ((951_782_400, 1_000), "2000-02-29T00:00:00.000001Z"),
            ((-1, 999_999_999), "1969-12-31T23:59:59.999999999Z"),
            ((-62_135_596_800, 0), "0001-01-01T00:00:00Z"),
            ((253_402_300_799, 0), "9999-12-31T23:59:59Z"),
        ] {
            assert_eq!(timestamp_text(&Timestamp { seconds, nanos }), text, "{seconds} {nanos}");
        }
    }

    #[test]
    fn base64_pads_to_a_multiple_of_four() {
        for (bytes, text) in [
            (&b""[..], "\"\""),
            (b"f", "\"Zg==\""),
            (b"fo", "\"Zm8=\""),
            (b"foo", "\"Zm9v\""),
            (b"foob", "\"Zm9vYg==\""),
        ] {
            let mut out = String::new();
            base64(&mut out, bytes);
            assert_eq!(out, text);
        }
    }

    // ---- Round trips ------------------------------------------------------------------------

    /// Reads the proto3 JSON of a RateLimitResponse (the fields the service sets), for the round
    /// trips below: the inverse of `render_response` on its canonical output.
    fn parse_response(json: &str) -> RateLimitResponse {
        fn fields(value: &serde_json::Value) -> &serde_json::Map<String, serde_json::Value> {
            value.as_object().unwrap_or_else(|| panic!("not an object: {value}"))
        }
        fn enum_value(value: &serde_json::Value, from_name: fn(&str) -> Option<i32>) -> i32 {
            match value {
                serde_json::Value::String(name) => {
                    from_name(name).unwrap_or_else(|| panic!("no value named {name}"))
                }
                number => i32::try_from(number.as_i64().unwrap()).unwrap(),
            }
        }
        fn code(value: &serde_json::Value) -> i32 {
            enum_value(value, |name| Code::from_str_name(name).map(i32::from))
        }
        fn u32_of(value: &serde_json::Value) -> u32 {
            u32::try_from(value.as_u64().unwrap()).unwrap()
        }
        fn duration(text: &str) -> Duration {
            let text = text.strip_suffix('s').unwrap();
            let (seconds, fraction) = text.split_once('.').unwrap_or((text, ""));
            let nanos = if fraction.is_empty() { 0 } else { format!("{fraction:0<9}").parse().unwrap() };
            Duration { seconds: seconds.parse().unwrap(), nanos }
        }
        fn headers(value: &serde_json::Value) -> Vec<HeaderValue> {
            let text = |header: &serde_json::Map<_, _>, key| {
                header
                    .get(key)
                    .map(|value: &serde_json::Value| value.as_str().unwrap().to_owned())
                    .unwrap_or_default()
            };
            let headers = value.as_array().unwrap().iter().map(fields);
            headers.map(|header| header_value(&text(header, "key"), &text(header, "value"))).collect()
        }
        fn status(value: &serde_json::Value) -> DescriptorStatus {
            let mut status = DescriptorStatus::default();
            for (key, value) in fields(value) {
                match key.as_str() {
                    "code" => status.code = code(value),
                    "limitRemaining" => status.limit_remaining = u32_of(value),
                    "durationUntilReset" => {
                        status.duration_until_reset = Some(duration(value.as_str().unwrap()))
                    }
                    "currentLimit" => {
                        let mut limit = RateLimit::default();
                        for (key, value) in fields(value) {
                            match key.as_str() {
                                "name" => value.as_str().unwrap().clone_into(&mut limit.name),
                                "requestsPerUnit" => limit.requests_per_unit = u32_of(value),
                                "unit" => {
                                    limit.unit =
                                        enum_value(value, |name| Unit::from_str_name(name).map(i32::from))
                                }
                                other => panic!("unexpected currentLimit field {other}"),
                            }
                        }
                        status.current_limit = Some(limit);
                    }
                    other => panic!("unexpected status field {other}"),
                }
            }
            status
        }

        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        let mut response = RateLimitResponse::default();
        for (key, value) in fields(&value) {
            match key.as_str() {
                "overallCode" => response.overall_code = code(value),
                "statuses" => response.statuses = value.as_array().unwrap().iter().map(status).collect(),
                "responseHeadersToAdd" => response.response_headers_to_add = headers(value),
                "requestHeadersToAdd" => response.request_headers_to_add = headers(value),
                other => panic!("unexpected response field {other}"),
            }
        }
        response
    }

    #[test]
    fn rendering_round_trips_through_the_grpc_struct() {
        let unlimited = r#"{"overallCode":"OK","statuses":[{"code":"OK","limitRemaining":4294967295}]}"#;
        for json in [OK_JSON, OVER_LIMIT_JSON, unlimited, r#"{"statuses":[{}]}"#, "{}"] {
            let response = parse_response(json);
            assert_eq!(render_response(&response), json);
            assert_eq!(parse_response(&render_response(&response)), response);
        }
        for response in [ok_response(), over_limit_response()] {
            assert_eq!(parse_response(&render_response(&response)), response);
        }
    }
}
