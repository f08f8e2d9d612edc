//! YAML merge keys (`<<: *defaults`, <https://yaml.org/type/merge.html>), which
//! envoyproxy/ratelimit's YAML reader applies.
//!
//! Applied to the document's value, innermost first: a merged map's own `<<` is resolved before
//! it is merged, so chains (`b: &b {<<: *a}`, then `<<: *b`) work; a map's own keys take
//! precedence over merged ones, and earlier maps of a merged list over later ones. Written here
//! rather than with serde_norway's `Value::apply_merge`, which merges parents first and so leaves
//! a chained `<<` unresolved. `metadata`, arbitrary YAML the service ignores, is left as it is.
//!
//! A merged document is read from its value rather than from its text, and a value reads a
//! number or a boolean as what it is, where the text reader takes any plain scalar for a string:
//! so the scalars of the fields that are strings (`domain`, `key`, `value`, `unit`, `name`,
//! `algorithm`) are turned back into strings here (`value: 500` is the value `"500"` with or
//! without merges; a number written in another form, `0x1F`, reads as its decimal value).

use std::fmt::Write as _;

use serde_norway::{Mapping, Value};

use super::push_key;

/// The fields whose values are strings, wherever they appear.
const STRING_FIELDS: [&str; 6] = ["domain", "key", "value", "unit", "name", "algorithm"];

/// Whether any map of `value`, outside `metadata`, has the merge key `<<`.
pub(super) fn has_merge_key(value: &Value) -> bool {
    match value {
        Value::Mapping(mapping) => mapping.iter().any(|(key, child)| {
            key.as_str() == Some("<<") || (key.as_str() != Some("metadata") && has_merge_key(child))
        }),
        Value::Sequence(items) => items.iter().any(has_merge_key),
        Value::Tagged(tagged) => has_merge_key(&tagged.value),
        _ => false,
    }
}

/// Applies every merge key of `value` (see the module documentation). On a `<<` whose value is
/// not a map or a list of maps, returns its document path and the message.
pub(super) fn apply(value: &mut Value, path: &mut String) -> Result<(), (String, String)> {
    match value {
        Value::Mapping(mapping) => {
            if let Some(mut merged) = mapping.remove("<<") {
                let len = path.len();
                push_key(path, "<<");
                apply(&mut merged, path)?;
                let sources = match merged {
                    Value::Mapping(source) => vec![source],
                    Value::Sequence(items) => items
                        .into_iter()
                        .enumerate()
                        .map(|(index, item)| match item {
                            Value::Mapping(source) => Ok(source),
                            other => {
                                let _ = write!(path, "[{index}]");
                                Err((path.clone(), not_a_map(&other)))
                            }
                        })
                        .collect::<Result<Vec<Mapping>, _>>()?,
                    other => return Err((path.clone(), not_a_map(&other))),
                };
                path.truncate(len);
                for source in sources {
                    for (key, child) in source {
                        mapping.entry(key).or_insert(child);
                    }
                }
            }
            for (key, child) in mapping.iter_mut() {
                let Some(key) = key.as_str() else { continue };
                if key == "metadata" {
                    continue;
                }
                let len = path.len();
                push_key(path, key);
                apply(child, path)?;
                path.truncate(len);
                if STRING_FIELDS.contains(&key) {
                    match child {
                        Value::Number(number) => *child = Value::String(number.to_string()),
                        Value::Bool(flag) => *child = Value::String(flag.to_string()),
                        _ => {}
                    }
                }
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                let len = path.len();
                let _ = write!(path, "[{index}]");
                apply(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Tagged(tagged) => apply(&mut tagged.value, path),
        _ => Ok(()),
    }
}

fn not_a_map(value: &Value) -> String {
    format!("is {}; a merge key `<<` takes a map or a list of maps", super::describe_value(value))
}
