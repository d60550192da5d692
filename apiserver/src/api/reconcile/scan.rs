//! A validating JSON scanner: it walks a request body once, checking the
//! syntax as strictly as serde_json does (RFC 8259, UTF-8 in strings, no
//! control characters, valid escapes, the number grammar), and hands the
//! decoder byte ranges instead of building values. The decoder reads the
//! few fields kplug needs through it and lets it skip everything else, so
//! the body is read exactly once however large the object inside it is.
//!
//! Nesting has no depth limit, as with serde_json's `RawValue` before: the
//! scanner keeps its own stack instead of recursing, bounded by the body.

use std::ops::Range;

/// What is wrong with a body; the wording is serde_json's, so answers
/// read as they did when serde_json decoded the whole body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    #[error("EOF while parsing a value")]
    EofValue,
    #[error("EOF while parsing a string")]
    EofString,
    #[error("EOF while parsing an object")]
    EofObject,
    #[error("EOF while parsing a list")]
    EofList,
    #[error("expected `:`")]
    ExpectedColon,
    #[error("expected `,` or `]`")]
    ExpectedListCommaOrEnd,
    #[error("expected `,` or `}}`")]
    ExpectedObjectCommaOrEnd,
    #[error("expected ident")]
    ExpectedIdent,
    #[error("expected value")]
    ExpectedValue,
    #[error("invalid escape")]
    InvalidEscape,
    #[error("invalid number")]
    InvalidNumber,
    #[error("invalid unicode code point")]
    InvalidUnicode,
    #[error("control character (\\u0000-\\u001F) found while parsing a string")]
    ControlCharacter,
    #[error("key must be a string")]
    KeyMustBeString,
    #[error("trailing characters")]
    TrailingCharacters,
    #[error("trailing comma")]
    TrailingComma,
    #[error("duplicate field `{0}`")]
    DuplicateField(&'static str),
    #[error("missing field `{0}`")]
    MissingField(&'static str),
    #[error("invalid type: {found}, expected {expected}")]
    InvalidType {
        found: &'static str,
        expected: &'static str,
    },
    /// serde_json's own message for a field decoded into a typed value.
    #[error("{0}")]
    Field(String),
}

/// A [`Reason`] and where in the body it was found (1-based, as serde_json
/// counts: the column of the offending byte).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason} at line {line} column {column}")]
pub struct SyntaxError {
    pub reason: Reason,
    pub line: usize,
    pub column: usize,
}

/// How serde_json read a string, which decides where it reports a control
/// character: past it when decoding, at it when skipping.
#[derive(Clone, Copy, Debug)]
enum Strings {
    Decoded,
    Skipped,
}

/// A key of an object, as its bytes between the quotes.
#[derive(Clone, Copy, Debug)]
pub struct Key<'a> {
    /// The content between the quotes, still escaped if `escaped`.
    pub raw: &'a [u8],
    /// Offset of the opening quote.
    pub start: usize,
    pub escaped: bool,
}

pub struct Scanner<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Open containers while skipping a value (true: object), kept between
    /// calls so that skipping allocates once per body.
    stack: Vec<bool>,
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Marks (with its high bit) each of the 8 bytes of `word` that ends or
/// escapes a string, is a control character or starts a multi-byte UTF-8
/// sequence, checking a word at a time. Bytes above the first marked one
/// may be marked wrongly, but the lowest mark is always exact, so
/// `trailing_zeros() / 8` is the first byte that needs a closer look.
fn special(word: u64) -> u64 {
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let quote = has_zero(word ^ (ONES * u64::from(b'"')));
    let backslash = has_zero(word ^ (ONES * u64::from(b'\\')));
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    quote | backslash | control | (word & HIGHS)
}

impl<'a> Scanner<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            pos: 0,
            stack: Vec::new(),
        }
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// An error at byte `offset`: serde_json reports it once it has read
    /// that byte (or at the end of the input).
    pub fn error_at(&self, reason: Reason, offset: usize) -> SyntaxError {
        self.error_after(reason, (offset + 1).min(self.bytes.len()))
    }

    /// An error found once serde_json had read `index` bytes: its column is
    /// the number read on that line (0 just after a newline).
    pub fn error_after(&self, reason: Reason, index: usize) -> SyntaxError {
        let before = &self.bytes[..index.min(self.bytes.len())];
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        SyntaxError {
            reason,
            line: 1 + before.iter().filter(|&&b| b == b'\n').count(),
            column: before.len() - line_start,
        }
    }

    /// An error at the byte about to be read.
    pub fn error(&self, reason: Reason) -> SyntaxError {
        self.error_at(reason, self.pos)
    }

    /// Skips whitespace; returns the next byte without consuming it.
    pub fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.pos) {
            match b {
                b' ' | b'\n' | b'\t' | b'\r' => self.pos += 1,
                _ => return Some(b),
            }
        }
        None
    }

    /// Consumes one byte already seen with [`Scanner::peek`].
    pub fn bump(&mut self) {
        self.pos += 1;
    }

    /// After the whole value: only whitespace may follow.
    pub fn end(&mut self) -> Result<(), SyntaxError> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(self.error(Reason::TrailingCharacters)),
        }
    }

    /// The next key of an object kplug passes on (serde_json skipped it),
    /// with its `:`, or `None` at the closing `}`. `first` tracks whether a
    /// comma is due.
    pub fn next_key(&mut self, first: &mut bool) -> Result<Option<Key<'a>>, SyntaxError> {
        let key = self.key(first, Strings::Skipped)?;
        if key.is_some() {
            self.colon()?;
        }
        Ok(key)
    }

    /// The next field name of a struct kplug decodes (serde_json decoded
    /// it), without the `:`: serde_json refuses a repeated field before it
    /// looks for the colon.
    pub fn next_field(&mut self, first: &mut bool) -> Result<Option<Key<'a>>, SyntaxError> {
        self.key(first, Strings::Decoded)
    }

    fn key(&mut self, first: &mut bool, strings: Strings) -> Result<Option<Key<'a>>, SyntaxError> {
        match self.peek() {
            Some(b'}') => {
                self.pos += 1;
                return Ok(None);
            }
            Some(b',') if !*first => {
                self.pos += 1;
                // Decoding a struct, serde_json names a trailing comma; skipping
                // an object, it only finds no key.
                match (self.peek(), strings) {
                    (Some(b'"'), _) => {}
                    (Some(b'}'), Strings::Decoded) => {
                        return Err(self.error(Reason::TrailingComma));
                    }
                    (Some(_), _) => return Err(self.error(Reason::KeyMustBeString)),
                    (None, Strings::Decoded) => return Err(self.error(Reason::EofValue)),
                    (None, Strings::Skipped) => return Err(self.error(Reason::EofObject)),
                }
            }
            Some(b'"') if *first => {}
            Some(_) if *first => return Err(self.error(Reason::KeyMustBeString)),
            Some(_) => return Err(self.error(Reason::ExpectedObjectCommaOrEnd)),
            None => return Err(self.error(Reason::EofObject)),
        }
        *first = false;
        let start = self.pos;
        let escaped = self.string(strings)?;
        Ok(Some(Key {
            raw: &self.bytes[start + 1..self.pos - 1],
            start,
            escaped,
        }))
    }

    /// The `:` after a key.
    pub fn colon(&mut self) -> Result<(), SyntaxError> {
        match self.peek() {
            Some(b':') => {
                self.pos += 1;
                Ok(())
            }
            Some(_) => Err(self.error(Reason::ExpectedColon)),
            None => Err(self.error(Reason::EofObject)),
        }
    }

    /// The elements of an array whose `[` is consumed: true while another
    /// element follows (positioned at it), false after the closing `]`.
    pub fn next_element(&mut self, first: &mut bool) -> Result<bool, SyntaxError> {
        match self.peek() {
            Some(b']') => {
                self.pos += 1;
                Ok(false)
            }
            Some(b',') if !*first => {
                self.pos += 1;
                match self.peek() {
                    Some(b']') => Err(self.error(Reason::TrailingComma)),
                    Some(_) => Ok(true),
                    None => Err(self.error(Reason::EofValue)),
                }
            }
            Some(_) if *first => {
                *first = false;
                Ok(true)
            }
            Some(_) => Err(self.error(Reason::ExpectedListCommaOrEnd)),
            None => Err(self.error(Reason::EofList)),
        }
    }

    /// Skips one value, checking it; returns where it lies (without the
    /// whitespace around it).
    pub fn skip_value(&mut self) -> Result<Range<usize>, SyntaxError> {
        if self.peek().is_none() {
            return Err(self.error(Reason::EofValue));
        }
        let start = self.pos;
        self.stack.clear();
        loop {
            // At the first byte of a value (whitespace skipped).
            self.peek();
            match self.bytes.get(self.pos) {
                Some(b'{') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'}') => self.pos += 1,
                        Some(b'"') => {
                            self.stack.push(true);
                            self.string(Strings::Skipped)?;
                            self.colon()?;
                            self.value_start()?;
                            continue;
                        }
                        Some(_) => return Err(self.error(Reason::KeyMustBeString)),
                        None => return Err(self.error(Reason::EofObject)),
                    }
                }
                Some(b'[') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b']') => self.pos += 1,
                        Some(_) => {
                            self.stack.push(false);
                            continue;
                        }
                        None => return Err(self.error(Reason::EofList)),
                    }
                }
                Some(b'"') => {
                    self.string(Strings::Skipped)?;
                }
                Some(b'-' | b'0'..=b'9') => self.number()?,
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(_) => return Err(self.error(Reason::ExpectedValue)),
                None => return Err(self.error(Reason::EofValue)),
            }
            // After a value: close containers until one has a next element.
            loop {
                let Some(&object) = self.stack.last() else {
                    return Ok(start..self.pos);
                };
                match (self.peek(), object) {
                    // A trailing comma reads as a missing key or value, as
                    // in serde_json's skipping.
                    (Some(b','), true) => {
                        self.pos += 1;
                        match self.peek() {
                            Some(b'"') => {
                                self.string(Strings::Skipped)?;
                                self.colon()?;
                                self.value_start()?;
                                break;
                            }
                            Some(_) => return Err(self.error(Reason::KeyMustBeString)),
                            None => return Err(self.error(Reason::EofObject)),
                        }
                    }
                    (Some(b','), false) => {
                        self.pos += 1;
                        break;
                    }
                    (Some(b'}'), true) | (Some(b']'), false) => {
                        self.pos += 1;
                        self.stack.pop();
                    }
                    (Some(_), true) => return Err(self.error(Reason::ExpectedObjectCommaOrEnd)),
                    (Some(_), false) => return Err(self.error(Reason::ExpectedListCommaOrEnd)),
                    (None, true) => return Err(self.error(Reason::EofObject)),
                    (None, false) => return Err(self.error(Reason::EofList)),
                }
            }
        }
    }

    /// Skips whitespace before a value that must follow.
    fn value_start(&mut self) -> Result<(), SyntaxError> {
        match self.peek() {
            Some(_) => Ok(()),
            None => Err(self.error(Reason::EofValue)),
        }
    }

    /// A string at its opening quote; returns whether it holds escapes.
    fn string(&mut self, strings: Strings) -> Result<bool, SyntaxError> {
        let bytes = self.bytes;
        let mut i = self.pos + 1;
        let mut escaped = false;
        loop {
            // Jump to the next byte that matters, a word at a time; the last
            // few bytes of the body go one by one.
            while let Some(chunk) = bytes.get(i..i + 8) {
                let Ok(word) = <[u8; 8]>::try_from(chunk) else {
                    break;
                };
                let marks = special(u64::from_le_bytes(word));
                if marks != 0 {
                    i += (marks.trailing_zeros() / 8) as usize;
                    break;
                }
                i += 8;
            }
            match bytes.get(i) {
                Some(b'"') => {
                    self.pos = i + 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    i = self.escape(i)?;
                }
                Some(0..=0x1F) => {
                    return Err(match strings {
                        Strings::Decoded => self.error_after(Reason::ControlCharacter, i + 1),
                        Strings::Skipped => self.error_after(Reason::ControlCharacter, i),
                    });
                }
                Some(&lead @ 0x80..) => i = self.utf8(i, lead)?,
                Some(_) => i += 1,
                None => return Err(self.error_at(Reason::EofString, bytes.len())),
            }
        }
    }

    /// An escape at its backslash; returns the offset after it. Like
    /// serde_json when it skips a string, a `\u` escape only needs four hex
    /// digits here: whether it is a valid code point matters to a decoder.
    fn escape(&self, i: usize) -> Result<usize, SyntaxError> {
        match self.bytes.get(i + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 2),
            // serde_json takes the four bytes, then judges them: a bad one
            // is reported at the fourth, and fewer than four are an EOF.
            Some(b'u') => match self.bytes.get(i + 2..i + 6) {
                Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => Ok(i + 6),
                Some(_) => Err(self.error_after(Reason::InvalidEscape, i + 6)),
                None => Err(self.error_at(Reason::EofString, self.bytes.len())),
            },
            // Reported once the byte after the backslash is read.
            Some(_) => Err(self.error_after(Reason::InvalidEscape, i + 2)),
            None => Err(self.error_at(Reason::EofString, self.bytes.len())),
        }
    }

    /// A multi-byte UTF-8 sequence starting with `lead` at `i`; returns the
    /// offset after it.
    fn utf8(&self, i: usize, lead: u8) -> Result<usize, SyntaxError> {
        let width = match lead {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return Err(self.error_at(Reason::InvalidUnicode, i)),
        };
        match self.bytes.get(i..i + width) {
            Some(sequence) if std::str::from_utf8(sequence).is_ok() => Ok(i + width),
            Some(_) => Err(self.error_at(Reason::InvalidUnicode, i)),
            None => Err(self.error_at(Reason::EofString, self.bytes.len())),
        }
    }

    /// A number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`,
    /// of any size (it is only ever passed on, never converted).
    fn number(&mut self) -> Result<(), SyntaxError> {
        let digits = |s: &mut Self| {
            let from = s.pos;
            while s.bytes.get(s.pos).is_some_and(u8::is_ascii_digit) {
                s.pos += 1;
            }
            s.pos > from
        };
        // serde_json says "invalid number" for a missing digit, even at the end.
        let required = |s: &mut Self| -> Result<(), SyntaxError> {
            if digits(s) {
                Ok(())
            } else {
                Err(s.error(Reason::InvalidNumber))
            }
        };
        if self.bytes.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        match self.bytes.get(self.pos) {
            Some(b'0') => {
                self.pos += 1;
                if self.bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                    return Err(self.error(Reason::InvalidNumber));
                }
            }
            _ => required(self)?,
        }
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            required(self)?;
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.pos) {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.bytes.get(self.pos) {
                self.pos += 1;
            }
            required(self)?;
        }
        Ok(())
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), SyntaxError> {
        for &expected in word {
            match self.bytes.get(self.pos) {
                Some(&b) if b == expected => self.pos += 1,
                // Reported once the wrong byte is read.
                Some(_) => return Err(self.error(Reason::ExpectedIdent)),
                None => return Err(self.error(Reason::EofValue)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "scan_tests.rs"]
mod tests;
