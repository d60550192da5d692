//! Tokens of the label selector grammar, split as apimachinery's lexer does.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Token<'a> {
    End,
    /// Any run of other characters; `in` and `notin` are only keywords
    /// where an operator is expected, so `in in (in)` is valid.
    Ident(&'a str),
    Comma,
    Open,
    Close,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
}

impl Token<'_> {
    pub(super) fn literal(&self) -> &str {
        match self {
            Token::End => "",
            Token::Ident(s) => s,
            Token::Comma => ",",
            Token::Open => "(",
            Token::Close => ")",
            Token::Bang => "!",
            Token::Equals => "=",
            Token::DoubleEquals => "==",
            Token::NotEquals => "!=",
            Token::Greater => ">",
            Token::Less => "<",
        }
    }
}

fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Splits like apimachinery's lexer, except that NUL is an ordinary character
/// (Go stops at it, silently ignoring the rest of the selector).
pub(super) fn tokenize(s: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(is_whitespace);
        let Some(first) = rest.chars().next() else {
            tokens.push(Token::End);
            return tokens;
        };
        let followed_by_eq = rest.as_bytes().get(1) == Some(&b'=');
        let (token, len) = match first {
            '!' if followed_by_eq => (Token::NotEquals, 2),
            '=' if followed_by_eq => (Token::DoubleEquals, 2),
            '!' => (Token::Bang, 1),
            '=' => (Token::Equals, 1),
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            ',' => (Token::Comma, 1),
            '>' => (Token::Greater, 1),
            '<' => (Token::Less, 1),
            _ => {
                let end = rest
                    .find(|c| is_whitespace(c) || is_special(c))
                    .unwrap_or(rest.len());
                (Token::Ident(&rest[..end]), end)
            }
        };
        tokens.push(token);
        rest = &rest[len..];
    }
}
