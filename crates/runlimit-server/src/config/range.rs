//! Integers beyond 64 bits, named for what they are.
//!
//! serde_norway reads a rule file into a `serde_norway::Value` first (for the shape checks and
//! the merge keys), and a `Value` holds integers of 64 bits at most: a larger one, such as
//! `requests_per_unit: 18446744073709551616`, fails that first reading with serde's generic
//! ``invalid type: integer `18446744073709551616` as u128, expected any YAML value``, which
//! says neither that the number is too large nor what the field allows. When that reading
//! fails at a known place, the file is read once more by [`Probe`], which accepts everything but
//! such an integer and names its key's range; its message replaces serde_norway's when it stops
//! there too. A file that reads is never read a second time.

use std::{cell::Cell, fmt};

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IgnoredAny, MapAccess, SeqAccess, VariantAccess,
};

/// The message for `error`, serde_norway's failure to read `text` as a `Value`, when it failed
/// at an integer beyond 64 bits: ``integer `N` is out of range for requests_per_unit: from 0 to
/// 4294967295 at line L column C`` (with the document path before it, as serde_norway writes
/// its messages). `None` when it failed for another reason.
pub(crate) fn integer_out_of_range(text: &str, error: &serde_norway::Error) -> Option<String> {
    let at = error.location()?;
    let found = Cell::new(false);
    let probe = Probe { key: None, found: &found };
    let probed = probe.deserialize(serde_norway::Deserializer::from_str(text)).err()?;
    let same_place = probed.location().is_some_and(|there| there.index() == at.index());
    (found.get() && same_place).then(|| probed.to_string())
}

/// Reads any YAML, keeping nothing, and fails at the first integer beyond 64 bits with a
/// message naming its key (`key`: the key of the map entry being read, when it is a string).
/// Sets `found` when it fails so.
#[derive(Clone, Copy)]
struct Probe<'a> {
    key: Option<&'a str>,
    found: &'a Cell<bool>,
}

impl Probe<'_> {
    fn out_of_range<E: de::Error>(self, integer: &dyn fmt::Display) -> E {
        self.found.set(true);
        let (u32_max, burst_max) = (u32::MAX, runlimit_core::MAX_LIMIT);
        match self.key {
            Some("requests_per_unit") => E::custom(format_args!(
                "integer `{integer}` is out of range for requests_per_unit: from 0 to {u32_max}"
            )),
            // A burst of 0 is refused too, by the policy.
            Some("burst") => E::custom(format_args!(
                "integer `{integer}` is out of range for burst: from 1 to {burst_max}"
            )),
            _ => E::custom(format_args!(
                "integer `{integer}` is beyond the 64-bit integers a rule file may hold; quote it if it is \
                 text"
            )),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for Probe<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_i128<E: de::Error>(self, integer: i128) -> Result<(), E> {
        Err(self.out_of_range(&integer))
    }

    fn visit_u128<E: de::Error>(self, integer: u128) -> Result<(), E> {
        Err(self.out_of_range(&integer))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<(), A::Error> {
        // A list item is no field: its integers get the general message.
        let item = Probe { key: None, ..self };
        while items.next_element_seed(item)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<(), A::Error> {
        while let Some(key) = entries.next_key_seed(KeyProbe(self.found))? {
            entries.next_value_seed(Probe { key: key.as_deref(), ..self })?;
        }
        Ok(())
    }

    fn visit_enum<A: EnumAccess<'de>>(self, tagged: A) -> Result<(), A::Error> {
        // A tagged value (`!tag value`): the tag, then the value.
        let (IgnoredAny, value) = tagged.variant::<IgnoredAny>()?;
        value.newtype_variant_seed(self)
    }
}

/// A map key: its text when it is a string, `None` otherwise (after probing it as any value).
struct KeyProbe<'a>(&'a Cell<bool>);

impl<'de> DeserializeSeed<'de> for KeyProbe<'_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<String>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for KeyProbe<'_> {
    type Value = Option<String>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any YAML value")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Option<String>, E> {
        Ok(Some(key.to_owned()))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_i128<E: de::Error>(self, integer: i128) -> Result<Option<String>, E> {
        Err(Probe { key: None, found: self.0 }.out_of_range(&integer))
    }

    fn visit_u128<E: de::Error>(self, integer: u128) -> Result<Option<String>, E> {
        Err(Probe { key: None, found: self.0 }.out_of_range(&integer))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<String>, D::Error> {
        Probe { key: None, found: self.0 }.deserialize(deserializer).map(|()| None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, items: A) -> Result<Option<String>, A::Error> {
        Probe { key: None, found: self.0 }.visit_seq(items).map(|()| None)
    }

    fn visit_map<A: MapAccess<'de>>(self, entries: A) -> Result<Option<String>, A::Error> {
        Probe { key: None, found: self.0 }.visit_map(entries).map(|()| None)
    }

    fn visit_enum<A: EnumAccess<'de>>(self, tagged: A) -> Result<Option<String>, A::Error> {
        Probe { key: None, found: self.0 }.visit_enum(tagged).map(|()| None)
    }
}
