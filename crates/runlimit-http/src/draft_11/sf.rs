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
    const fn as_byte(self) -> u8 {
        match self {
            Self::Quota => b'q',
            Self::Window => b'w',
            Self::Remaining => b'r',
            Self::EffectiveWindow => b't',
        }
    }
}

/// The serializer's output buffer: on the stack up to 128 bytes (two typical items), on the heap
/// beyond. A field value is then copied once into an allocation of its exact length, the
/// value's own (see [`header_value`]).
pub(super) type Buffer = smallvec::SmallVec<[u8; 128]>;

/// Writes one list member: `"name";k1=v1;k2=v2`.
///
/// `name` must already satisfy RFC 9651 §3.3.3 (only %x20–%x7E), which
/// [`PolicyName::new`](super::PolicyName::new) guarantees. `"` and `\` are escaped with a
/// preceding `\` (§4.1.6); nothing else is.
pub(super) fn write_item(out: &mut Buffer, name: &str, parameters: [(Key, SfInteger); 2]) {
    let name = name.as_bytes();
    out.push(b'"');
    if name.iter().any(|byte| matches!(byte, b'"' | b'\\')) {
        for &byte in name {
            if matches!(byte, b'"' | b'\\') {
                out.push(b'\\');
            }
            out.push(byte);
        }
    } else {
        // The common case, copied whole.
        out.extend_from_slice(name);
    }
    out.push(b'"');
    for (key, value) in parameters {
        out.extend_from_slice(&[b';', key.as_byte(), b'=']);
        out.extend_from_slice(itoa::Buffer::new().format(value.get()).as_bytes());
    }
}

/// Serializes a list of members, `None` for an empty list (RFC 9651 §4.1: an empty List is
/// not serialized; D11 §3 and §4 require non-empty fields).
pub(super) fn list<'a, T: 'a>(
    members: impl IntoIterator<Item = &'a T>,
    mut write: impl FnMut(&mut Buffer, &T),
) -> Option<HeaderValue> {
    let mut out = Buffer::new();
    for (index, member) in members.into_iter().enumerate() {
        if index > 0 {
            // RFC 9651 §4.1.1: "," followed by a single SP.
            out.extend_from_slice(b", ");
        }
        write(&mut out, member);
    }
    if out.is_empty() {
        return None;
    }
    Some(header_value(&out))
}

/// Converts serializer output into a header value: one allocation, of the value's exact
/// length (`HeaderValue::from_bytes` copies into a `Bytes` of that length).
///
/// The serializer writes only bytes in %x20–%x7E (a validated name, `"`, `\`, `;`, `=`, `,`,
/// SP and ASCII digits), every one of which [`HeaderValue`] accepts (RFC 9110 §5.5
/// field-vchar and SP), so the conversion cannot fail; the proptests check it for arbitrary
/// valid inputs. Rather than panic in a response path should that ever change, the fallback
/// is an empty value, which a client must ignore as malformed (D11 §3, §4; RFC 9651 §4.2).
pub(super) fn header_value(serialized: &[u8]) -> HeaderValue {
    HeaderValue::from_bytes(serialized).unwrap_or_else(|_| HeaderValue::from_static(""))
}
