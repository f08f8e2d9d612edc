//! The nesting depth of a rule file, measured before the YAML reader sees it.
//!
//! serde_norway refuses a document nested deeper than [`MAX_DEPTH`] maps and lists, but only
//! after libyaml has read the whole document into events, and libyaml's scanner spends time
//! proportional to the *flow* nesting depth (`[`, `{`) on every token it reads: a one-megabyte
//! file of flow maps and lists nested thousands deep took a minute to be refused, holding up
//! reloads and shutdown meanwhile. Block nesting costs libyaml nothing extra.
//!
//! So every file is first streamed through saphyr-parser, a YAML parser that yields events
//! lazily and keeps its own flow depth below 256, and the stream is abandoned at the first
//! collection deeper than [`MAX_DEPTH`], or at saphyr's own depth limit, whichever comes first:
//! the time spent is proportional to the text read up to there. A file within the limit then
//! costs libyaml at most [`MAX_DEPTH`] steps per token. Writing our own scanner for this was
//! rejected: telling a flow `[` from one inside a plain or block scalar is most of a YAML
//! scanner.
//!
//! Only the depth is taken from saphyr-parser. Where it finds a syntax error before the limit
//! (it reads YAML 1.2, libyaml 1.1, and the two differ in corners), the check passes and
//! libyaml's reading, with its own message, decides, as for every other file.

use saphyr_parser::{Event, Parser};

/// The deepest nesting of maps and lists a rule file may have, the document's own map
/// included: serde_norway's recursion limit, so no file it reads is refused here. A rule file
/// nests `descriptors` lists and their maps, two levels per descriptor level, so this allows 63
/// descriptor levels with their `rate_limit` maps.
pub(crate) const MAX_DEPTH: usize = 128;

/// Where a file first nests deeper than [`MAX_DEPTH`]: line and column, both from 1, of the
/// collection that does (or of the point where saphyr-parser's own flow depth limit stopped
/// it). `None` when the file is within the limit, or when saphyr-parser reports a syntax error
/// first.
pub(crate) fn too_deep(text: &str) -> Option<(usize, usize)> {
    let mut parser = Parser::new_from_str(text);
    let mut depth = 0_usize;
    while let Some(event) = parser.next_event() {
        match event {
            Ok((Event::SequenceStart(..) | Event::MappingStart(..), span)) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some((span.start.line(), span.start.col() + 1));
                }
            }
            Ok((Event::SequenceEnd | Event::MappingEnd, _)) => depth = depth.saturating_sub(1),
            Ok(_) => {}
            // saphyr-parser's flow level is a `u8`: deeper than 255 `[` and `{` it stops with
            // this message, which is past MAX_DEPTH however the collections are written.
            Err(error) if error.info() == "recursion limit exceeded" => {
                let mark = error.marker();
                return Some((mark.line(), mark.col() + 1));
            }
            Err(_) => return None,
        }
    }
    None
}
