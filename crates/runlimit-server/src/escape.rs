//! Control and bidirectional formatting characters of rule-file text escaped where the text is
//! shown: in problems, in the rules' descriptions, in `/rlconfig`.
//!
//! A key or value of a rule file may hold any character, a line feed or a terminal escape
//! (`ESC`, `\u{1b}`) included (YAML's double-quoted `"\n"`, `"\e"`). Echoed raw, one problem
//! would span several lines (and be read as several by whoever reads a line per problem) or
//! drive the terminal that shows it; a bidirectional formatting character (`"\u202E"`) would
//! reorder the characters after it on screen, so that a key reads as another (the "Trojan
//! Source" trick, CVE-2021-42574). Each control character (`char::is_control`: U+0000 to
//! U+001F and U+007F to U+009F) and each bidirectional formatting character (U+061C, U+200E,
//! U+200F, U+202A to U+202E, U+2066 to U+2069: Unicode Standard Annex #9, section 2) is written
//! as `char::escape_debug` writes it: `\n`, `\r`, `\t`, `\0`, and `\u{1b}` or `\u{202e}` for
//! the others. Every other character is written as is, backslashes and quotes included, so
//! escaping text twice changes nothing more.

use std::{
    borrow::Cow,
    fmt::{self, Write as _},
};

/// `text` for display: itself when it holds no control or bidirectional formatting character,
/// else a copy with each one escaped (see the module's documentation).
pub(crate) fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.contains(escaped) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    // Writing to a String does not fail.
    let _ = EscapeControls(&mut escaped).write_str(text);
    Cow::Owned(escaped)
}

/// [`escape_controls`] of an owned line: the line itself when it needs no escaping.
pub(crate) fn escape_line(line: String) -> String {
    match escape_controls(&line) {
        Cow::Borrowed(_) => line,
        Cow::Owned(escaped) => escaped,
    }
}

/// Displays a `&str` with its control and bidirectional formatting characters escaped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Escaped<'a>(pub(crate) &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        EscapeControls(f).write_str(self.0)
    }
}

/// Whether `character` is written escaped: a control or bidirectional formatting character
/// (see the module's documentation).
fn escaped(character: char) -> bool {
    character.is_control()
        || matches!(character, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A writer that escapes the control and bidirectional formatting characters of everything
/// written through it to `W`.
#[derive(Debug)]
pub(crate) struct EscapeControls<W>(pub(crate) W);

impl<W: fmt::Write> fmt::Write for EscapeControls<W> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut start = 0;
        for (at, control) in text.char_indices().filter(|&(_, character)| escaped(character)) {
            self.0.write_str(text.get(start..at).unwrap_or_default())?;
            write!(self.0, "{}", control.escape_debug())?;
            start = at + control.len_utf8();
        }
        self.0.write_str(text.get(start..).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::{Escaped, escape_controls};

    #[test]
    fn control_characters_are_escaped_and_nothing_else() {
        assert_eq!(
            escape_controls("k\n\u{1b}[31m\t\r\0\u{7f}\u{85}"),
            "k\\n\\u{1b}[31m\\t\\r\\0\\u{7f}\\u{85}"
        );
        assert_eq!(escape_controls("a \"b\" \\ é ✓"), "a \"b\" \\ é ✓");
        assert_eq!(Escaped("x\ny").to_string(), "x\\ny");
        // Escaped text holds no control character: a second pass leaves it as it is.
        assert_eq!(escape_controls("x\\ny\\u{1b}"), "x\\ny\\u{1b}");
    }

    #[test]
    fn bidirectional_formatting_characters_are_escaped() {
        assert_eq!(
            escape_controls(
                "user\u{202e}nimda\u{202c} \u{061c}\u{200e}\u{200f}\u{202a}\u{202b}\u{202d}\u{2066}\u{2067}\u{2068}\u{2069}"
            ),
            "user\\u{202e}nimda\\u{202c} \\u{61c}\\u{200e}\\u{200f}\\u{202a}\\u{202b}\\u{202d}\\u{2066}\\u{2067}\\u{2068}\\u{2069}"
        );
        assert_eq!(Escaped("a\u{2067}b").to_string(), "a\\u{2067}b");
        // Neighbours of the ranges, and other format characters, are written as they are.
        assert_eq!(
            escape_controls("\u{2029}\u{202f}\u{2065}\u{206a}\u{200d}"),
            "\u{2029}\u{202f}\u{2065}\u{206a}\u{200d}"
        );
    }
}
