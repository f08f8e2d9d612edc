//! Checking a `RateLimitRequest` against the documented bounds, and what each descriptor asks
//! for: its entries, its hits and its limit override.

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::RateLimitDescriptor, service::ratelimit::v3::RateLimitRequest,
    r#type::v3::RateLimitUnit,
};
use tonic::Status;

use crate::config::Unit;

/// The most descriptors one request may carry: 64, the largest atomic batch every backend
/// accepts.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry: 32.
pub const MAX_ENTRIES: usize = 32;
/// The longest domain accepted, in bytes: 256.
pub const MAX_DOMAIN_LEN: usize = 256;
/// The longest entry key accepted, in bytes: 256.
pub const MAX_KEY_LEN: usize = 256;
/// The longest entry value accepted, in bytes: 65,536, above Envoy's default limit on a
/// request's headers (60 KiB), so no header value a default Envoy forwards is refused.
pub const MAX_VALUE_LEN: usize = 65_536;

/// Checks `request` against the bounds above and the fields this service refuses.
///
/// # Errors
///
/// `INVALID_ARGUMENT`, its message naming the field (`descriptors[1].entries[0].value: ...`):
/// an empty domain, no descriptors, a descriptor without entries, an empty key or value, more
/// descriptors or entries or longer strings than the bounds, `is_negative_hits: true` (Runlimit
/// never gives consumed quota back), or a limit override whose unit is `UNKNOWN`.
pub(crate) fn validate(request: &RateLimitRequest) -> Result<(), Status> {
    let invalid = |message: String| Err(Status::invalid_argument(message));
    if request.domain.is_empty() {
        return invalid("domain: empty; every request names its rate limit domain".to_owned());
    }
    if request.domain.len() > MAX_DOMAIN_LEN {
        return invalid(format!(
            "domain: {} bytes long, above the maximum of {MAX_DOMAIN_LEN}",
            request.domain.len()
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("descriptors: empty; a request carries at least one descriptor".to_owned());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid(format!(
            "descriptors: {} descriptors, above the maximum of {MAX_DESCRIPTORS}",
            request.descriptors.len()
        ));
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return invalid(format!(
                "descriptors[{index}].entries: empty; a descriptor has at least one entry"
            ));
        }
        if descriptor.entries.len() > MAX_ENTRIES {
            return invalid(format!(
                "descriptors[{index}].entries: {} entries, above the maximum of {MAX_ENTRIES}",
                descriptor.entries.len()
            ));
        }
        for (at, entry) in descriptor.entries.iter().enumerate() {
            for (field, text, maximum) in
                [("key", &entry.key, MAX_KEY_LEN), ("value", &entry.value, MAX_VALUE_LEN)]
            {
                if text.is_empty() {
                    return invalid(format!("descriptors[{index}].entries[{at}].{field}: empty"));
                }
                if text.len() > maximum {
                    return invalid(format!(
                        "descriptors[{index}].entries[{at}].{field}: {} bytes long, above the maximum of {maximum}",
                        text.len()
                    ));
                }
            }
        }
        if descriptor.is_negative_hits {
            return invalid(format!(
                "descriptors[{index}].is_negative_hits: refunds are not supported; Runlimit never gives \
                 consumed quota back"
            ));
        }
        if let Some(limit) = &descriptor.limit
            && override_unit(limit.unit).is_none()
        {
            return invalid(format!(
                "descriptors[{index}].limit.unit: {}; expected SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR",
                RateLimitUnit::try_from(limit.unit)
                    .map_or_else(|_| limit.unit.to_string(), |unit| unit.as_str_name().to_owned())
            ));
        }
    }
    Ok(())
}

/// The hits a descriptor adds: its own `hits_addend` when set (0 checks without charging),
/// else the request's, where 0 (unset) means 1.
pub(crate) fn hits(request: &RateLimitRequest, descriptor: &RateLimitDescriptor) -> u64 {
    match &descriptor.hits_addend {
        Some(hits) => hits.value,
        None => u64::from(request.hits_addend.max(1)),
    }
}

/// The unit of a limit override (`envoy.type.v3.RateLimitUnit`; 7 is `WEEK`, which newer
/// Envoy API versions add).
pub(crate) fn override_unit(unit: i32) -> Option<Unit> {
    if unit == 7 {
        return Some(Unit::Week);
    }
    match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => None,
        RateLimitUnit::Second => Some(Unit::Second),
        RateLimitUnit::Minute => Some(Unit::Minute),
        RateLimitUnit::Hour => Some(Unit::Hour),
        RateLimitUnit::Day => Some(Unit::Day),
        RateLimitUnit::Month => Some(Unit::Month),
        RateLimitUnit::Year => Some(Unit::Year),
    }
}

/// The bytes hashed into a descriptor's counter key: every entry's key and value, in order,
/// except that an entry matched by a `share_threshold` rule contributes the rule's pattern
/// instead, so every value it matches shares one counter. Each field is length-prefixed and
/// tagged, so no two distinct descriptors produce the same bytes.
pub(crate) fn subject(descriptor: &RateLimitDescriptor, shared: &[(usize, &str)]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(64);
    let field = |bytes: &mut Vec<u8>, text: &str| {
        bytes.extend_from_slice(&(text.len() as u64).to_be_bytes());
        bytes.extend_from_slice(text.as_bytes());
    };
    for (index, entry) in descriptor.entries.iter().enumerate() {
        match shared.iter().find(|(at, _)| *at == index) {
            Some((_, pattern)) => {
                bytes.push(b'S');
                field(&mut bytes, pattern);
            }
            None => {
                bytes.push(b'E');
                field(&mut bytes, &entry.key);
                field(&mut bytes, &entry.value);
            }
        }
    }
    bytes
}
