//! The minimal RFC 9651 serializer the two fields need: Lists of Items whose bare value is a
//! String and whose parameters are non-negative Integers under fixed lowercase keys.
//!
//! Hand-written on purpose (see the module documentation of `draft_11`): every value is
//! validated when its item is built, so nothing here can fail.

use http::HeaderValue;

/// The largest Integer RFC 9651 can carry: 999,999,999,999,999 (15 digits, §3.3.1).
///
/// Serializers must fail above it (§4.1.4) and parsers reject longer numbers (§4.2.4), so
/// `q`, `r`, `t` and `w` values above it are rejected with a typed error rather than sent.
pub const MAX_INTEGER: u64 = 999_999_999_999_999;

/// A non-negative RFC 9651 Integer, at most [`MAX_INTEGER`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct SfInteger(u64);

impl SfInteger {
    /// `None` above [`MAX_INTEGER`].
    pub(super) const fn new(value: u64) -> Option<Self> {
        if value <= MAX_INTEGER { Some(Self(value)) } else { None }
    }

    pub(super) const fn get(self) -> u64 {
        self.0
    }
}

/// A parameter key. Only these four keys are ever written, each a valid RFC 9651 key
/// (lowercase, §3.1.2).
#[derive(Clone, Copy, Debug)]
pub(super) enum Key {
    /// `q`, quota (D11 §3.1.1).
    Quota,
    /// `w`, window (D11 §3.1.3).
    Window,
    /// `r`, available quota (D11 §4.1.1).
    Remaining,
    /// `t`, effective window (D11 §4.1.2).
    EffectiveWindow,
}

impl Key {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Quota => "q",
            Self::Window => "w",
            Self::Remaining => "r",
            Self::EffectiveWindow => "t",
        }
    }
}

/// Writes one list member: `"name";k1=v1;k2=v2`.
///
/// `name` must already satisfy RFC 9651 §3.3.3 (only %x20–%x7E), which
/// [`PolicyName::new`](super::PolicyName::new) guarantees. `"` and `\` are escaped with a
/// preceding `\` (§4.1.6); nothing else is.
pub(super) fn write_item(out: &mut String, name: &str, parameters: [(Key, SfInteger); 2]) {
    out.push('"');
    for character in name.chars() {
        if matches!(character, '"' | '\\') {
            out.push('\\');
        }
        out.push(character);
    }
    out.push('"');
    for (key, value) in parameters {
        out.push(';');
        out.push_str(key.as_str());
        out.push('=');
        out.push_str(itoa::Buffer::new().format(value.get()));
    }
}

/// Serializes a list of members, `None` for an empty list (RFC 9651 §4.1: an empty List is
/// not serialized; D11 §3 and §4 require non-empty fields).
pub(super) fn list<'a, T: 'a>(
    members: impl IntoIterator<Item = &'a T>,
    mut write: impl FnMut(&mut String, &T),
) -> Option<HeaderValue> {
    // Room for one typical item (`"name";q=1000;w=3600`), so one allocation usually suffices.
    let mut out = String::with_capacity(64);
    for (index, member) in members.into_iter().enumerate() {
        if index > 0 {
            // RFC 9651 §4.1.1: "," followed by a single SP.
            out.push_str(", ");
        }
        write(&mut out, member);
    }
    if out.is_empty() {
        return None;
    }
    Some(header_value(out))
}

/// Converts serializer output into a header value.
///
/// The serializer writes only bytes in %x20–%x7E (a validated name, `"`, `\`, `;`, `=`, `,`,
/// SP and ASCII digits), every one of which [`HeaderValue`] accepts (RFC 9110 §5.5
/// field-vchar and SP), so the conversion cannot fail; the proptests check it for arbitrary
/// valid inputs. Rather than panic in a response path should that ever change, the fallback
/// is an empty value, which a client must ignore as malformed (D11 §3, §4; RFC 9651 §4.2).
///
/// The serializer's buffer becomes the value's without a copy (`HeaderValue::from_str` would
/// copy it into a new allocation).
pub(super) fn header_value(serialized: String) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(serialized.into_bytes()))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}
