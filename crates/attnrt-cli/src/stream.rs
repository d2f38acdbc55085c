//! The text of one generated row as it grows: what can be printed now (incremental
//! detokenization) and where a stop string ends it.
//!
//! Each step, the row's tokens are decoded whole and given to [`RowText::feed`], which returns
//! the new text that is safe to print: not a trailing `U+FFFD` (a multi-byte character whose
//! remaining bytes are in tokens not made yet), and not a tail that could still become a stop
//! string. When a stop string appears, the row's text ends just before it.

/// One row's text (see the module docs).
#[derive(Debug, Default)]
pub struct RowText {
    stops: Vec<String>,
    /// Bytes of the decoded text given out so far.
    printed: usize,
    /// Where the first stop string starts, once one has appeared.
    stopped_at: Option<usize>,
}

impl RowText {
    /// A row ended by any of `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> RowText {
        RowText {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..RowText::default()
        }
    }

    /// Given the row's whole decoded text so far, the part that can be printed now, and
    /// whether a stop string has ended the row.
    pub fn feed(&mut self, full: &str) -> (String, bool) {
        if self.stopped_at.is_some() {
            return (String::new(), true);
        }
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| full.find(s.as_str()))
            .min()
        {
            self.stopped_at = Some(at);
            return (self.take(full, at), true);
        }
        let settled = full.trim_end_matches('\u{FFFD}').len();
        let end = settled - self.stop_prefix_len(&full[..settled]);
        (self.take(full, end), false)
    }

    /// The row's final text: cut before its stop string, if one appeared.
    pub fn text<'a>(&self, full: &'a str) -> &'a str {
        &full[..self.stopped_at.unwrap_or(full.len()).min(full.len())]
    }

    /// What is left to print of the final text once the row has ended.
    pub fn rest(&mut self, full: &str) -> String {
        let end = self.text(full).len();
        self.take(full, end)
    }

    /// `full[printed..end]`, moving `printed` to `end`; nothing when the text before `printed`
    /// changed (a decoder may rewrite spacing) or `end` is not past it.
    fn take(&mut self, full: &str, end: usize) -> String {
        if end <= self.printed
            || !full.is_char_boundary(self.printed)
            || !full.is_char_boundary(end)
        {
            return String::new();
        }
        let out = full[self.printed..end].to_string();
        self.printed = end;
        out
    }

    /// The longest tail of `text` that is the start of a stop string (held back: the next
    /// tokens may complete it).
    fn stop_prefix_len(&self, text: &str) -> usize {
        self.stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .rev()
                    .filter(|&n| s.is_char_boundary(n))
                    .find(|&n| text.ends_with(&s[..n]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn text_is_given_out_once_and_incomplete_characters_wait() {
        let mut r = RowText::new(&[]);
        assert_eq!(r.feed("Hello"), ("Hello".into(), false));
        assert_eq!(r.feed("Hello wor"), (" wor".into(), false));
        // the first byte of "é" decodes to U+FFFD until its second byte's token comes
        assert_eq!(r.feed("Hello wor\u{FFFD}"), (String::new(), false));
        assert_eq!(r.feed("Hello woré!"), ("é!".into(), false));
        assert_eq!(r.rest("Hello woré!"), "");
    }

    #[test]
    fn a_stop_string_ends_the_row_before_it_and_its_start_is_held_back() {
        let mut r = RowText::new(&stops(&["\n\n", "END"]));
        assert_eq!(
            r.feed("one\n"),
            ("one".into(), false),
            "'\\n' may start '\\n\\n'"
        );
        assert_eq!(r.feed("one\ntwo E"), ("\ntwo ".into(), false));
        assert_eq!(r.feed("one\ntwo EN"), (String::new(), false));
        assert_eq!(r.feed("one\ntwo ENDx"), (String::new(), true));
        assert_eq!(r.text("one\ntwo ENDx"), "one\ntwo ");
        assert_eq!(r.feed("one\ntwo ENDxyz"), (String::new(), true));
        // a held-back start that did not become a stop string is printed at the end
        let mut r = RowText::new(&stops(&["END"]));
        assert_eq!(r.feed("and E"), ("and ".into(), false));
        assert_eq!(r.rest("and E"), "E");
    }
}
